package proxy

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// A sandbox that never accepts is a gateway timeout (as nginx's
// proxy_connect_timeout answers), not "refused": the connect and its one
// retry take 2 connect timeouts, and other sandboxes are served meanwhile.
func TestFrozenSandboxConnectTimeout(t *testing.T) {
	h := newHarness(t, func(o *harnessOpts) { o.cfg.ConnectTimeout = 300 * time.Millisecond })
	frozen := h.route("frozen", testenv.FrozenListener(t))
	good := h.route("good", backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "ok")
	})))

	type answer struct {
		status int
		body   string
		took   time.Duration
	}
	got := make(chan answer, 1)
	go func() {
		start := time.Now()
		resp, err := h.client.Do(h.req("GET", frozen, "/", nil))
		if err != nil {
			got <- answer{body: err.Error()}
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		got <- answer{resp.StatusCode, string(b), time.Since(start)}
	}()
	time.Sleep(50 * time.Millisecond) // the frozen dial is under way
	resp := h.do(h.req("GET", good, "/", nil))
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("another sandbox during the frozen dial: %d", resp.StatusCode)
	}
	a := <-got
	if a.status != 504 || !strings.Contains(a.body, `"code":"`+CodeUpstreamConnectTimeout+`"`) {
		t.Errorf("frozen sandbox: %d %s, want 504 %s", a.status, a.body, CodeUpstreamConnectTimeout)
	}
	if a.took < 600*time.Millisecond || a.took > 3*time.Second {
		t.Errorf("answered after %v, want two connect timeouts (600ms)", a.took)
	}
}

// A request whose sandbox connect is under way at the drain deadline (a
// frozen sandbox: each connect waits upstream.connect_timeout, and is
// retried once) is cut then, as one waiting for its answer is: it ran on
// for up to two connect timeouts, past the drain's end, and the process
// exited under it, unanswered and unlogged.
func TestDrainCutsConnectInProgress(t *testing.T) {
	const drain = 300 * time.Millisecond
	h, buf, al := drainLogHarness(t, drain)
	host := h.route("frozen", testenv.FrozenListener(t))
	c, err := net.Dial("tcp", h.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: %s\r\nX-Cube-Request-Id: cut-connect\r\n\r\n", host)
	// The pool counts the connection before the connect, which a frozen
	// sandbox never completes.
	testenv.WaitFor(t, 5*time.Second, "the connect to start", func() bool { return poolConns(h) == 1 })
	wantDrainCut(t, h, c, "GET", "cut-connect", drain, buf, al)
}

// A connection being opened to a sandbox is no idle one: while a frozen
// sandbox's connects were under way (up to two connect timeouts each),
// idle_connections counted every one of them, so that any client could
// raise it by up to upstream.max_conns per sandbox port.
func TestMetricsIdleConnsExcludeConnects(t *testing.T) {
	tel := obsTelemetry(t, nil)
	h := newHarness(t, func(o *harnessOpts) {
		o.cfg.Telemetry = tel
		o.cfg.ConnectTimeout = 10 * time.Second
	})
	admin := obsMetricsAdmin(t, h, tel)
	host := h.route("frozen", testenv.FrozenListener(t))
	const n = 3
	for i := range n {
		c, err := net.Dial("tcp", h.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		fmt.Fprintf(c, "GET /%d HTTP/1.1\r\nHost: %s\r\n\r\n", i, host)
	}
	// The pool counts each connection before its connect, which a frozen
	// sandbox never completes.
	testenv.WaitFor(t, 5*time.Second, "the connects to start", func() bool { return poolConns(h) == n })
	if v := gaugeValue(t, admin, "cubeproxy_upstream_idle_connections"); v != 0 {
		t.Errorf("upstream_idle_connections = %v with %d connects under way and nothing else open, want 0", v, n)
	}
}
