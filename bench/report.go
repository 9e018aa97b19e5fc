package main

import (
	"bufio"
	"cmp"
	"encoding/json"
	"flag"
	"fmt"
	"maps"
	"math"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Subject names the report knows; others are listed after them.
const (
	subjCube     = "cubeproxy"
	subjTuned    = "nginx-tuned"
	subjPlatform = "nginx-platform"
	subjDirect   = "direct"
)

var subjectOrder = []string{subjCube, subjTuned, subjPlatform, subjDirect}

// metricSpec describes one column of a scenario table.
type metricSpec struct {
	key   string
	title string
}

// tableMetrics are the columns shown per scenario (label prefix).
var tableMetrics = []struct {
	prefix  string
	title   string
	metrics []metricSpec
}{
	{"http", "small GET (64 B body, keep-alive; closed loop at saturation, so latency = connections ÷ rate)", []metricSpec{
		{"rps", "req/s"}, {"p50_us", "p50 µs"}, {"p99_us", "p99 µs"}, {"p999_us", "p99.9 µs"},
		{"cpu_us_per_req", "subject CPU µs/req"}, {"subject_cpu_pct", "subject CPU %"}, {"harness_cpu_pct", "harness CPU %"}}},
	{"bytes", "64 KiB GET", []metricSpec{
		{"mib_per_s", "MiB/s"}, {"rps", "resp/s"}, {"p99_us", "p99 µs"}, {"cpu_us_per_req", "subject CPU µs/resp"},
		{"subject_cpu_pct", "subject CPU %"}, {"harness_cpu_pct", "harness CPU %"}}},
	{"sse-tput", "SSE throughput (backend writes as fast as it can)", []metricSpec{
		{"events_per_s", "events/s"}, {"mib_per_s", "MiB/s"}, {"cpu_us_per_event", "subject CPU µs/event"},
		{"subject_cpu_pct", "subject CPU %"}, {"harness_cpu_pct", "harness CPU %"}}},
	{"sse-lat", "SSE latency (one event every 10 ms per stream)", []metricSpec{
		{"lat_p50_us", "p50 µs"}, {"lat_p99_us", "p99 µs"}, {"lat_max_us", "max µs"},
		{"ttfe_p50_us", "first event p50 µs"}, {"events_per_s", "events/s"}}},
	{"ws", "WebSocket echo (64 B messages; closed loop at saturation)", []metricSpec{
		{"rtt_per_s", "round trips/s"}, {"p50_us", "p50 µs"}, {"p99_us", "p99 µs"}, {"cpu_us_per_rtt", "subject CPU µs/rtt"},
		{"subject_cpu_pct", "subject CPU %"}, {"harness_cpu_pct", "harness CPU %"}}},
	{"mcp", "MCP tools/call with 5 streamed progress notifications (go-sdk; closed loop at saturation)", []metricSpec{
		{"calls_per_s", "calls/s"}, {"p50_us", "p50 µs"}, {"p99_us", "p99 µs"}, {"progress_per_s", "progress/s"},
		{"subject_cpu_pct", "subject CPU %"}, {"harness_cpu_pct", "harness CPU %"}}},
	{"cold", "cold lookups (each request a new sandbox id, Redis store; closed loop at saturation)", []metricSpec{
		{"lookups_per_s", "lookups/s"}, {"p50_us", "p50 µs"}, {"p99_us", "p99 µs"}, {"p999_us", "p99.9 µs"},
		{"subject_cpu_pct", "subject CPU %"}, {"harness_cpu_pct", "harness CPU %"}}},
	{"idle", "idle SSE streams held open", []metricSpec{
		{"rss_kib_per_stream", "RSS KiB/stream"}, {"rss_before_kib", "RSS before KiB"},
		{"rss_held_kib", "RSS held KiB"}, {"streams", "streams"}}},
}

// cell aggregates one metric of one subject over the kept samples.
type cell struct {
	med, lo, hi float64
	n           int
}

func (c cell) ok() bool { return c.n > 0 }

// labelData is everything the report knows about one scenario variant.
type labelData struct {
	label    string
	subjects map[string][]*Sample // kept samples per subject
	failed   map[string][]string  // reasons of failed repetitions per subject
	// failedAttempts are the reasons of failed attempts of repetitions
	// that kept another attempt (a noisy sample whose rerun failed): the
	// subject failed there too, which the kept sample does not show.
	failedAttempts map[string][]string
}

// errorCounts sums the operations and the failed operations of a
// subject's kept samples: each is under the -max-errors limit, yet their
// errors are the subject's.
func (d *labelData) errorCounts(subject string) (ops, errs int64) {
	for _, s := range d.subjects[subject] {
		ops += s.Ops
		errs += s.Errors
	}
	return ops, errs
}

func (d *labelData) cell(subject, key string) cell {
	var vals []float64
	for _, s := range d.subjects[subject] {
		if v, ok := s.Metrics[key]; ok {
			vals = append(vals, v)
		}
	}
	if len(vals) == 0 {
		return cell{}
	}
	slices.Sort(vals)
	return cell{med: median(vals), lo: vals[0], hi: vals[len(vals)-1], n: len(vals)}
}

func median(sorted []float64) float64 {
	n := len(sorted)
	if n%2 == 1 {
		return sorted[n/2]
	}
	return (sorted[n/2-1] + sorted[n/2]) / 2
}

type reportFlags struct {
	in, out, mode, elapsed, nginx, pinning string
	haveCube                               bool
	// micro is the `go test -bench` output of the hot path's
	// micro-benchmarks; empty when they were not run (--only).
	micro string
}

func runReport(args []string) error {
	fs := flag.NewFlagSet("report", flag.ContinueOnError)
	var f reportFlags
	fs.StringVar(&f.in, "in", "", "samples file (JSON lines) written by the scenarios")
	fs.StringVar(&f.out, "out", "bench/RESULTS.md", "markdown report to write")
	fs.StringVar(&f.mode, "mode", "full", "run mode, shown in the header")
	fs.StringVar(&f.elapsed, "elapsed", "", "wall time of the whole run, shown in the header")
	fs.StringVar(&f.nginx, "nginx", "", "nginx version string")
	fs.StringVar(&f.pinning, "pinning", "", "how processes were pinned to CPUs")
	fs.BoolVar(&f.haveCube, "have-cube", true, "whether cubeproxy was measured")
	fs.StringVar(&f.micro, "micro", "", "go test -bench output of the hot-path micro-benchmarks, judged in the targets table")
	if err := fs.Parse(args); err != nil {
		return err
	}
	samples, err := readSamples(f.in)
	if err != nil {
		return err
	}
	var micro []microResult
	if f.micro != "" {
		fh, err := os.Open(f.micro)
		if err != nil {
			return fmt.Errorf("open micro-benchmarks: %w", err)
		}
		micro, err = parseMicro(fh)
		fh.Close()
		if err != nil {
			return err
		}
	}
	labels := groupSamples(samples)
	var b strings.Builder
	writeReport(&b, f, samples, labels, micro)
	if err := os.WriteFile(f.out, []byte(b.String()), 0o644); err != nil {
		return fmt.Errorf("write report: %w", err)
	}
	return nil
}

func readSamples(path string) ([]*Sample, error) {
	fh, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open samples: %w", err)
	}
	defer fh.Close()
	var out []*Sample
	sc := bufio.NewScanner(fh)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if len(strings.TrimSpace(sc.Text())) == 0 {
			continue
		}
		var s Sample
		if err := json.Unmarshal(sc.Bytes(), &s); err != nil {
			return nil, fmt.Errorf("parse sample %q: %w", sc.Text(), err)
		}
		out = append(out, &s)
	}
	return out, sc.Err()
}

// groupSamples keeps, per (label, subject, rep), the usable attempt with the
// least CPU taken by other processes; repetitions without one are failures.
func groupSamples(samples []*Sample) []*labelData {
	type key struct {
		label, subject string
		rep            int
	}
	best := map[key]*Sample{}
	fails := map[key][]string{}
	var order []string
	byLabel := map[string]*labelData{}
	for _, s := range samples {
		if byLabel[s.Label] == nil {
			byLabel[s.Label] = &labelData{label: s.Label, subjects: map[string][]*Sample{},
				failed: map[string][]string{}, failedAttempts: map[string][]string{}}
			order = append(order, s.Label)
		}
		k := key{s.Label, s.Subject, s.Rep}
		if s.Failed != "" {
			fails[k] = append(fails[k], s.Failed)
			continue
		}
		if b := best[k]; b == nil || s.OtherCPUPct < b.OtherCPUPct {
			best[k] = s
		}
	}
	for k, s := range best {
		byLabel[k.label].subjects[k.subject] = append(byLabel[k.label].subjects[k.subject], s)
	}
	// Map order would shuffle the reasons: the first one shown under a
	// table must not change from one report of the same samples to the next.
	keys := slices.Collect(maps.Keys(fails))
	slices.SortFunc(keys, func(a, b key) int {
		return cmp.Or(cmp.Compare(a.label, b.label), cmp.Compare(a.subject, b.subject), cmp.Compare(a.rep, b.rep))
	})
	for _, k := range keys {
		l := byLabel[k.label]
		if best[k] == nil {
			l.failed[k.subject] = append(l.failed[k.subject], fails[k][len(fails[k])-1])
		} else {
			l.failedAttempts[k.subject] = append(l.failedAttempts[k.subject], fails[k]...)
		}
	}
	out := make([]*labelData, 0, len(order))
	for _, l := range order {
		out = append(out, byLabel[l])
	}
	return out
}

func findLabel(labels []*labelData, label string) *labelData {
	for _, l := range labels {
		if l.label == label {
			return l
		}
	}
	return nil
}

func findPrefix(labels []*labelData, prefix string) *labelData {
	for _, l := range labels {
		if strings.HasPrefix(l.label, prefix) {
			return l
		}
	}
	return nil
}

func writeReport(b *strings.Builder, f reportFlags, samples []*Sample, labels []*labelData, micro []microResult) {
	fmt.Fprintf(b, "# CubeProxy benchmark results\n\n")
	fmt.Fprintf(b, "Generated by `bench/compare.sh` (%s mode) on %s", f.mode, time.Now().UTC().Format("2006-01-02 15:04 MST"))
	if f.elapsed != "" {
		fmt.Fprintf(b, ", run took %s", f.elapsed)
	}
	fmt.Fprintf(b, ". Method and how to profile: `bench/README.md`.\n\n")
	writeMachine(b, f)
	writeNoise(b, samples)
	if !f.haveCube {
		fmt.Fprintf(b, "**CubeProxy was not measured in this run** (`go build ./cmd/cubeproxy` failed); the tables show the peers only.\n\n")
	}
	writeTargets(b, labels, micro)
	fmt.Fprintf(b, "## Scenarios\n\n")
	fmt.Fprintf(b, "Cells are the median over repetitions with the range (min–max) in brackets. ")
	fmt.Fprintf(b, "Ratios divide medians measured in this run. \"subject CPU\" is utime+stime of the subject process tree over the window (nginx: master + worker). ")
	fmt.Fprintf(b, "\"harness CPU %%\" is that of the load generator, backend and redis, in %% of one core (pinned: CPU 1's load). "+
		"Closed-loop rates are bounded by whichever side runs out of CPU first: where the harness is near 100 %% and the subject is not, "+
		"the rate says how much harness CPU the subject's way of reading and writing costs, not how fast the subject can go; compare subject CPU per operation there.\n\n")
	for _, l := range labels {
		writeLabel(b, l)
	}
}

func writeMachine(b *strings.Builder, f reportFlags) {
	fmt.Fprintf(b, "## Machine\n\n| | |\n|---|---|\n")
	fmt.Fprintf(b, "| cores | %d (%s) |\n", runtime.NumCPU(), cpuModel())
	fmt.Fprintf(b, "| kernel | %s |\n", readTrim("/proc/sys/kernel/osrelease"))
	fmt.Fprintf(b, "| Go | %s |\n", runtime.Version())
	if f.nginx != "" {
		fmt.Fprintf(b, "| nginx | %s |\n", strings.TrimPrefix(f.nginx, "nginx version: "))
	}
	if f.pinning != "" {
		fmt.Fprintf(b, "| pinning | %s; CubeProxy GOMAXPROCS=1, nginx worker_processes 1 |\n", f.pinning)
	}
	fmt.Fprintf(b, "\n")
}

func writeNoise(b *strings.Builder, samples []*Sample) {
	var others []float64
	reruns, failed := 0, 0
	type key struct {
		label, subject string
		rep            int
	}
	quietest := map[key]float64{}
	for _, s := range samples {
		others = append(others, s.OtherCPUPct)
		if s.Attempt > 0 {
			reruns++
		}
		if s.Failed != "" {
			failed++
			continue
		}
		if s.Scenario == "idle" {
			continue // RSS does not depend on CPU noise; idle samples are not rerun
		}
		k := key{s.Label, s.Subject, s.Rep}
		if q, ok := quietest[k]; !ok || s.OtherCPUPct < q {
			quietest[k] = s.OtherCPUPct
		}
	}
	noisyKept := 0
	for _, q := range quietest {
		if q > 5 {
			noisyKept++
		}
	}
	if len(others) == 0 {
		fmt.Fprintf(b, "No samples.\n\n")
		return
	}
	slices.Sort(others)
	fmt.Fprintf(b, "## Noise\n\n")
	fmt.Fprintf(b, "%d samples, %d of them reruns; %d failed. CPU used by processes outside the benchmark during a sample "+
		"(from /proc/stat minus the harness's own processes, %% of all CPUs): median %.1f %%, max %.1f %%. "+
		"%d kept repetitions (idle excluded) ran above 5 %% in every attempt made: reruns stop at the attempt limit "+
		"(2 in quick mode, 3 in full) or when the time budget has no room for one; "+
		"the machine is shared.\n\n",
		len(samples), reruns, failed, median(others), others[len(others)-1], noisyKept)
}

// target is one line of the targets table.
type target struct {
	scenario, goal, measured string
	verdict                  string
}

func verdict(ok, have bool) string {
	switch {
	case !have:
		return "n/a"
	case ok:
		return "met"
	}
	return "**missed**"
}

func ratio(a, b cell) (float64, bool) {
	if !a.ok() || !b.ok() || b.med == 0 {
		return 0, false
	}
	return a.med / b.med, true
}

// ratioText formats a ratio judged against limit (at least it when
// atLeast, at most otherwise): two decimals, unless rounding would show a
// figure on the other side of the limit from the verdict (0.997 printed
// "1.00" next to "missed"); then as many decimals as it takes.
func ratioText(r, limit float64, atLeast bool) string {
	meets := func(x float64) bool {
		if atLeast {
			return x >= limit
		}
		return x <= limit
	}
	for prec := 2; prec < 6; prec++ {
		txt := strconv.FormatFloat(r, 'f', prec, 64)
		if shown, err := strconv.ParseFloat(txt, 64); err == nil && meets(shown) == meets(r) {
			return txt
		}
	}
	return strconv.FormatFloat(r, 'g', -1, 64)
}

// cubeFailures says how CubeProxy's failures in l change a target: every
// repetition failed (the target is missed, whatever the peers did), or
// a note on the failed repetitions and operations behind the figure.
func cubeFailures(l *labelData) (allFailed bool, note string) {
	failed, kept := len(l.failed[subjCube]), len(l.subjects[subjCube])
	if kept == 0 && failed > 0 {
		return true, fmt.Sprintf("every CubeProxy repetition failed: %s", l.failed[subjCube][0])
	}
	var notes []string
	if failed > 0 {
		notes = append(notes, fmt.Sprintf("%d of %d CubeProxy repetitions failed", failed, failed+kept))
	}
	if n := len(l.failedAttempts[subjCube]); n > 0 {
		notes = append(notes, fmt.Sprintf("%d CubeProxy rerun(s) failed", n))
	}
	if ops, errs := l.errorCounts(subjCube); errs > 0 {
		notes = append(notes, fmt.Sprintf("%d of %d CubeProxy operations failed", errs, ops+errs))
	}
	return false, strings.Join(notes, "; ")
}

// cpuNote gives the subject and harness CPU shares behind a rate ratio of
// CubeProxy against peer: a peer below 100 % of its core while the harness
// is at 100 % was held back by the load generator, not by itself. Direct
// has no subject, and an absolute target (peer "") no peer: CubeProxy's
// shares are given all the same, as a proxy at 8 % of its core behind a
// harness at 100 % is not what bounds the rate.
func cpuNote(l *labelData, peer string) string {
	sc, sp := l.cell(subjCube, "subject_cpu_pct"), l.cell(peer, "subject_cpu_pct")
	hc, hp := l.cell(subjCube, "harness_cpu_pct"), l.cell(peer, "harness_cpu_pct")
	switch {
	case !sc.ok() || !hc.ok():
		return ""
	case sp.ok() && hp.ok():
		return fmt.Sprintf("; subject CPU %.0f vs %.0f %%, harness %.0f vs %.0f %%", sc.med, sp.med, hc.med, hp.med)
	case hp.ok():
		return fmt.Sprintf("; subject CPU %.0f %%, harness %.0f vs %.0f %%", sc.med, hc.med, hp.med)
	}
	return fmt.Sprintf("; subject CPU %.0f %%, harness %.0f %%", sc.med, hc.med)
}

func writeTargets(b *strings.Builder, labels []*labelData, micro []microResult) {
	var ts []target
	// l is the label the figures come from: a CubeProxy that failed
	// every repetition misses the target (a proxy answering 502 fast has
	// no figures, and "n/a" read as "not measured"); failures behind a
	// figure are named next to it.
	add := func(l *labelData, scn, goal string, measured string, ok, have bool) {
		allFailed, note := cubeFailures(l)
		switch {
		case allFailed:
			measured, ok, have = note, false, true
		case !have:
			measured = "no data"
		case note != "":
			measured += " (" + note + ")"
		}
		ts = append(ts, target{scn, goal, strings.ReplaceAll(measured, "|", `\|`), verdict(ok, have)})
	}
	if l := findLabel(labels, "http"); l != nil {
		cpuC, cpuT := l.cell(subjCube, "cpu_us_per_req"), l.cell(subjTuned, "cpu_us_per_req")
		r, have := ratio(cpuC, cpuT)
		add(l, "http", "proxy CPU/request ≤ 1.0× nginx-tuned", fmt.Sprintf("%s× (%.2f vs %.2f µs)", ratioText(r, 1.0, false), cpuC.med, cpuT.med), r <= 1.0, have)
		rpsC, rpsT := l.cell(subjCube, "rps"), l.cell(subjTuned, "rps")
		r, have = ratio(rpsC, rpsT)
		add(l, "http", "requests/s ≥ 0.95× nginx-tuned", fmt.Sprintf("%s× (%.0f vs %.0f%s)", ratioText(r, 0.95, true), rpsC.med, rpsT.med, cpuNote(l, subjTuned)), r >= 0.95, have)
		p99C, p99T := l.cell(subjCube, "p99_us"), l.cell(subjTuned, "p99_us")
		add(l, "http", "p99 ≤ nginx-tuned p99", fmt.Sprintf("%.0f vs %.0f µs", p99C.med, p99T.med), p99C.med <= p99T.med, p99C.ok() && p99T.ok())
	}
	if l := findLabel(labels, "bytes"); l != nil {
		c, d, t := l.cell(subjCube, "mib_per_s"), l.cell(subjDirect, "mib_per_s"), l.cell(subjTuned, "mib_per_s")
		r, have := ratio(c, d)
		add(l, "bytes", "MB/s ≥ 0.9× direct", fmt.Sprintf("%s× (%.0f vs %.0f MiB/s%s)", ratioText(r, 0.9, true), c.med, d.med, cpuNote(l, subjDirect)), r >= 0.9, have)
		r, have = ratio(c, t)
		add(l, "bytes", "MB/s ≥ 2× nginx-tuned", fmt.Sprintf("%s× (%.0f vs %.0f MiB/s%s)", ratioText(r, 2, true), c.med, t.med, cpuNote(l, subjTuned)), r >= 2, have)
	}
	if l := findPrefix(labels, "sse-tput"); l != nil {
		c, t := l.cell(subjCube, "events_per_s"), l.cell(subjTuned, "events_per_s")
		r, have := ratio(c, t)
		add(l, l.label, "events/s ≥ 1.0× nginx-tuned", fmt.Sprintf("%s× (%.0f vs %.0f%s)", ratioText(r, 1.0, true), c.med, t.med, cpuNote(l, subjTuned)), r >= 1.0, have)
	}
	for _, l := range labels {
		if !strings.HasPrefix(l.label, "sse-lat") {
			continue
		}
		c, d := l.cell(subjCube, "lat_p99_us"), l.cell(subjDirect, "lat_p99_us")
		have := c.ok() && d.ok()
		add(l, l.label, "added p99 per-event latency ≤ 1 ms over direct", fmt.Sprintf("%+.0f µs (%.0f vs %.0f)", c.med-d.med, c.med, d.med), c.med-d.med <= 1000, have)
		c, d = l.cell(subjCube, "ttfe_p50_us"), l.cell(subjDirect, "ttfe_p50_us")
		have = c.ok() && d.ok()
		add(l, l.label, "added time-to-first-event p50 ≤ 0.5 ms", fmt.Sprintf("%+.0f µs (%.0f vs %.0f)", c.med-d.med, c.med, d.med), c.med-d.med <= 500, have)
	}
	if l := findPrefix(labels, "idle"); l != nil {
		c, t := l.cell(subjCube, "rss_kib_per_stream"), l.cell(subjTuned, "rss_kib_per_stream")
		// Without nginx-tuned's figure the comparison cannot be made: n/a,
		// not met.
		add(l, l.label, "≤ 16 KiB RSS per idle stream and < nginx-tuned", fmt.Sprintf("%.1f vs %.1f KiB", c.med, t.med),
			c.med <= 16 && c.med < t.med, c.ok() && t.ok())
	}
	if l := findLabel(labels, "ws"); l != nil {
		c, t := l.cell(subjCube, "rtt_per_s"), l.cell(subjTuned, "rtt_per_s")
		r, have := ratio(c, t)
		add(l, "ws", "round trips/s ≥ 1.0× nginx-tuned", fmt.Sprintf("%s× (%.0f vs %.0f%s)", ratioText(r, 1.0, true), c.med, t.med, cpuNote(l, subjTuned)), r >= 1.0, have)
	}
	if l := findLabel(labels, "mcp"); l != nil {
		c, d := l.cell(subjCube, "calls_per_s"), l.cell(subjDirect, "calls_per_s")
		r, have := ratio(c, d)
		add(l, "mcp", "calls/s ≥ 0.95× direct", fmt.Sprintf("%s× (%.0f vs %.0f%s)", ratioText(r, 0.95, true), c.med, d.med, cpuNote(l, subjDirect)), r >= 0.95, have)
	}
	if l := findLabel(labels, "cold"); l != nil {
		c, p := l.cell(subjCube, "lookups_per_s"), l.cell(subjCube, "p99_us")
		rate := fmt.Sprintf("%.0f/s", c.med)
		if note := cpuNote(l, ""); note != "" {
			rate += " (" + strings.TrimPrefix(note, "; ") + ")"
		}
		add(l, "cold", "≥ 10,000 cold lookups/s", rate, c.med >= 10000, c.ok())
		add(l, "cold", "cold lookup p99 ≤ 2 ms", fmt.Sprintf("%.0f µs", p.med), p.med <= 2000, p.ok())
	}
	// The micro-benchmarks run after the load (compare.sh), at
	// GOMAXPROCS=1 on the subjects' CPU; --only runs none.
	for _, m := range []struct {
		scn, family, goal string
		maxNs             float64
	}{
		{"cache hit", "BenchmarkCacheHit", "≤ 100 ns and 0 allocs/op", 100},
		{"host parsing", "BenchmarkParse", "0 allocs/op", 0},
	} {
		measured, ok, have := microTarget(micro, m.family, m.maxNs)
		if !have {
			measured = "no micro-benchmark output (`--only` runs none; a failed build or run gives none either)"
			if len(micro) > 0 {
				measured = "no `" + m.family + "` in the micro-benchmarks"
			}
		}
		ts = append(ts, target{m.scn, m.goal, measured, verdict(ok, have)})
	}

	fmt.Fprintf(b, "## Targets\n\nCubeProxy against the issue's targets, from the medians below.\n\n")
	fmt.Fprintf(b, "| scenario | target | measured | verdict |\n|---|---|---|---|\n")
	for _, t := range ts {
		fmt.Fprintf(b, "| %s | %s | %s | %s |\n", t.scenario, t.goal, t.measured, t.verdict)
	}
	fmt.Fprintf(b, "\n")
}

func specFor(label string) (string, []metricSpec) {
	for _, t := range tableMetrics {
		if strings.HasPrefix(label, t.prefix) {
			return t.title, t.metrics
		}
	}
	return label, nil
}

func orderedSubjects(l *labelData) []string {
	var out []string
	for _, s := range subjectOrder {
		if len(l.subjects[s]) > 0 || len(l.failed[s]) > 0 {
			out = append(out, s)
		}
	}
	var rest []string
	for s := range l.subjects {
		if !slices.Contains(subjectOrder, s) {
			rest = append(rest, s)
		}
	}
	for s := range l.failed {
		if !slices.Contains(subjectOrder, s) && !slices.Contains(rest, s) {
			rest = append(rest, s)
		}
	}
	slices.Sort(rest)
	return append(out, rest...)
}

func writeLabel(b *strings.Builder, l *labelData) {
	title, specs := specFor(l.label)
	params := ""
	for _, ss := range l.subjects {
		if len(ss) > 0 {
			params = ss[0].Params
			break
		}
	}
	fmt.Fprintf(b, "### %s: %s\n\n", l.label, title)
	if params != "" {
		fmt.Fprintf(b, "Parameters: `%s`.\n\n", params)
	}
	fmt.Fprintf(b, "| subject |")
	for _, m := range specs {
		fmt.Fprintf(b, " %s |", m.title)
	}
	fmt.Fprintf(b, " other CPU %% | reps |\n|---|")
	for range specs {
		fmt.Fprintf(b, "---|")
	}
	fmt.Fprintf(b, "---|---|\n")
	subjects := orderedSubjects(l)
	for _, s := range subjects {
		fmt.Fprintf(b, "| %s |", s)
		for _, m := range specs {
			fmt.Fprintf(b, " %s |", fmtCell(l.cell(s, m.key)))
		}
		var other []float64
		for _, smp := range l.subjects[s] {
			other = append(other, smp.OtherCPUPct)
		}
		slices.Sort(other)
		o := "–"
		if len(other) > 0 {
			o = fmt.Sprintf("%.1f", median(other))
		}
		fmt.Fprintf(b, " %s | %d |\n", o, len(l.subjects[s]))
	}
	ratioRow := func(name, den string) {
		if len(l.subjects[subjCube]) == 0 || len(l.subjects[den]) == 0 {
			return
		}
		fmt.Fprintf(b, "| *%s* |", name)
		for _, m := range specs {
			r, ok := ratio(l.cell(subjCube, m.key), l.cell(den, m.key))
			if ok {
				fmt.Fprintf(b, " %s× |", fmtRatio(r))
			} else {
				fmt.Fprintf(b, " – |")
			}
		}
		fmt.Fprintf(b, " | |\n")
	}
	ratioRow("CubeProxy ÷ nginx-tuned", subjTuned)
	ratioRow("CubeProxy ÷ nginx-platform", subjPlatform)
	ratioRow("CubeProxy ÷ direct", subjDirect)
	fmt.Fprintf(b, "\n")

	if strings.HasPrefix(l.label, "sse-lat") && len(l.subjects[subjDirect]) > 0 {
		fmt.Fprintf(b, "Latency added over direct (median of subject − median of direct):\n\n")
		fmt.Fprintf(b, "| subject | p50 | p99 | max | first event p50 |\n|---|---|---|---|---|\n")
		for _, s := range subjects {
			if s == subjDirect || len(l.subjects[s]) == 0 {
				continue
			}
			fmt.Fprintf(b, "| %s |", s)
			for _, k := range []string{"lat_p50_us", "lat_p99_us", "lat_max_us", "ttfe_p50_us"} {
				fmt.Fprintf(b, " %s |", fmtAdded(l.cell(s, k).med-l.cell(subjDirect, k).med))
			}
			fmt.Fprintf(b, "\n")
		}
		fmt.Fprintf(b, "\n")
	}
	notes := 0
	for _, s := range subjects {
		if fails := l.failed[s]; len(fails) > 0 {
			fmt.Fprintf(b, "- %s: %d repetition(s) failed: %s\n", s, len(fails), fails[0])
			notes++
		}
		if fails := l.failedAttempts[s]; len(fails) > 0 {
			fmt.Fprintf(b, "- %s: %d rerun(s) failed where another attempt of the repetition was kept: %s\n", s, len(fails), fails[0])
			notes++
		}
		if ops, errs := l.errorCounts(s); errs > 0 {
			fmt.Fprintf(b, "- %s: %d of %d operations failed in the kept repetitions (each under the failure limit)\n", s, errs, ops+errs)
			notes++
		}
	}
	if notes > 0 {
		fmt.Fprintf(b, "\n")
	}
}

func fmtRatio(r float64) string {
	if r != 0 && math.Abs(r) < 0.1 {
		return fmt.Sprintf("%.3f", r)
	}
	return fmt.Sprintf("%.2f", r)
}

func fmtAdded(us float64) string {
	if math.Abs(us) >= 1000 {
		return fmt.Sprintf("%+.2f ms", us/1000)
	}
	return fmt.Sprintf("%+.0f µs", us)
}

func fmtCell(c cell) string {
	if !c.ok() {
		return "–"
	}
	if c.n == 1 || c.lo == c.hi {
		return fmtNum(c.med)
	}
	return fmt.Sprintf("%s (%s–%s)", fmtNum(c.med), fmtNum(c.lo), fmtNum(c.hi))
}

func fmtNum(v float64) string {
	switch a := math.Abs(v); {
	case a >= 100:
		return fmt.Sprintf("%.0f", v)
	case a >= 10:
		return fmt.Sprintf("%.1f", v)
	default:
		return fmt.Sprintf("%.2f", v)
	}
}

func cpuModel() string {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return "unknown CPU"
	}
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return "unknown CPU"
}

func readTrim(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return "unknown"
	}
	return strings.TrimSpace(string(b))
}
