package proxy

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// A sandbox connection the proxy cannot open for want of its own
// descriptors is a 503 proxy_out_of_resources, counted in
// cubeproxy_upstream_resource_errors_total and not among the sandbox's
// connect errors: an alert on the one must not send the operator to the
// sandboxes. The descriptor limit is the process's, so the test lowers it
// in a child process of its own.
func TestDialShortageCountedApart(t *testing.T) {
	if os.Getenv("CUBE_TEST_FD_CHILD") != "1" {
		t.Parallel() // the parent only waits for its child process
		runFDChild(t)
		return
	}
	tel := obsTelemetry(t, nil)
	h := newHarness(t, func(o *harnessOpts) { o.cfg.Telemetry = tel })
	admin := obsMetricsAdmin(t, h, tel)
	port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
	host := h.route("fdshort", port)
	// A client connection the proxy has accepted (it answered on it)
	// while descriptors were left, and no sandbox connection yet.
	c := dialRaw(t, h.addr)
	br := bufio.NewReader(c)
	io.WriteString(c, "GET / HTTP/1.1\r\nHost: 50005-fdnone.cube.test\r\n\r\n")
	warm, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, warm.Body)
	if warm.StatusCode != 404 || warm.Close {
		t.Fatalf("unknown sandbox: %d (close %v), want 404 on a kept connection", warm.StatusCode, warm.Close)
	}

	resp := askAtFDLimit(t, c, br, host)
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 503 || !strings.Contains(string(b), CodeOutOfResources) {
		t.Fatalf("got %d %s, want 503 %s", resp.StatusCode, b, CodeOutOfResources)
	}
	// The README's 503 row: a shortage passes, so the client is told when
	// to come back, as for the sandbox's own 503s.
	if ra := resp.Header.Get("Retry-After"); ra != "1" {
		t.Errorf("Retry-After %q, want 1", ra)
	}
	samples := scrapeMetrics(t, admin)
	if v, _ := metricValue(samples, "cubeproxy_upstream_resource_errors_total", nil); v != 1 {
		t.Errorf("cubeproxy_upstream_resource_errors_total %v, want 1", v)
	}
	if v, _ := metricValue(samples, "cubeproxy_upstream_connect_errors_total", nil); v != 0 {
		t.Errorf("cubeproxy_upstream_connect_errors_total %v, want 0", v)
	}
	// Not retried (README: it would fail the same way, and at the limit
	// each try is one more failed syscall per request).
	if v, _ := metricValue(samples, "cubeproxy_upstream_retries_total", nil); v != 0 {
		t.Errorf("cubeproxy_upstream_retries_total %v, want 0: the connect was retried", v)
	}
}

// runFDChild runs the calling test again in a child process with
// CUBE_TEST_FD_CHILD=1 and env, where it may lower the process's
// descriptor limit, and fails unless the child's run passed.
func runFDChild(t *testing.T, env ...string) {
	t.Helper()
	// A child that hangs fails in a minute with its goroutines (the
	// -test.timeout panic), not at the package's 9 minutes.
	cmd := exec.Command(os.Args[0], "-test.run=^"+t.Name()+"$", "-test.count=1", "-test.v", "-test.timeout=60s")
	cmd.Env = append(append(os.Environ(), "CUBE_TEST_FD_CHILD=1"), env...)
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "--- PASS: "+t.Name()) {
		t.Fatalf("child process: %v\n%s", err, out)
	}
}

// askAtFDLimit sends a GET for host on c, a connection the proxy has
// accepted, and reads its answer with the descriptor limit lowered
// (atFDLimit).
func askAtFDLimit(t *testing.T, c net.Conn, br *bufio.Reader, host string) *http.Response {
	t.Helper()
	var resp *http.Response
	var err error
	atFDLimit(t, func() {
		io.WriteString(c, "GET / HTTP/1.1\r\nHost: "+host+"\r\n\r\n")
		_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
		resp, err = http.ReadResponse(br, nil)
	})
	if err != nil {
		t.Fatalf("answer under the descriptor limit: %v\n%s", err, strings.Join(testenv.Stacks(), "\n\n"))
	}
	return resp
}

// atFDLimit runs fn with the process's descriptor limit lowered to its
// lowest free descriptor, so that fn's first new descriptor fails with
// EMFILE, and restores the limit after. A descriptor that closed
// meanwhile could be taken by what fn meant to fail (the admin reserve's
// did, TestAdminReserveSpentOnlyOnAConnection): the log names it.
func atFDLimit(t *testing.T, fn func()) {
	t.Helper()
	var limit syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &limit); err != nil {
		t.Fatal(err)
	}
	open := openFDs(t)
	low := limit
	low.Cur = 0
	for open[low.Cur] != "" {
		low.Cur++
	}
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &low); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &limit); err != nil {
			t.Fatal(err)
		}
		now := openFDs(t)
		for fd, name := range open {
			if now[fd] != name {
				t.Logf("descriptor %d (%s) closed while at the limit", fd, name)
			}
		}
	}()
	fn()
}

// openFDs returns the process's open descriptors, each with what it names
// (/proc/self/fd), the listing's own left out.
func openFDs(t *testing.T) map[uint64]string {
	t.Helper()
	dir, err := os.Open("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	defer dir.Close()
	names, err := dir.Readdirnames(-1)
	if err != nil {
		t.Fatal(err)
	}
	own := strconv.FormatUint(uint64(dir.Fd()), 10)
	fds := map[uint64]string{}
	for _, name := range names {
		n, err := strconv.ParseUint(name, 10, 64)
		if err != nil || name == own {
			continue
		}
		// One closed since the listing is free.
		if target, err := os.Readlink("/proc/self/fd/" + name); err == nil {
			fds[n] = target
		}
	}
	return fds
}
