package proxy

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/accesslog"
	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// A sandbox that never accepts is a gateway timeout (as nginx's
// proxy_connect_timeout answers), not "refused": the connect and its one
// retry take 2 connect timeouts, and other sandboxes are served meanwhile.
func TestFrozenSandboxConnectTimeout(t *testing.T) {
	h, logs := logHarness(t, accesslog.FormatJSON, func(o *harnessOpts) { o.cfg.ConnectTimeout = 300 * time.Millisecond })
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
		req := h.req("GET", frozen, "/", nil)
		req.Header.Set(HeaderRequestID, "frozen-connect")
		resp, err := h.client.Do(req)
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
	// The log says the first connect, retried, timed out too: a refusal
	// there would send an operator after a sandbox that is down, not one
	// that is frozen.
	e := logs.waitJSON(t, "frozen-connect")
	if e["upstream_retries"] != 1.0 || e["upstream_retry_code"] != CodeUpstreamConnectTimeout || e["error_code"] != CodeUpstreamConnectTimeout {
		t.Errorf("access log: upstream_retries %v, upstream_retry_code %v, error_code %v; want 1, %q, %q",
			e["upstream_retries"], e["upstream_retry_code"], e["error_code"], CodeUpstreamConnectTimeout, CodeUpstreamConnectTimeout)
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

// A client that leaves while its sandbox's connect is under way (a VM
// paused or being snapshotted: no SYN-ACK) ends its request there, 499,
// as nginx ends one on EPOLLRDHUP. The connect was retried after it left,
// and a sandbox that thawed meanwhile (its kernel answering the next SYN
// retransmission) was sent the request of a client long gone: a POST, a
// tool call the agent that gave up has retried already, ran twice.
//
// One that leaves during the retried connect is a 499 too, its retry in
// the log as in the metrics: the dial looked at the client only before the
// retry, and one that left during it was logged 504 when the sandbox
// stayed frozen, and, when it thawed in time, 499 with upstream_retries 0
// where cubeproxy_upstream_retries_total counted it.
func TestFrozenConnectClientLeaves(t *testing.T) {
	const post = "POST /call HTTP/1.1\r\nContent-Length: 2\r\n"
	for _, tc := range []struct {
		name    string
		head    string
		connect time.Duration
		// leave is when the client leaves, from the connect's start:
		// 0 at once, during the first connect.
		leave   time.Duration
		thaw    bool
		retries float64
	}{
		// The SYN retransmitted 1 s in gets through within the connect.
		{"sandbox thaws", post, 3 * time.Second, 0, true, 0},
		{"sandbox thaws, WebSocket", "GET /ws HTTP/1.1\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n", 3 * time.Second, 0, true, 0},
		// Without the retry the request ends at one connect timeout.
		{"sandbox stays frozen", post, 500 * time.Millisecond, 0, false, 0},
		// Leaving a third into the retry (which began one connect
		// timeout after the first): the retry's SYN, dropped, is sent
		// again 1 s into it, after the thaw.
		{"sandbox thaws during the retry", post, 1500 * time.Millisecond, 2000 * time.Millisecond, true, 1},
		// 1 s: the close has a third of a second to spare either way on
		// a loaded machine (the retry's end must not come before it: a
		// 504).
		{"sandbox stays frozen through the retry", post, time.Second, 1333 * time.Millisecond, false, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, logs := logHarness(t, accesslog.FormatJSON, func(o *harnessOpts) { o.cfg.ConnectTimeout = tc.connect })
			port, thaw := testenv.ThawableFrozenListener(t)
			host := h.route("frozenleft", port)
			c, err := net.Dial("tcp", h.addr)
			if err != nil {
				t.Fatal(err)
			}
			body := ""
			if strings.HasPrefix(tc.head, "POST") {
				body = "{}"
			}
			fmt.Fprintf(c, "%sHost: %s\r\nX-Cube-Request-Id: frozen-left\r\n\r\n%s", tc.head, host, body)
			// The pool counts the connection before the connect.
			testenv.WaitFor(t, 5*time.Second, "the connect to start", func() bool { return poolConns(h) == 1 })
			time.Sleep(tc.leave)
			c.Close()
			left := make(chan string, 4)
			if tc.thaw {
				srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					if r.URL.Path != "/after" {
						left <- r.Method + " " + r.URL.Path
					}
					io.WriteString(w, "ok")
				})}
				go srv.Serve(thaw())
				t.Cleanup(func() { srv.Close() })
			}
			e := logs.waitJSON(t, "frozen-left")
			if e["status"] != 499.0 || e["upstream_retries"] != tc.retries {
				t.Errorf("access log status %v upstream_retries %v, want 499 and %v retried connects", e["status"], e["upstream_retries"], tc.retries)
			}
			if !tc.thaw {
				return
			}
			// The sandbox works at once, and the left request never came.
			if st, body, _ := h.get(host, "/after"); st != 200 || body != "ok" {
				t.Errorf("the thawed sandbox: %d %q, want 200 ok", st, body)
			}
			select {
			case p := <-left:
				t.Errorf("the sandbox was sent %s, whose client had left during the connect", p)
			case <-time.After(100 * time.Millisecond):
			}
		})
	}
}
