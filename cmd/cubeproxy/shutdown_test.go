package main

// Lifecycle: everything serve starts is stopped by the time it returns, in
// every mode, and nothing is left open or written afterwards.

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/grpc"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
	"github.com/cube-sandbox/cubeproxy/routing/redisstore"
)

// leakPackages name the code whose goroutines must not outlive serve: the
// proxy's own and the libraries it starts work in.
var leakPackages = []string{
	"github.com/cube-sandbox/cubeproxy",
	"main.",
	"github.com/caddyserver/",
	"github.com/mholt/acmez",
	"github.com/libdns/",
	"github.com/redis/go-redis",
	"github.com/valyala/fasthttp",
	"go.opentelemetry.io/",
	"google.golang.org/grpc",
}

// processWide are goroutines a library starts once per process and never
// stops, whatever the proxy does: not a leak of one serve.
var processWide = []string{
	// fasthttp's Date header clock (serverDateOnce), started by the
	// first server that answers with a Date.
	"created by github.com/valyala/fasthttp.updateServerDate",
	// fasthttp's worker pool cleaner: Serve stops it when it returns, but
	// it notices only after its sleep (MaxIdleWorkerDuration, 10 s), which
	// nothing can cut short. It holds nothing of the proxy's.
	"created by github.com/valyala/fasthttp.(*workerPool).Start",
	// certmagic's FileStorage refreshes a lock file it created every 5 s
	// until it finds the file gone, and nothing wakes it: it may outlive
	// the released lock by that much. It only looks (no O_CREATE); the
	// acme cases check that no lock file is left for it to refresh.
	"created by github.com/caddyserver/certmagic.createLockfile",
	// certmagic's throttle of orders per CA and account, kept in a
	// package map for the process's life so that restarts of a Config
	// share it (its own TODO: never stopped).
	"created by github.com/caddyserver/certmagic.NewRateLimiter",
}

// goroutine is one entry of runtime.Stack(all).
type goroutine struct {
	id, parent int
	stack      string
}

var (
	goroutineHead   = regexp.MustCompile(`^goroutine (\d+) `)
	goroutineParent = regexp.MustCompile(`\ncreated by .* in goroutine (\d+)\n`)
)

// goroutines lists every goroutine with its stack.
func goroutines() []goroutine {
	var out []goroutine
	for _, s := range testenv.Stacks() {
		m := goroutineHead.FindStringSubmatch(s)
		if m == nil {
			continue
		}
		g := goroutine{stack: s}
		g.id, _ = strconv.Atoi(m[1])
		if p := goroutineParent.FindStringSubmatch(s + "\n"); p != nil {
			g.parent, _ = strconv.Atoi(p[1])
		}
		out = append(out, g)
	}
	return out
}

// goroutineIDs is the set of goroutines running now.
func goroutineIDs() map[int]bool {
	ids := map[int]bool{}
	for _, g := range goroutines() {
		ids[g.id] = true
	}
	return ids
}

// testOwned reports whether g belongs to the test rather than to the
// proxy: its stack (or its creation) is in test code, or the goroutine
// that created it, still running, is the test's. The goroutine that ran
// serve is the test's too, but it has returned by the time this is asked:
// what serve started is judged on its own.
func testOwned(g goroutine, byID map[int]goroutine, seen map[int]bool) bool {
	if strings.Contains(g.stack, "_test.go:") || strings.Contains(g.stack, "/internal/testenv/") {
		return true
	}
	if strings.Contains(g.stack, "google.golang.org/grpc.(*Server)") || strings.Contains(g.stack, "grpc/internal/transport.NewServerTransport") {
		return true // the test's collector: the proxy serves no gRPC
	}
	p, ok := byID[g.parent]
	if !ok || seen[g.id] {
		return false
	}
	seen[g.id] = true
	return testOwned(p, byID, seen)
}

// leakedGoroutines returns the stacks of the goroutines started since
// before (goroutineIDs) that run the proxy's or its libraries' code and
// are neither the test's nor process-wide.
func leakedGoroutines(before map[int]bool) []string {
	all := goroutines()
	byID := map[int]goroutine{}
	for _, g := range all {
		byID[g.id] = g
	}
	var out []string
	for _, g := range all {
		if before[g.id] || !containsAny(g.stack, leakPackages) || containsAny(g.stack, processWide) {
			continue
		}
		if testOwned(g, byID, map[int]bool{}) {
			continue
		}
		out = append(out, g.stack)
	}
	return out
}

// redisLeakTraffic is the Redis cases' traffic: once the invalidation
// subscription is applied, a proxied request for "box" and a cache drop
// through the admin API (an invalidation published and received).
func redisLeakTraffic(t *testing.T, a *app) {
	waitSubscribed(t, a, nil)
	leakGet(t, a, fmt.Sprintf("%d-box.cube.test", redisContainerPort), "ok")
	leakAdmin(t, a, "POST", "/admin/backend_cache/delete", `{"sandbox_id":"box"}`)
}

// leakedAfter polls leakedGoroutines for up to d, as what is stopping may
// take a moment to unwind, and returns what is still running then.
func leakedAfter(before map[int]bool, d time.Duration) []string {
	deadline := time.Now().Add(d)
	for {
		leaked := leakedGoroutines(before)
		if len(leaked) == 0 || time.Now().After(deadline) {
			return leaked
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func containsAny(s string, subs []string) bool {
	for _, sub := range subs {
		if strings.Contains(s, sub) {
			return true
		}
	}
	return false
}

// openUnder lists the descriptors of this process open on a path under
// one of dirs.
func openUnder(dirs []string) []string {
	fds, _ := os.ReadDir("/proc/self/fd")
	var out []string
	for _, fd := range fds {
		target, err := os.Readlink(filepath.Join("/proc/self/fd", fd.Name()))
		if err != nil {
			continue
		}
		for _, d := range dirs {
			if target == d || strings.HasPrefix(target, d+string(filepath.Separator)) {
				out = append(out, fd.Name()+" -> "+target)
			}
		}
	}
	return out
}

// sockets lists this process's TCP sockets (not listening ones) as
// "local -> remote" with their ports, from /proc/net/tcp{,6} and the
// descriptors in /proc/self/fd.
func sockets(t *testing.T) []tcpSocket {
	t.Helper()
	return ownTCP(false)
}

// listeners lists the ports of this process's listening TCP sockets, or
// is nil where /proc does not tell.
func listeners(t *testing.T) map[int]bool {
	t.Helper()
	if _, err := os.Stat("/proc/self/fd"); err != nil {
		return nil
	}
	ports := map[int]bool{}
	for _, sk := range ownTCP(true) {
		ports[sk.local] = true
	}
	return ports
}

// ownTCP lists this process's TCP sockets, the listening ones or the
// others, from /proc/net/tcp{,6} and the descriptors in /proc/self/fd.
func ownTCP(listening bool) []tcpSocket {
	inodes := map[string]bool{}
	fds, _ := os.ReadDir("/proc/self/fd")
	for _, fd := range fds {
		target, err := os.Readlink(filepath.Join("/proc/self/fd", fd.Name()))
		if err == nil && strings.HasPrefix(target, "socket:[") {
			inodes[strings.TrimSuffix(strings.TrimPrefix(target, "socket:["), "]")] = true
		}
	}
	var out []tcpSocket
	for _, table := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		b, err := os.ReadFile(table)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n")[1:] {
			f := strings.Fields(line)
			// sl local rem st tx:rx tr:when retrnsmt uid timeout inode
			if len(f) < 10 || !inodes[f[9]] || (f[3] == "0A") != listening { // 0A: LISTEN
				continue
			}
			out = append(out, tcpSocket{local: hexPort(f[1]), remote: hexPort(f[2]), line: line})
		}
	}
	return out
}

// tcpSocket is one line of /proc/net/tcp with its ports.
type tcpSocket struct {
	local, remote int
	line          string
}

// hexPort is the port of a /proc/net/tcp address ("0100007F:1F90").
func hexPort(addr string) int {
	_, p, _ := strings.Cut(addr, ":")
	n, _ := strconv.ParseInt(p, 16, 32)
	return int(n)
}

// treeState lists every file under dirs with its size and mtime, so that
// two listings differ when anything was created, removed or written.
func treeState(t *testing.T, dirs []string) []string {
	t.Helper()
	var out []string
	for _, d := range dirs {
		err := filepath.WalkDir(d, func(p string, e fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			fi, err := e.Info()
			if err != nil {
				return err
			}
			out = append(out, fmt.Sprintf("%s %v %d %d", p, fi.Mode(), fi.Size(), fi.ModTime().UnixNano()))
			return nil
		})
		if err != nil {
			t.Fatalf("walk %s: %v", d, err)
		}
	}
	return out
}

// leakCase is one mode of the proxy for TestServeLeavesNothingBehind.
type leakCase struct {
	args []string
	// dirs are the proxy's directories (routes, access log, ACME storage):
	// nothing in them may stay open or change once serve has returned.
	dirs []string
	// traffic runs while the proxy serves; what it leaves open (a
	// tunnel, a stream) is open when serve is stopped.
	traffic func(t *testing.T, a *app)
	// after checks what the mode leaves once serve returned, and its log.
	after func(t *testing.T, logs string)
	// tune, when set, adjusts the app before it serves (runServeWith).
	tune func(*app)
}

// leakGet sends GET / with host through the proxy's plain HTTP listener and
// wants want as the body.
func leakGet(t *testing.T, a *app, host, want string) {
	t.Helper()
	req, _ := http.NewRequest("GET", "http://"+a.httpLn.Addr().String()+"/", nil)
	req.Host = host
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 10 * time.Second}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", host, err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(body) != want {
		t.Fatalf("GET %s: %d %q, want 200 %q", host, resp.StatusCode, body, want)
	}
}

// leakAdmin sends method path with body to the proxy's admin API and wants a 200.
func leakAdmin(t *testing.T, a *app, method, path, body string) {
	t.Helper()
	req, _ := http.NewRequest(method, "http://"+a.adminLn.Addr().String()+path, strings.NewReader(body))
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 10 * time.Second}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("%s %s: %d %s", method, path, resp.StatusCode, b)
	}
}

// silentClients connects to each of addrs and sends nothing, until the
// test ends.
func silentClients(t *testing.T, addrs ...string) {
	t.Helper()
	for _, addr := range addrs {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
	}
}

// trickle writes a byte to c every 50 ms until the test ends or a write fails.
func trickle(t *testing.T, c net.Conn) {
	stop := make(chan struct{})
	done := make(chan struct{})
	t.Cleanup(func() { close(stop); <-done })
	go func() {
		defer close(done)
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				if _, err := c.Write([]byte{'x'}); err != nil {
					return
				}
			}
		}
	}()
}

// noProxyClients waits (bounded: Redis learns of a close when it reads
// it) until Redis lists no connection named as the proxy names its own.
func noProxyClients(t *testing.T, r *testenv.Redis) {
	t.Helper()
	var list string
	deadline := time.Now().Add(5 * time.Second)
	for {
		var err error
		if list, err = r.Client().ClientList(context.Background()).Result(); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(list, " name=cubeproxy ") || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	for _, c := range strings.Split(list, "\n") {
		if strings.Contains(c, " name=cubeproxy ") {
			t.Errorf("Redis still has a connection of the proxy after serve returned: %s", c)
		}
	}
}

// stackOf returns the stacks of the goroutines that have fn in them.
func stackOf(fn string) string {
	var out []string
	for _, g := range goroutines() {
		if strings.Contains(g.stack, fn) {
			out = append(out, g.stack)
		}
	}
	return strings.Join(out, "\n\n")
}

// leakEnv records the servers a case starts for the proxy to connect to
// (sandboxes, a collector): no connection of the proxy to one may be open
// once serve returned.
type leakEnv struct {
	peerPorts []int
}

// sandbox starts a sandbox server with h (sandboxServer) and records it.
func (e *leakEnv) sandbox(t *testing.T, h http.HandlerFunc) int {
	port := sandboxServer(t, h)
	e.peerPorts = append(e.peerPorts, port)
	return port
}

// ok starts a sandbox server answering "ok".
func (e *leakEnv) ok(t *testing.T) int {
	return e.sandbox(t, func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })
}

// Each mode runs serve in-process, carries a little traffic, is stopped,
// and then must have left no goroutine of its own or of the libraries it
// started (certmagic, go-redis, fasthttp, OpenTelemetry, gRPC), no
// descriptor open in its directories and nothing written there afterwards.
// A proxy embedded in a longer-lived process, or tests that remove their
// TempDir, depend on it; in CI a certmagic lock file written after serve
// returned failed a run.
func TestServeLeavesNothingBehind(t *testing.T) {
	cases := map[string]func(t *testing.T, env *leakEnv) leakCase{
		"memory store": func(t *testing.T, env *leakEnv) leakCase {
			port := env.ok(t)
			dir := t.TempDir()
			return leakCase{
				args: []string{"--routes", boxRoutes(t, dir, port)},
				dirs: []string{dir},
				traffic: func(t *testing.T, a *app) {
					leakGet(t, a, fmt.Sprintf("%d-box.cube.test", port), "ok")
					leakAdmin(t, a, "GET", "/admin/routes", "")
				},
			}
		},
		"routes file persisted": func(t *testing.T, env *leakEnv) leakCase {
			port := env.ok(t)
			dir := t.TempDir()
			return leakCase{
				args: []string{"--routes", boxRoutes(t, dir, port), "--persist-routes"},
				dirs: []string{dir},
				traffic: func(t *testing.T, a *app) {
					leakAdmin(t, a, "PUT", "/admin/routes/two", fmt.Sprintf(`{"HostIP":"127.0.0.1","%[1]d":"%[1]d"}`, port))
					leakGet(t, a, fmt.Sprintf("%d-two.cube.test", port), "ok")
					leakAdmin(t, a, "DELETE", "/admin/routes/two", "")
				},
				after: func(t *testing.T, _ string) {
					entries, _ := os.ReadDir(dir)
					var names []string
					for _, e := range entries {
						names = append(names, e.Name())
					}
					if !slices.Equal(names, []string{"routes.yaml"}) {
						t.Errorf("routes directory holds %v, want only routes.yaml", names)
					}
				},
			}
		},
		"redis store": func(t *testing.T, env *leakEnv) leakCase {
			r := testenv.StartRedis(t)
			port := env.ok(t)
			hsetRoute(t, r, redisstore.DefaultKeyPrefix+"box", cpFields("127.0.0.1", "192.168.0.2", port)...)
			return leakCase{
				args:    []string{"--store", "redis", "--redis-addr", r.Addr(), "--registry-enabled", "--registry-interval", "100ms"},
				traffic: redisLeakTraffic,
				after:   func(t *testing.T, _ string) { noProxyClients(t, r) },
			}
		},
		"redis hung from the start": func(t *testing.T, env *leakEnv) leakCase {
			r := testenv.StartRedis(t)
			f := startFreezer(t, r.Addr())
			env.peerPorts = append(env.peerPorts, f.ln.Addr().(*net.TCPAddr).Port)
			f.freeze()
			return leakCase{
				// The default command timeout (1 s): the start, the request
				// and the stop each wait out one, 2 s each with the 2 s this
				// case had; nothing here needs Redis to answer in time.
				args: []string{"--store", "redis", "--redis-addr", f.addr(), "--redis-command-timeout", "1s", "--registry-enabled"},
				traffic: func(t *testing.T, a *app) {
					// The readiness probe, the subscriber and a request's
					// lookup all wait on the Redis that hangs.
					client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 10 * time.Second}
					req, _ := http.NewRequest("GET", "http://"+a.httpLn.Addr().String()+"/", nil)
					req.Host = "1-box.cube.test"
					if resp, err := client.Do(req); err == nil {
						resp.Body.Close()
					}
				},
				after: func(t *testing.T, _ string) { noProxyClients(t, r) },
			}
		},
		"redis sentinel": func(t *testing.T, env *leakEnv) leakCase {
			primary := testenv.StartRedis(t)
			sentinel := testenv.StartSentinel(t, "cube-routes", primary.Addr())
			port := env.ok(t)
			hsetRoute(t, primary, redisstore.DefaultKeyPrefix+"box", cpFields("127.0.0.1", "192.168.0.2", port)...)
			return leakCase{
				args: []string{"--store", "redis", "--redis-sentinel-addrs", sentinel.Addr(), "--redis-sentinel-master-name", "cube-routes",
					"--registry-enabled", "--registry-interval", "100ms"},
				traffic: redisLeakTraffic,
				after: func(t *testing.T, _ string) {
					noProxyClients(t, primary)
					noProxyClients(t, sentinel)
				},
			}
		},
		"redis hung at shutdown": func(t *testing.T, env *leakEnv) leakCase {
			r := testenv.StartRedis(t)
			f := startFreezer(t, r.Addr())
			env.peerPorts = append(env.peerPorts, f.ln.Addr().(*net.TCPAddr).Port)
			port := env.ok(t)
			hsetRoute(t, r, redisstore.DefaultKeyPrefix+"box", cpFields("127.0.0.1", "192.168.0.2", port)...)
			return leakCase{
				args: []string{"--store", "redis", "--redis-addr", f.addr(), "--redis-command-timeout", "2s",
					"--registry-enabled", "--registry-interval", "50ms"},
				traffic: func(t *testing.T, a *app) {
					redisLeakTraffic(t, a)
					f.freeze()
					// A heartbeat is on the wire to the Redis that hangs.
					testenv.WaitFor(t, 5*time.Second, "a heartbeat stuck", func() bool {
						return goroutinesIn("redisstore.(*Registry).beat") > 0 &&
							strings.Contains(stackOf("redisstore.(*Registry).beat"), "go-redis")
					})
				},
				after: func(t *testing.T, _ string) { noProxyClients(t, r) },
			}
		},
		"tls files": func(t *testing.T, env *leakEnv) leakCase {
			ca := testenv.NewCA(t, "cubeproxy test CA")
			dir := t.TempDir()
			certFile, keyFile := filepath.Join(dir, "c.pem"), filepath.Join(dir, "k.pem")
			ca.WritePair(t, certFile, keyFile, "cube.test", "*.cube.test")
			port := env.ok(t)
			return leakCase{
				args: []string{"--routes", boxRoutes(t, dir, port), "--https-addr", "127.0.0.1:0", "--tls-redirect-http",
					"--tls-source", "files", "--tls-cert-file", certFile, "--tls-key-file", keyFile, "--tls-reload-interval", "20ms"},
				dirs: []string{dir},
				traffic: func(t *testing.T, a *app) {
					// A client connected to each listener and silent, the
					// redirect listener's among them.
					silentClients(t, a.httpLn.Addr().String(), a.httpsLn.Addr().String(), a.adminLn.Addr().String())
					host := fmt.Sprintf("%d-box.cube.test", port)
					c, err := dialTLSProxy(a.httpsLn.Addr().String(), trustSNI(ca.Pool(), host))
					if err != nil {
						t.Fatal(err)
					}
					defer c.close()
					if status, body, err := c.get(host, "/"); err != nil || status != 200 || body != "ok" {
						t.Fatalf("over TLS: %d %q %v", status, body, err)
					}
				},
			}
		},
		"acme on demand": func(t *testing.T, env *leakEnv) leakCase {
			return acmeLeakCase(t, env, "    skip_wildcard: true\n    on_demand: true\n", true)
		},
		"acme wildcard stopped while obtaining": func(t *testing.T, env *leakEnv) leakCase {
			return acmeLeakCase(t, env, "", false)
		},
		"access log file and SIGHUP": func(t *testing.T, env *leakEnv) leakCase {
			port := env.ok(t)
			dir := t.TempDir()
			logPath := filepath.Join(dir, "access.log")
			return leakCase{
				args: []string{"--routes", boxRoutes(t, dir, port), "--access-log-format", "cube", "--access-log-path", logPath},
				dirs: []string{dir},
				traffic: func(t *testing.T, a *app) {
					host := fmt.Sprintf("%d-box.cube.test", port)
					leakGet(t, a, host, "ok")
					if err := os.Rename(logPath, logPath+".1"); err != nil {
						t.Fatal(err)
					}
					if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
						t.Fatal(err)
					}
					testenv.WaitFor(t, 10*time.Second, "the reopened access log", func() bool {
						_, err := os.Stat(logPath)
						return err == nil
					})
					leakGet(t, a, host, "ok")
				},
			}
		},
		"access log stalled": func(t *testing.T, env *leakEnv) leakCase {
			// A FIFO whose pipe is full and that nobody reads: the access
			// log's writer blocks on its first line, and serve gives up
			// on it after its budget at exit.
			port := env.ok(t)
			dir := t.TempDir()
			fifo, rd := testenv.StalledFIFO(t, dir, "access.fifo")
			return leakCase{
				args: []string{"--routes", boxRoutes(t, dir, port), "--access-log-format", "cube", "--access-log-path", fifo},
				dirs: []string{dir},
				traffic: func(t *testing.T, a *app) {
					// The proxy holds both ends of the FIFO: the pipe stays
					// full without the test's reader.
					rd.Close()
					leakGet(t, a, fmt.Sprintf("%d-box.cube.test", port), "ok")
					// logrotate's SIGHUP: its reopen waits for the stalled
					// writer until the stop.
					if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
						t.Fatal(err)
					}
					testenv.WaitFor(t, 5*time.Second, "a reopen waiting on the stalled sink", a.reopening.Load)
				},
				tune: shortFlush,
				after: func(t *testing.T, logs string) {
					// The stop came first: no reopen failed.
					if strings.Contains(logs, `"msg":"reopen access log"`) {
						t.Errorf("the reopen the stop refused was logged as failed:\n%s", logs)
					}
				},
			}
		},
		"otel http exporter": func(t *testing.T, env *leakEnv) leakCase {
			// Not recorded as a sandbox: the exporter keeps its idle
			// connection to the collector in otlptracehttp's package-wide
			// Transport, which its Shutdown leaves open (up to its 90 s
			// idle timeout) and which no option reaches without giving up
			// the OTEL_EXPORTER_OTLP_* TLS settings the exporter applies.
			collector := sandboxServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				io.Copy(io.Discard, r.Body)
				w.Header().Set("Content-Type", "application/x-protobuf")
			}))
			t.Setenv("OTEL_TRACES_EXPORTER", "otlp")
			t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", fmt.Sprintf("http://127.0.0.1:%d", collector))
			t.Setenv("OTEL_TRACES_SAMPLER", "always_on")
			t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "10")
			port := env.ok(t)
			dir := t.TempDir()
			return leakCase{
				args: []string{"--routes", boxRoutes(t, dir, port)},
				traffic: func(t *testing.T, a *app) {
					leakGet(t, a, fmt.Sprintf("%d-box.cube.test", port), "ok")
				},
			}
		},
		"otel grpc exporter": func(t *testing.T, env *leakEnv) leakCase {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			srv := grpc.NewServer()
			exported := make(chan struct{}, 1)
			coltracepb.RegisterTraceServiceServer(srv, leakCollector{got: exported})
			go srv.Serve(ln)
			t.Cleanup(srv.Stop)
			env.peerPorts = append(env.peerPorts, ln.Addr().(*net.TCPAddr).Port)
			t.Setenv("OTEL_TRACES_EXPORTER", "otlp")
			t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
			t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://"+ln.Addr().String())
			t.Setenv("OTEL_EXPORTER_OTLP_INSECURE", "true")
			t.Setenv("OTEL_TRACES_SAMPLER", "always_on")
			t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "10")
			port := env.ok(t)
			dir := t.TempDir()
			return leakCase{
				args: []string{"--routes", boxRoutes(t, dir, port)},
				traffic: func(t *testing.T, a *app) {
					leakGet(t, a, fmt.Sprintf("%d-box.cube.test", port), "ok")
					select {
					case <-exported:
					case <-time.After(10 * time.Second):
						t.Fatal("no span exported over gRPC")
					}
				},
			}
		},
		"lingering closes": func(t *testing.T, env *leakEnv) leakCase {
			// A sandbox that ends its WebSocket session at once, cleanly.
			wsPort := env.sandbox(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if c, err := websocket.Accept(w, r, nil); err == nil {
					c.CloseNow()
				}
			}))
			dir := t.TempDir()
			return leakCase{
				args: []string{"--routes", boxRoutes(t, dir, wsPort)},
				traffic: func(t *testing.T, a *app) {
					proxyAddr := a.httpLn.Addr().String()
					// The proxy answers each and then reads what the
					// client still sends before it closes (a lingering
					// close, as nginx's): the rest of an upload it
					// refused, the client's side of a tunnel whose
					// sandbox left. These clients keep sending.
					for _, head := range []string{
						// fasthttp reads the first 8 KiB of a body before the handler.
						"POST / HTTP/1.1\r\nHost: 1-nobody.cube.test\r\nContent-Length: 1000000\r\n\r\n" + strings.Repeat("x", 16<<10),
						fmt.Sprintf("GET / HTTP/1.1\r\nHost: %d-box.cube.test\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"+
							"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n", wsPort),
					} {
						c, err := net.Dial("tcp", proxyAddr)
						if err != nil {
							t.Fatal(err)
						}
						_ = c.SetDeadline(time.Now().Add(10 * time.Second))
						t.Cleanup(func() { c.Close() })
						if _, err := io.WriteString(c, head); err != nil {
							t.Fatal(err)
						}
						line, err := bufio.NewReader(c).ReadString('\n')
						if err != nil {
							t.Fatalf("answer to %q: %v", head, err)
						}
						if !strings.HasPrefix(line, "HTTP/1.1 404") && !strings.HasPrefix(line, "HTTP/1.1 101") {
							t.Fatalf("answer to %q: %q", head, line)
						}
						trickle(t, c)
					}
				},
			}
		},
		"streams cut by the drain": func(t *testing.T, env *leakEnv) leakCase {
			release := make(chan struct{})
			t.Cleanup(func() { close(release) })
			wsPort := env.sandbox(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				c, err := websocket.Accept(w, r, nil)
				if err != nil {
					return
				}
				defer c.CloseNow()
				for {
					typ, msg, err := c.Read(r.Context())
					if err != nil || c.Write(r.Context(), typ, msg) != nil {
						return
					}
				}
			}))
			ssePort := env.sandbox(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "text/event-stream")
				io.WriteString(w, "data: one\n\n")
				w.(http.Flusher).Flush()
				select {
				case <-r.Context().Done():
				case <-release:
				}
			}))
			slowPort := env.sandbox(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(200)
				io.WriteString(w, "partial")
				w.(http.Flusher).Flush()
				select {
				case <-r.Context().Done():
				case <-release:
				}
			}))
			dir := t.TempDir()
			routes := filepath.Join(dir, "routes.yaml")
			body := fmt.Sprintf("routes:\n  box:\n    HostIP: \"127.0.0.1\"\n    \"%[1]d\": \"%[1]d\"\n    \"%[2]d\": \"%[2]d\"\n    \"%[3]d\": \"%[3]d\"\n", wsPort, ssePort, slowPort)
			if err := os.WriteFile(routes, []byte(body), 0o600); err != nil {
				t.Fatal(err)
			}
			return leakCase{
				args: []string{"--routes", routes, "--drain-timeout", "300ms", "--access-log-format", "json", "--access-log-path", filepath.Join(dir, "access.log")},
				dirs: []string{dir},
				traffic: func(t *testing.T, a *app) {
					proxyAddr := a.httpLn.Addr().String()
					ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
					defer cancel()
					ws, _, err := websocket.Dial(ctx, "ws://"+proxyAddr+"/", &websocket.DialOptions{Host: fmt.Sprintf("%d-box.cube.test", wsPort)})
					if err != nil {
						t.Fatalf("websocket through the proxy: %v", err)
					}
					t.Cleanup(func() { ws.CloseNow() })
					if err := ws.Write(ctx, websocket.MessageText, []byte("ping")); err != nil {
						t.Fatal(err)
					}
					if _, msg, err := ws.Read(ctx); err != nil || string(msg) != "ping" {
						t.Fatalf("echo: %q %v", msg, err)
					}
					for _, p := range []int{ssePort, slowPort} {
						c, err := net.Dial("tcp", proxyAddr)
						if err != nil {
							t.Fatal(err)
						}
						_ = c.SetDeadline(time.Now().Add(10 * time.Second))
						t.Cleanup(func() { c.Close() })
						fmt.Fprintf(c, "GET /events HTTP/1.1\r\nHost: %d-box.cube.test\r\nAccept: text/event-stream\r\n\r\n", p)
						// The stream's first bytes have come through: it is open.
						if _, err := bufio.NewReader(c).ReadString('\n'); err != nil {
							t.Fatal(err)
						}
					}
					// A client connected to each listener and silent.
					silentClients(t, proxyAddr, a.adminLn.Addr().String())
				},
			}
		},
	}
	names := make([]string, 0, len(cases))
	for name := range cases {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		t.Run(name, func(t *testing.T) {
			env := &leakEnv{}
			tc := cases[name](t, env)
			before := goroutineIDs()
			args := append([]string{"--http-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0", "--domains", "cube.test", "--drain-timeout", "1s"}, tc.args...)
			r := runServeWith(t, args, noEnv, nil, tc.tune)
			addrs := []string{r.a.httpLn.Addr().String(), r.a.adminLn.Addr().String()}
			if r.a.httpsLn != nil {
				addrs = append(addrs, r.a.httpsLn.Addr().String())
			}
			tc.traffic(t, r.a)
			r.stop()
			if t.Failed() {
				return
			}

			// Bounded: what is stopping may take a moment to unwind, but
			// serve has returned, so nothing of it may be left after that.
			leaked := leakedAfter(before, 5*time.Second)
			if len(leaked) > 0 {
				t.Errorf("%d goroutines of serve still run 5 s after it returned:\n\n%s", len(leaked), strings.Join(leaked, "\n\n"))
			}
			state := treeState(t, tc.dirs)
			if open := openUnder(tc.dirs); len(open) > 0 {
				t.Errorf("descriptors still open in the proxy's directories after serve returned: %v", open)
			}
			for _, addr := range addrs {
				ln, err := net.Listen("tcp", addr)
				if err == nil {
					ln.Close()
					continue
				}
				// The freed port may have gone to another socket since,
				// on a machine that runs other tests: only a listener of
				// this process on it is the proxy's, left open.
				_, p, _ := net.SplitHostPort(addr)
				if n, _ := strconv.Atoi(p); listeners(t) == nil || listeners(t)[n] {
					t.Errorf("listener %s still open after serve returned: %v", addr, err)
				}
			}
			// No client connection the proxy accepted, nor one it opened
			// to a sandbox, is open (the test's own ends are its clients').
			proxyPorts := map[int]bool{}
			for _, addr := range addrs {
				_, p, _ := net.SplitHostPort(addr)
				n, _ := strconv.Atoi(p)
				proxyPorts[n] = true
			}
			for _, sk := range sockets(t) {
				if proxyPorts[sk.local] || slices.Contains(env.peerPorts, sk.remote) {
					t.Errorf("a connection of the proxy is still open after serve returned: port %d -> %d", sk.local, sk.remote)
				}
			}
			if tc.after != nil {
				tc.after(t, r.logs.String())
			}
			// With no goroutine of the proxy left, nothing writes there
			// any more: the listing taken above must hold.
			if now := treeState(t, tc.dirs); !slices.Equal(now, state) {
				t.Errorf("the proxy's directories changed after serve returned:\nthen %v\nnow  %v", state, now)
			}
		})
	}
}

// acmeLeakCase runs the acme source against pebble with extra lines
// under tls.acme; with handshake, traffic obtains a certificate through a
// handshake (on demand), without it the proxy is stopped while the
// wildcard may still be on order.
func acmeLeakCase(t *testing.T, env *leakEnv, extra string, handshake bool) leakCase {
	dnsSrv := testenv.StartDNS(t, "cube.test")
	pb := testenv.StartPebble(t, dnsSrv.Addr)
	port := env.ok(t)
	dir := t.TempDir()
	section := acmeTLSSection(t, pb, dnsSrv, extra)
	m := regexp.MustCompile(`storage_dir: (".*")`).FindStringSubmatch(section)
	storage, err := strconv.Unquote(m[1])
	if err != nil {
		t.Fatal(err)
	}
	cfgPath := filepath.Join(dir, "cubeproxy.yaml")
	y := fmt.Sprintf("routes: %q\n%s", boxRoutes(t, dir, port), section)
	if err := os.WriteFile(cfgPath, []byte(y), 0o600); err != nil {
		t.Fatal(err)
	}
	return leakCase{
		args: []string{"--config", cfgPath, "--https-addr", "127.0.0.1:0"},
		dirs: []string{dir, storage},
		traffic: func(t *testing.T, a *app) {
			if !handshake {
				return
			}
			host := fmt.Sprintf("%d-box.cube.test", port)
			c, err := dialTLSProxy(a.httpsLn.Addr().String(), trustSNI(pb.IssuerRootPool(t), host))
			if err != nil {
				t.Fatal(err)
			}
			defer c.close()
			if status, body, err := c.get(host, "/"); err != nil || status != 200 || body != "ok" {
				t.Fatalf("over TLS: %d %q %v", status, body, err)
			}
		},
		after: func(t *testing.T, _ string) {
			locks, _ := filepath.Glob(filepath.Join(storage, "locks", "*"))
			if len(locks) > 0 {
				t.Errorf("lock files left in the ACME storage: %v", locks)
			}
		},
	}
}

// A start that fails once most of the proxy is up (here its admin port
// is taken: the listeners open after the store, the access log,
// telemetry, the certificates and the Redis subscriber have started)
// stops all of it before serve returns its error.
func TestFailedServeLeavesNothingBehind(t *testing.T) {
	held, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	cases := map[string]func(t *testing.T) []string{
		"memory store, tls files, access log file": func(t *testing.T) []string {
			ca := testenv.NewCA(t, "cubeproxy test CA")
			dir := t.TempDir()
			certFile, keyFile := filepath.Join(dir, "c.pem"), filepath.Join(dir, "k.pem")
			ca.WritePair(t, certFile, keyFile, "cube.test", "*.cube.test")
			return []string{"--routes", boxRoutes(t, dir, 1), "--persist-routes", "--https-addr", "127.0.0.1:0",
				"--tls-source", "files", "--tls-cert-file", certFile, "--tls-key-file", keyFile, "--tls-reload-interval", "20ms",
				"--access-log-format", "cube", "--access-log-path", filepath.Join(dir, "access.log")}
		},
		"redis store, acme": func(t *testing.T) []string {
			r := testenv.StartRedis(t)
			dnsSrv := testenv.StartDNS(t, "cube.test")
			pb := testenv.StartPebble(t, dnsSrv.Addr)
			dir := t.TempDir()
			cfgPath := filepath.Join(dir, "cubeproxy.yaml")
			if err := os.WriteFile(cfgPath, []byte(acmeTLSSection(t, pb, dnsSrv, "    on_demand: true\n")), 0o600); err != nil {
				t.Fatal(err)
			}
			return []string{"--config", cfgPath, "--https-addr", "127.0.0.1:0", "--store", "redis", "--redis-addr", r.Addr(), "--registry-enabled"}
		},
	}
	for name, args := range cases {
		t.Run(name, func(t *testing.T) {
			args := append(args(t), "--http-addr", "127.0.0.1:0", "--admin-addr", held.Addr().String(), "--domains", "cube.test")
			before := goroutineIDs()
			var logs syncBuffer
			if err := serve(context.Background(), args, noEnv, &logs, &logs, nil); err == nil || !strings.Contains(err.Error(), "admin_addr") {
				t.Fatalf("serve: %v, want the admin listener's error\n%s", err, &logs)
			}
			leaked := leakedAfter(before, 5*time.Second)
			if len(leaked) > 0 {
				t.Errorf("%d goroutines of the failed serve still run 5 s after it returned:\n\n%s\n%s", len(leaked), strings.Join(leaked, "\n\n"), &logs)
			}
		})
	}
}

// leakCollector is an OTLP/gRPC trace collector that says when it got an export.
type leakCollector struct {
	coltracepb.UnimplementedTraceServiceServer
	got chan struct{}
}

func (c leakCollector) Export(context.Context, *coltracepb.ExportTraceServiceRequest) (*coltracepb.ExportTraceServiceResponse, error) {
	select {
	case c.got <- struct{}{}:
	default:
	}
	return &coltracepb.ExportTraceServiceResponse{}, nil
}
