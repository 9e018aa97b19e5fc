package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/redis/go-redis/v9"
)

// runSoak drives mixed traffic through a running CubeProxy (store: redis)
// for a long while and checks that nothing accumulates: after the load
// stops and the idle timeouts pass, descriptors, sockets, goroutines and
// the open connection/stream/WebSocket gauges must come back to the
// baseline taken after a warm-up, and the live heap must not have grown
// steadily during the run. bench/soak.sh starts the processes; see
// bench/README.md.
func runSoak(args []string) error {
	fs := flag.NewFlagSet("soak", flag.ContinueOnError)
	addr := fs.String("addr", "127.0.0.1:18480", "CubeProxy traffic address")
	admin := fs.String("admin", "127.0.0.1:18490", "CubeProxy admin address (/metrics, /admin/*); loopback, no token")
	redisAddr := fs.String("redis", "127.0.0.1:16479", "Redis holding the routes (the proxy's store)")
	channel := fs.String("channel", "cube:v1:shared:cube_proxy:invalidate", "Redis invalidation channel of the proxy")
	fast := fs.Int("fast-port", 21001, "backend fasthttp port (/small, /bytes, /sse)")
	std := fs.Int("std-port", 21002, "backend net/http port (/ws, /mcp)")
	pid := fs.Int("pid", 0, "CubeProxy's PID (/proc: fds, sockets, RSS, CPU)")
	backendPID := fs.Int("backend-pid", 0, "the backend's PID (its open sockets)")
	dur := fs.Duration("d", 6*time.Minute, "duration of the soak's load")
	warm := fs.Duration("warm", 30*time.Second, "warm-up load before the baseline")
	every := fs.Duration("every", 10*time.Second, "sampling interval")
	settle := fs.Duration("settle", 60*time.Second, "longest wait, once the load stopped, for everything to come back")
	goSlack := fs.Int("goroutine-slack", 8, "goroutines allowed above the baseline at the end")
	fdSlack := fs.Int("fd-slack", 4, "descriptors (and sockets, proxy and backend) allowed above the baseline at the end")
	heapSlack := fs.Float64("heap-slack-mib", 3, "live-heap growth allowed over the run (MiB)")
	killEvery := fs.Duration("kill-every", 10*time.Second, "kill and re-create a victim sandbox this often")
	pauseEvery := fs.Duration("pause-every", 7*time.Second, "pause and resume the pausy sandbox this often")
	only := fs.String("only", "", "comma-separated actors to run (default all; names as in the final table), to chase one finding")
	pprofAddr := fs.String("pprof", "", "net/http/pprof address of the proxy (soak.sh SOAK_PPROF): the live heap is then read after a forced GC, exactly")
	accessLog := fs.String("access-log", "", "the proxy's access-log file (soak.sh SOAK_ACCESS_LOG=1): renamed to <file>.N before a SIGHUP every -hup-every, and at the end its lines (with the renamed ones) must be cubeproxy_requests_total less the dropped lines")
	hupEvery := fs.Duration("hup-every", 2*time.Minute, "with -access-log, rename the access log and SIGHUP the proxy this often")
	pprofDir := fs.String("pprof-dir", os.TempDir(), "with -pprof, save heap profiles at the baseline and at the end here (base.heap.pprof, end.heap.pprof)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *pid <= 0 || *backendPID <= 0 {
		return errors.New("soak needs -pid (CubeProxy) and -backend-pid")
	}
	rdb := redis.NewClient(&redis.Options{Addr: *redisAddr})
	defer rdb.Close()
	l := &soakLoad{
		addr: *addr, admin: *admin, fast: *fast, std: *std, hostTmpl: ".soak.test",
		rdb: rdb, channel: *channel, killEvery: *killEvery, pauseEvery: *pauseEvery,
		nonce:     strconv.FormatInt(time.Now().UnixNano()%1e9, 36),
		accessLog: *accessLog, pid: *pid, hupEvery: *hupEvery,
		adminHC:   &http.Client{Timeout: soakOpTimeout, Transport: &http.Transport{DisableKeepAlives: true, Proxy: nil}},
		mcpClient: mcp.NewClient(&mcp.Implementation{Name: "cube-soak", Version: "v1"}, nil),
	}
	if *only != "" {
		l.only = map[string]bool{}
		for _, n := range strings.Split(*only, ",") {
			l.only[strings.TrimSpace(n)] = true
		}
	}
	ctx := context.Background()
	for _, id := range append([]string{soakSandbox, soakPausy}, soakVictims...) {
		if err := l.writeRoute(ctx, id, time.Now().UnixNano()); err != nil {
			return err
		}
	}
	sm := &soakSampler{admin: *admin, pprof: *pprofAddr, pid: *pid, backendPID: *backendPID, hc: l.adminHC, t0: time.Now()}
	fmt.Printf("soak: warm-up %s, load %s, sampling every %s, settle ≤ %s\n", *warm, *dur, *every, *settle)
	printSoakHeader()

	// Warm-up, then quiet: the baseline is the idle proxy that has served
	// every kind of exchange once (lazy pools, buffers, Redis connections).
	if err := sm.loadPhase(l, "warm", *warm, *every); err != nil {
		return err
	}
	base, ok, err := sm.settle(*settle, func(p soakPoint) []string { return p.openGauges() })
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("warm-up: gauges did not come back to 0 within %s: %s", *settle, strings.Join(base.openGauges(), ", "))
	}
	// A few more seconds of quiet so that goroutines ending with the last
	// connections are gone before the baseline.
	time.Sleep(3 * time.Second)
	if base, err = sm.sample("base"); err != nil {
		return err
	}
	base.print()
	if err := sm.saveHeap(*pprofDir, "base.heap.pprof"); err != nil {
		return err
	}

	if err := sm.loadPhase(l, "load", *dur, *every); err != nil {
		return err
	}
	final, _, err := sm.settle(*settle, func(p soakPoint) []string {
		return p.drift(base, *goSlack, *fdSlack)
	})
	if err != nil {
		return err
	}

	if err := sm.saveHeap(*pprofDir, "end.heap.pprof"); err != nil {
		return err
	}
	var reasons []string
	reasons = append(reasons, final.drift(base, *goSlack, *fdSlack)...)
	trend := heapTrend(sm.points, "load")
	if trend.growMiB > *heapSlack && trend.lastMiB-trend.firstMiB > *heapSlack/2 {
		reasons = append(reasons, fmt.Sprintf("live heap grew steadily: %.1f MiB/min (%.1f → %.1f MiB)", trend.slopeMiBMin, trend.firstMiB, trend.lastMiB))
	}
	if *accessLog != "" {
		why, err := sm.waitLogLines(*accessLog, 10*time.Second)
		if err != nil {
			return err
		}
		if why != "" {
			reasons = append(reasons, why)
		}
	}
	reasons = append(reasons, l.report(os.Stdout)...)
	fmt.Printf("\nbaseline → end: fds %d → %d, sockets %d → %d, goroutines %d → %d, backend sockets %d → %d, RSS %.1f → %.1f MiB\n",
		base.fds, final.fds, base.sockets, final.sockets, base.goroutines, final.goroutines,
		base.backendSockets, final.backendSockets, float64(base.rssKiB)/1024, float64(final.rssKiB)/1024)
	fmt.Printf("live heap during load (%s): first quarter %.1f MiB, last quarter %.1f MiB, slope %+.2f MiB/min; peak RSS %.1f MiB\n",
		trend.source, trend.firstMiB, trend.lastMiB, trend.slopeMiBMin, float64(sm.peakRSS)/1024)
	if sm.pprof != "" {
		fmt.Printf("live heap objects (after GC): baseline %d, end %d\n", base.heapObjects, final.heapObjects)
	}
	fmt.Printf("kills %d, pauses %d, cold ids %d, unknown ids %d, access-log rotations %d; streams ended by kills %.0f; upstream retries %.0f\n",
		l.kills.Load(), l.pauses.Load(), l.coldSeq.Load(), l.unkSeq.Load(), l.rotations.Load(), final.killedEnds, final.retries)
	if len(reasons) > 0 {
		fmt.Printf("\nFAIL: %s\n", strings.Join(reasons, "; "))
		return errors.New("soak failed")
	}
	fmt.Printf("\nPASS: every gauge back to 0, goroutines within %d, descriptors and sockets within %d of the baseline, no steady heap growth\n", *goSlack, *fdSlack)
	return nil
}

// soakPoint is one sample of the proxy (and the backend's sockets).
type soakPoint struct {
	at                 time.Duration
	phase              string
	fds, sockets       int
	goroutines         int
	rssKiB             int64
	heapInuse, nextGC  float64
	conns, streams, ws float64
	pools, idle        float64
	backendSockets     int
	cpuPct             float64
	killedEnds         float64
	retries            float64
	metricFDs          float64
	liveExact          float64 // HeapAlloc after a forced GC (-pprof), else 0
	heapObjects        int64
}

// openGauges lists the gauges that are not back to zero.
func (p soakPoint) openGauges() []string {
	var out []string
	for _, g := range []struct {
		name string
		v    float64
	}{{"connections_open", p.conns}, {"streams_open", p.streams}, {"websockets_open", p.ws},
		{"upstream_idle_connections", p.idle}, {"upstream_pools", p.pools}} {
		if g.v != 0 {
			out = append(out, fmt.Sprintf("%s %.0f", g.name, g.v))
		}
	}
	return out
}

// drift lists what is not back to the baseline.
func (p soakPoint) drift(base soakPoint, goSlack, fdSlack int) []string {
	out := p.openGauges()
	if p.goroutines > base.goroutines+goSlack {
		out = append(out, fmt.Sprintf("goroutines %d (baseline %d)", p.goroutines, base.goroutines))
	}
	if p.fds > base.fds+fdSlack {
		out = append(out, fmt.Sprintf("fds %d (baseline %d)", p.fds, base.fds))
	}
	if p.sockets > base.sockets+fdSlack {
		out = append(out, fmt.Sprintf("sockets %d (baseline %d)", p.sockets, base.sockets))
	}
	if p.backendSockets > base.backendSockets+fdSlack {
		out = append(out, fmt.Sprintf("backend sockets %d (baseline %d)", p.backendSockets, base.backendSockets))
	}
	return out
}

func printSoakHeader() {
	fmt.Printf("%6s %-5s %5s %5s %5s %7s %7s %7s %7s %5s %5s %4s %5s %5s %5s %5s\n",
		"t(s)", "phase", "fds", "socks", "gor", "rss", "heapIU", "live", "objs", "conns", "strms", "ws", "pools", "idle", "bsock", "cpu%")
}

func (p soakPoint) print() {
	fmt.Printf("%6.0f %-5s %5d %5d %5d %7.1f %7.1f %7.1f %7d %5.0f %5.0f %4.0f %5.0f %5.0f %5d %5.1f\n",
		p.at.Seconds(), p.phase, p.fds, p.sockets, p.goroutines, float64(p.rssKiB)/1024,
		p.heapInuse/(1<<20), p.live()/(1<<20), p.heapObjects, p.conns, p.streams, p.ws, p.pools, p.idle, p.backendSockets, p.cpuPct)
}

// soakSampler reads the proxy's /metrics and /proc.
type soakSampler struct {
	admin, pprof    string
	pid, backendPID int
	hc              *http.Client
	t0              time.Time
	points          []soakPoint
	lastTicks       uint64
	lastAt          time.Time
	peakRSS         int64
}

func (s *soakSampler) sample(phase string) (soakPoint, error) {
	p := soakPoint{at: time.Since(s.t0), phase: phase}
	m, err := s.scrape()
	if err != nil {
		return p, err
	}
	p.goroutines = int(m["go_goroutines"][""])
	p.heapInuse = m["go_memstats_heap_inuse_bytes"][""]
	p.nextGC = m["go_memstats_next_gc_bytes"][""]
	p.metricFDs = m["process_open_fds"][""]
	if s.pprof != "" {
		if p.liveExact, p.heapObjects, err = s.liveHeap(); err != nil {
			return p, err
		}
	}
	p.conns = sumOf(m["cubeproxy_connections_open"])
	p.streams = sumOf(m["cubeproxy_streams_open"])
	p.ws = sumOf(m["cubeproxy_websockets_open"])
	p.pools = sumOf(m["cubeproxy_upstream_pools"])
	p.idle = sumOf(m["cubeproxy_upstream_idle_connections"])
	p.retries = sumOf(m["cubeproxy_upstream_retries_total"])
	for labels, v := range m["cubeproxy_streams_ended_total"] {
		if strings.Contains(labels, `reason="killed"`) {
			p.killedEnds += v
		}
	}
	if p.fds, p.sockets, err = fdCounts(s.pid); err != nil {
		return p, err
	}
	if _, p.backendSockets, err = fdCounts(s.backendPID); err != nil {
		return p, err
	}
	if p.rssKiB, err = vmRSSKiB(s.pid); err != nil {
		return p, err
	}
	s.peakRSS = max(s.peakRSS, p.rssKiB)
	ticks, err := procTicks(s.pid)
	if err != nil {
		return p, err
	}
	now := time.Now()
	if !s.lastAt.IsZero() {
		p.cpuPct = 100 * float64(ticks-s.lastTicks) / clkTck / now.Sub(s.lastAt).Seconds()
	}
	s.lastTicks, s.lastAt = ticks, now
	s.points = append(s.points, p)
	return p, nil
}

// liveHeap forces a collection in the proxy (pprof's heap?gc=1) and
// returns the heap then allocated and its object count.
func (s *soakSampler) liveHeap() (float64, int64, error) {
	resp, err := s.hc.Get("http://" + s.pprof + "/debug/pprof/heap?gc=1&debug=1")
	if err != nil {
		return 0, 0, fmt.Errorf("heap profile: %w", err)
	}
	defer resp.Body.Close()
	var alloc float64
	var objects int64
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "# HeapAlloc = "); ok {
			alloc, _ = strconv.ParseFloat(v, 64)
		} else if v, ok := strings.CutPrefix(sc.Text(), "# HeapObjects = "); ok {
			objects, _ = strconv.ParseInt(v, 10, 64)
		}
	}
	if alloc == 0 {
		return 0, 0, fmt.Errorf("heap profile: no HeapAlloc (%v)", sc.Err())
	}
	return alloc, objects, nil
}

// saveHeap writes a heap profile taken after a forced collection to
// dir/name (nothing without -pprof): diffed with go tool pprof
// -diff_base, the baseline's and the end's show what stayed.
func (s *soakSampler) saveHeap(dir, name string) error {
	if s.pprof == "" {
		return nil
	}
	resp, err := s.hc.Get("http://" + s.pprof + "/debug/pprof/heap?gc=1")
	if err != nil {
		return fmt.Errorf("heap profile: %w", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return fmt.Errorf("heap profile: %w", err)
	}
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, b, 0o644); err != nil {
		return fmt.Errorf("save heap profile: %w", err)
	}
	fmt.Printf("heap profile saved: %s\n", path)
	return nil
}

// live is the live heap estimate of p, in bytes.
func (p soakPoint) live() float64 {
	if p.liveExact > 0 {
		return p.liveExact
	}
	return p.nextGC / 2
}

// scrape returns /metrics as name -> labels -> value.
func (s *soakSampler) scrape() (map[string]map[string]float64, error) {
	resp, err := s.hc.Get("http://" + s.admin + "/metrics")
	if err != nil {
		return nil, fmt.Errorf("scrape /metrics: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		return nil, fmt.Errorf("scrape /metrics: status %d", resp.StatusCode)
	}
	return parseProm(resp.Body)
}

// parseProm reads the Prometheus text format (what this soak needs of it).
func parseProm(r io.Reader) (map[string]map[string]float64, error) {
	out := map[string]map[string]float64{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			continue
		}
		name, labels := line[:i], ""
		if j := strings.IndexByte(name, '{'); j >= 0 {
			name, labels = name[:j], name[j:]
		}
		if out[name] == nil {
			out[name] = map[string]float64{}
		}
		out[name][labels] = v
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read /metrics: %w", err)
	}
	return out, nil
}

func sumOf(m map[string]float64) float64 {
	var s float64
	for _, v := range m {
		s += v
	}
	return s
}

// fdCounts returns how many descriptors pid has open, and how many of
// them are sockets.
func fdCounts(pid int) (fds, sockets int, err error) {
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	ents, err := os.ReadDir(dir)
	if err != nil {
		return 0, 0, fmt.Errorf("list %s: %w", dir, err)
	}
	for _, e := range ents {
		fds++
		if t, err := os.Readlink(dir + "/" + e.Name()); err == nil && strings.HasPrefix(t, "socket:") {
			sockets++
		}
	}
	return fds, sockets, nil
}

// loadPhase runs the traffic for d, sampling every interval.
func (s *soakSampler) loadPhase(l *soakLoad, phase string, d, every time.Duration) error {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { l.run(ctx); close(done) }()
	end := time.Now().Add(d)
	var err error
	for time.Now().Before(end) && err == nil {
		time.Sleep(min(every, time.Until(end)))
		var p soakPoint
		if p, err = s.sample(phase); err == nil {
			p.print()
		}
	}
	cancel()
	<-done
	return err
}

// settle polls every second until bad reports nothing or timeout passes,
// printing a row every 10 s; it returns the last sample and whether it
// settled.
func (s *soakSampler) settle(timeout time.Duration, bad func(soakPoint) []string) (soakPoint, bool, error) {
	end := time.Now().Add(timeout)
	last := time.Now()
	for {
		p, err := s.sample("idle")
		if err != nil {
			return p, false, err
		}
		ok := len(bad(p)) == 0
		if ok || !time.Now().Before(end) {
			p.print()
			return p, ok, nil
		}
		if time.Since(last) >= 10*time.Second {
			p.print()
			last = time.Now()
		}
		time.Sleep(time.Second)
	}
}

// heapTrendResult describes the live heap over one phase.
type heapTrendResult struct {
	source            string
	firstMiB, lastMiB float64 // medians of the first and last quarter
	slopeMiBMin       float64 // least-squares slope
	growMiB           float64 // slope × the phase's length
}

// heapTrend fits the live heap (next_gc/2: about the heap marked live at
// the last collection, under GOGC=100; exact with -pprof) of a phase's
// samples. next_gc rather
// than heap_inuse: in use swings with the collection cycle, by up to the
// live heap itself, while the goal moves only with what survives.
func heapTrend(points []soakPoint, phase string) heapTrendResult {
	var xs, ys []float64
	for _, p := range points {
		if p.phase == phase {
			xs = append(xs, p.at.Minutes())
			ys = append(ys, p.live()/(1<<20))
		}
	}
	r := heapTrendResult{source: "next_gc/2"}
	if len(points) > 0 && points[0].liveExact > 0 {
		r.source = "HeapAlloc after GC"
	}
	if len(xs) < 4 {
		return r
	}
	q := len(ys) / 4
	r.firstMiB, r.lastMiB = medianOf(ys[:q]), medianOf(ys[len(ys)-q:])
	var mx, my float64
	for i := range xs {
		mx += xs[i]
		my += ys[i]
	}
	mx /= float64(len(xs))
	my /= float64(len(ys))
	var num, den float64
	for i := range xs {
		num += (xs[i] - mx) * (ys[i] - my)
		den += (xs[i] - mx) * (xs[i] - mx)
	}
	if den > 0 {
		r.slopeMiBMin = num / den
	}
	r.growMiB = r.slopeMiBMin * (xs[len(xs)-1] - xs[0])
	return r
}

func medianOf(v []float64) float64 {
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	return median(s)
}

// report prints every actor's outcomes and returns a reason to fail when
// more than 1 % of all operations ended unexpectedly.
func (l *soakLoad) report(w io.Writer) []string {
	fmt.Fprintf(w, "\n%-16s %8s %8s %8s  %s\n", "actor", "ok", "expected", "unexp", "first unexpected")
	var ok, unexp int64
	for _, a := range l.actors {
		o, e, u := a.ok.Load(), a.expected.Load(), a.unexpected.Load()
		ok += o + e
		unexp += u
		fmt.Fprintf(w, "%-16s %8d %8d %8d  %s\n", a.name, o, e, u, truncate(a.firstUnexpected, 90))
	}
	if total := ok + unexp; total == 0 || float64(unexp) > 0.01*float64(total) {
		return []string{fmt.Sprintf("%d of %d operations ended unexpectedly", unexp, ok+unexp)}
	}
	return nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
