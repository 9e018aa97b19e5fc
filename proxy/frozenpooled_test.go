package proxy

import (
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// A request sent on a pooled keep-alive connection to a sandbox that froze
// while it was idle (a VM paused or snapshotted before its route changed)
// waits upstream.response_header_timeout for its head, and gets the 504:
// a POST is sent once, never again on another connection. The connection
// is closed, not pooled: once the sandbox thaws it answers the timed-out
// request, and a later request sent on that connection would be answered
// with it (a peek before reuse sees the late answer only if it came
// before the next request went out).
func TestFrozenPooledConnTimeoutNotReused(t *testing.T) {
	t.Parallel()
	const rht = 300 * time.Millisecond
	h := newHarness(t, func(o *harnessOpts) { o.cfg.ResponseHeaderTimeout = rht })
	var mu sync.Mutex
	unanswered := map[net.Conn]bool{} // the connections holding the timed-out POST
	b := newScriptBackend(t, func(c net.Conn, req *http.Request, n int) bool {
		mu.Lock()
		defer mu.Unlock()
		if req.URL.Path == "/frozen" {
			unanswered[c] = true // frozen: thawed only with the next request on c
			return true
		}
		late := ""
		if unanswered[c] {
			late, unanswered[c] = okResponse("late answer to the POST"), false
		}
		return rawWrite(c, late+okResponse(req.URL.Path))
	})
	host := h.route("frozenpooled", b.port)
	if st, body, _ := h.get(host, "/warm"); st != 200 || body != "/warm" {
		t.Fatalf("warm-up: %d %q", st, body)
	}
	start := time.Now()
	resp := h.do(h.req("POST", host, "/frozen", strings.NewReader("{}")))
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	checkProxyError(t, resp, string(body), 504, CodeUpstreamTimeout)
	if d := time.Since(start); d > rht+2*time.Second {
		t.Errorf("504 after %v, want about upstream.response_header_timeout (%v)", d, rht)
	}
	if st, body, _ := h.get(host, "/next"); st != 200 || body != "/next" {
		t.Errorf("the next request after the thaw: %d %q, want 200 %q", st, body, "/next")
	}
	if n := b.count("POST /frozen"); n != 1 {
		t.Errorf("the sandbox read the POST %d times, want once", n)
	}
}

// A sandbox that freezes between the head of a small answer (read whole
// before it goes out, up to 64 KiB) and the rest of its body is a 504 at
// upstream.idle_timeout that says so: it said "sandbox did not answer in
// time", which the README gives for no response headers, while the log's
// upstream_status had the sandbox's answer.
func TestFrozenMidAnswerSaysSo(t *testing.T) {
	t.Parallel()
	const idle = 300 * time.Millisecond
	h := newHarness(t, func(o *harnessOpts) { o.cfg.IdleStreamTimeout = idle })
	b := newScriptBackend(t, func(c net.Conn, req *http.Request, n int) bool {
		// The head and 10 of 1000 bytes, then nothing: frozen.
		return rawWrite(c, "HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n0123456789")
	})
	host := h.route("frozenmid", b.port)
	start := time.Now()
	st, body, _ := h.get(host, "/")
	if st != 504 || !strings.Contains(body, `"code":"`+CodeUpstreamTimeout+`"`) || !strings.Contains(body, "stopped sending its answer") {
		t.Errorf("%d %s, want 504 %s saying the sandbox stopped sending its answer", st, body, CodeUpstreamTimeout)
	}
	if d := time.Since(start); d > idle+2*time.Second {
		t.Errorf("answered after %v, want about upstream.idle_timeout (%v)", d, idle)
	}
}
