package main

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// The real binary at its RLIMIT_NOFILE (a flood of idle clients, a node
// whose limit was left at 1024): it keeps running without spinning, logs
// the condition once, counts every failed accept, and serves the clients
// that waited in the listen backlog once descriptors free up. fasthttp
// took EMFILE for a permanent accept error and the process drained and
// exited. A client already connected meanwhile gets a 503 that names the
// proxy, not a 502 blaming the sandbox for the proxy's failed dial.
func TestBinarySurvivesFDExhaustion(t *testing.T) {
	// Parallel: the limits it lowers are the child's (prlimit), not this
	// process's; it waits on that child and its own sockets.
	t.Parallel()
	bin := buildBinary(t)
	backend := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "ok")
	})}
	bln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	backend.SetKeepAlivesEnabled(false) // each request needs a new sandbox connection
	go backend.Serve(bln)
	defer backend.Close()
	port := bln.Addr().(*net.TCPAddr).Port
	host := fmt.Sprintf("%d-box.cube.test", port)
	routes := boxRoutes(t, t.TempDir(), port)
	cmd, logs, exited, proxyAddr, adminAddr := startFDBinary(t, bin, routes)
	pid := cmd.Process.Pid

	// A keep-alive client connected (and accepted) before the limit.
	early, err := net.Dial("tcp", proxyAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer early.Close()
	earlyR := bufio.NewReader(early)
	get := func() (*http.Response, string) {
		t.Helper()
		early.SetDeadline(time.Now().Add(5 * time.Second))
		fmt.Fprintf(early, "GET / HTTP/1.1\r\nHost: %s\r\n\r\n", host)
		resp, err := http.ReadResponse(earlyR, nil)
		if err != nil {
			t.Fatalf("keep-alive request: %v\n%s", err, logs.String())
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp, string(body)
	}
	if resp, _ := get(); resp.StatusCode != 200 {
		t.Fatalf("before the limit: status %d", resp.StatusCode)
	}

	idle := fillDescriptors(t, pid, proxyAddr, 4, 20, func(n uint64) { setNoFile(t, pid, n) })
	deadline := time.Now().Add(5 * time.Second)
	for !strings.Contains(logs.String(), "cannot accept connections") {
		select {
		case err := <-exited:
			t.Fatalf("proxy exited at its descriptor limit: %v\n%s", err, logs.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("descriptor exhaustion not logged\n%s", logs.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	// Waiting, not spinning on a listening socket that stays readable.
	before := cpuTicks(t, pid)
	time.Sleep(time.Second)
	if used := cpuTicks(t, pid) - before; used > 30 {
		t.Errorf("%d clock ticks of CPU in 1s while out of descriptors", used)
	}
	select {
	case err := <-exited:
		t.Fatalf("proxy exited at its descriptor limit: %v\n%s", err, logs.String())
	default:
	}

	for range 5 {
		resp, body := get()
		if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" ||
			!strings.Contains(body, `"code":"proxy_out_of_resources"`) {
			t.Errorf("out of descriptors: status %d, Retry-After %q, %s; want 503 proxy_out_of_resources with Retry-After",
				resp.StatusCode, resp.Header.Get("Retry-After"), body)
		}
	}

	// The line reaches logs through a pipe and a copying goroutine, which a
	// loaded test machine may run after the answers arrived.
	testenv.WaitFor(t, 10*time.Second, `"cannot connect to sandboxes" in the logs`, func() bool {
		return strings.Contains(logs.String(), "cannot connect to sandboxes")
	})
	if n := strings.Count(logs.String(), "cannot connect to sandboxes"); n != 1 {
		t.Errorf("5 failed dials logged %d times, want once\n%s", n, logs.String())
	}

	// The backlog of closed clients is accepted and closed one by one;
	// until then a dial may still find no descriptor.
	for _, c := range idle {
		c.Close()
	}
	client := &http.Client{Timeout: 10 * time.Second}
	deadline = time.Now().Add(10 * time.Second)
	for {
		req, _ := http.NewRequest("GET", "http://"+proxyAddr+"/", nil)
		req.Host = host
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("after descriptors freed up: %v\n%s", err, logs.String())
		}
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after descriptors freed up: status %d, want 200\n%s", resp.StatusCode, logs.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	if n := scrapeMetric(adminAddr, "cubeproxy_upstream_connect_errors_total"); n != 0 {
		t.Errorf("the proxy's own exhaustion counted as %v sandbox connect errors", n)
	}
	if n := scrapeMetric(adminAddr, "cubeproxy_accept_errors_total"); n < 1 {
		t.Errorf("cubeproxy_accept_errors_total = %v, want > 0", n)
	}
	// The recovery is logged behind the accept that served the answer
	// (the process log is queued, then piped): read the log once the
	// process has exited, when cmd.Wait has copied all of it.
	sigtermAndWait(t, cmd, exited, logs)
	if n := strings.Count(logs.String(), "cannot accept connections"); n != 1 {
		t.Errorf("exhaustion logged %d times, want once\n%s", n, logs.String())
	}
	if !strings.Contains(logs.String(), "accepting connections again") {
		t.Errorf("recovery not logged\n%s", logs.String())
	}
}

// A node at its descriptor limit whose idle sandbox connections hold
// descriptors (one pool per sandbox, each keeping its connections for
// upstream.idle_conn_timeout): a request for another sandbox closes idle
// ones and is served. It got 503 proxy_out_of_resources while the idle
// connections, a mere cache of a connect, kept their descriptors.
func TestBinaryShedsIdleSandboxConnsAtFDLimit(t *testing.T) {
	// Parallel: the limits it lowers are the child's (prlimit), not this
	// process's; it waits on that child and its own sockets.
	t.Parallel()
	bin := buildBinary(t)
	var routes strings.Builder
	routes.WriteString("routes:\n")
	for i := range 4 {
		port := sandboxServer(t, func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })
		fmt.Fprintf(&routes, "  s%d:\n    HostIP: \"127.0.0.1\"\n    \"8080\": \"%d\"\n", i, port)
	}
	routesFile := filepath.Join(t.TempDir(), "routes.yaml")
	if err := os.WriteFile(routesFile, []byte(routes.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd, logs, exited, proxyAddr, _ := startFDBinary(t, bin, routesFile)
	pid := cmd.Process.Pid

	client, err := net.Dial("tcp", proxyAddr) // accepted before the limit
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	br := bufio.NewReader(client)
	get := func(sandbox int) (int, string) {
		t.Helper()
		client.SetDeadline(time.Now().Add(5 * time.Second))
		fmt.Fprintf(client, "GET / HTTP/1.1\r\nHost: 8080-s%d.cube.test\r\n\r\n", sandbox)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("request to s%d: %v\n%s", sandbox, err, logs.String())
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp.StatusCode, string(body)
	}
	// Three pools with an idle connection each.
	for i := range 3 {
		if status, body := get(i); status != 200 {
			t.Fatalf("s%d before the limit: %d %s", i, status, body)
		}
	}

	fillDescriptors(t, pid, proxyAddr, 4, 20, func(n uint64) { setNoFile(t, pid, n) })
	testenv.WaitFor(t, 5*time.Second, `"cannot accept connections" in the logs`, func() bool {
		return strings.Contains(logs.String(), "cannot accept connections")
	})

	if status, body := get(3); status != 200 || body != "ok" {
		t.Fatalf("a new sandbox at the descriptor limit, with idle sandbox connections open: %d %s; want 200\n%s", status, body, logs.String())
	}
	sigtermAndWait(t, cmd, exited, logs)
}

// The other way out of descriptor exhaustion: the operator raises the
// limit of the running process (prlimit) while every client that used up
// the old one stays connected. The listener's retry picks the new limit
// up by itself, within its 1 s back-off, and the proxy serves new clients
// with no restart.
func TestBinaryRecoversWhenFDLimitRaised(t *testing.T) {
	// Parallel: the limits it lowers are the child's (prlimit), not this
	// process's; it waits on that child and its own sockets.
	t.Parallel()
	bin := buildBinary(t)
	port := sandboxServer(t, func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })
	routes := boxRoutes(t, t.TempDir(), port)
	cmd, logs, exited, proxyAddr, adminAddr := startFDBinary(t, bin, routes)
	pid := cmd.Process.Pid

	var lim syscall.Rlimit
	getNoFile(t, pid, &lim)
	// The soft limit only: raising it back needs no privilege.
	fillDescriptors(t, pid, proxyAddr, 2, 10, func(n uint64) { setNoFileSoft(t, pid, n, lim.Max) })
	testenv.WaitFor(t, 5*time.Second, `"cannot accept connections" in the logs`, func() bool {
		return strings.Contains(logs.String(), "cannot accept connections")
	})

	setNoFileSoft(t, pid, lim.Cur, lim.Max)
	client := &http.Client{Timeout: 5 * time.Second}
	req, _ := http.NewRequest("GET", "http://"+proxyAddr+"/", nil)
	req.Host = fmt.Sprintf("%d-box.cube.test", port)
	resp, err := client.Do(req) // waits in the backlog until the next retry
	if err != nil {
		t.Fatalf("after the limit was raised: %v\n%s", err, logs.String())
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("after the limit was raised: status %d, want 200\n%s", resp.StatusCode, logs.String())
	}
	testenv.WaitFor(t, 5*time.Second, `"accepting connections again" in the logs`, func() bool {
		return strings.Contains(logs.String(), "accepting connections again")
	})
	if n := scrapeMetric(adminAddr, "cubeproxy_accept_errors_total"); n < 1 {
		t.Errorf("cubeproxy_accept_errors_total = %v, want > 0", n)
	}
	sigtermAndWait(t, cmd, exited, logs)
}

// fillDescriptors takes every descriptor the proxy at pid may open:
// setLimit sets its limit to headroom above what it holds now, and n
// clients connect, which the accept loop takes (filling the headroom and
// any hole below it) until it fails. The clients are returned and closed
// when the test ends.
func fillDescriptors(t *testing.T, pid int, proxyAddr string, headroom, n int, setLimit func(uint64)) []net.Conn {
	t.Helper()
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Fatalf("no /proc: %v", err)
	}
	setLimit(uint64(len(fds) + headroom))
	var clients []net.Conn
	t.Cleanup(func() {
		for _, c := range clients {
			c.Close()
		}
	})
	for range n {
		c, err := net.Dial("tcp", proxyAddr) // completes in the backlog
		if err != nil {
			t.Fatal(err)
		}
		clients = append(clients, c)
	}
	return clients
}

// getNoFile reads another process's RLIMIT_NOFILE (prlimit(2)).
func getNoFile(t *testing.T, pid int, lim *syscall.Rlimit) {
	t.Helper()
	if _, _, e := syscall.RawSyscall6(syscall.SYS_PRLIMIT64, uintptr(pid), syscall.RLIMIT_NOFILE,
		0, uintptr(unsafe.Pointer(lim)), 0, 0); e != 0 {
		t.Fatalf("prlimit: %v", e)
	}
}

// setNoFileSoft sets another process's RLIMIT_NOFILE to cur, keeping max.
func setNoFileSoft(t *testing.T, pid int, cur, max uint64) {
	t.Helper()
	lim := syscall.Rlimit{Cur: cur, Max: max}
	if _, _, e := syscall.RawSyscall6(syscall.SYS_PRLIMIT64, uintptr(pid), syscall.RLIMIT_NOFILE,
		uintptr(unsafe.Pointer(&lim)), 0, 0, 0); e != 0 {
		t.Fatalf("prlimit: %v", e)
	}
}

// setNoFile lowers another process's RLIMIT_NOFILE (prlimit(2)).
func setNoFile(t *testing.T, pid int, n uint64) {
	t.Helper()
	lim := syscall.Rlimit{Cur: n, Max: n}
	if _, _, e := syscall.RawSyscall6(syscall.SYS_PRLIMIT64, uintptr(pid), syscall.RLIMIT_NOFILE,
		uintptr(unsafe.Pointer(&lim)), 0, 0, 0); e != 0 {
		t.Fatalf("prlimit: %v", e)
	}
}

// cpuTicks is a process's user + system CPU time in clock ticks.
func cpuTicks(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	// Fields after the command name, which is in parentheses.
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+2:]))
	u, _ := strconv.ParseInt(f[11], 10, 64)
	s, _ := strconv.ParseInt(f[12], 10, 64)
	return u + s
}

// The health probes at the descriptor limit: the admin listener keeps a
// reserve of descriptors it spends on its own accepts, so /admin/healthz
// (the liveness probe) and /readyz answer while clients have used up
// every other descriptor, one connection after another. Without it the
// admin accept failed like the traffic one and the probes timed out: a
// liveness probe then restarted the pod, cutting every open stream of a
// proxy that was serving them and would have recovered by itself.
func TestBinaryAdminAnswersAtFDLimit(t *testing.T) {
	// Parallel: the limits it lowers are the child's (prlimit), not this
	// process's; it waits on that child and its own sockets.
	t.Parallel()
	bin := buildBinary(t)
	port := sandboxServer(t, func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })
	routes := boxRoutes(t, t.TempDir(), port)
	cmd, logs, exited, proxyAddr, adminAddr := startFDBinary(t, bin, routes)
	pid := cmd.Process.Pid

	fillDescriptors(t, pid, proxyAddr, 4, 20, func(n uint64) { setNoFile(t, pid, n) })
	testenv.WaitFor(t, 5*time.Second, `"cannot accept connections" in the logs`, func() bool {
		return strings.Contains(logs.String(), "cannot accept connections")
	})

	// A new connection each time, as kubelet's probes make; more of them
	// than the reserve holds, so each must give its descriptor back.
	for i := range 12 {
		for _, path := range []string{"/admin/healthz", "/readyz"} {
			client := &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
			resp, err := client.Get("http://" + adminAddr + path)
			if err != nil {
				t.Fatalf("probe %d %s at the descriptor limit: %v\n%s", i, path, err, logs.String())
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("probe %d %s at the descriptor limit: status %d, want 200", i, path, resp.StatusCode)
			}
		}
	}
	sigtermAndWait(t, cmd, exited, logs)
}

// startFDBinary runs bin on the routes file routes, its access log off and
// its drain 1 s, as the descriptor-limit tests run it, and returns once it
// listens, with the addresses of its traffic and admin listeners.
func startFDBinary(t *testing.T, bin, routes string) (cmd *exec.Cmd, logs *syncBuffer, exited <-chan error, proxyAddr, adminAddr string) {
	t.Helper()
	cmd, logs, exited = startBinary(t, bin, "serve", "--http-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0", "--routes", routes,
		"--access-log-format", "off", "--drain-timeout", "1s")
	proxyAddr, adminAddr = waitListening(t, logs, exited)
	return cmd, logs, exited, proxyAddr, adminAddr
}
