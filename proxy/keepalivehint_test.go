package proxy

import (
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// A sandbox server that announces its idle timeout (Keep-Alive: timeout=N,
// as Node's http.Server does with 5 s) closes an idle keep-alive connection
// after N seconds. The proxy pooled the connection for
// upstream.idle_conn_timeout (30 s), and a request sent on it as the
// sandbox closed it was reset: a POST, which is not re-sent, got a 502
// upstream_reset. The proxy now reuses such a connection only within the
// hint less a margin (keepAliveReuse), and opens a new one after that.
//
// The backend stands for that server, made deterministic: it answers the
// first request of a connection with the hint, and a later request that
// reaches it on the connection after the announced timeout is read and
// then the connection is closed without an answer, as the request that
// races the server's close is. Before it, it answers as usual. The test
// waits out the hint for real: it is what is tested.
func TestUpstreamKeepAliveHintNotReusedPastTimeout(t *testing.T) {
	for _, tc := range []struct {
		name    string
		hint    string        // the backend's Keep-Alive field; "" for none
		timeout time.Duration // after which the backend "closes" the idle connection; 0: never
		idle    time.Duration // how long the connection is idle before the POST
		reused  bool
	}{
		{"hint of 1 s, idle past it", "timeout=1", time.Second, time.Second + 100*time.Millisecond, false},
		{"hint with max and spaces, idle past it", "Max=100 ,  TIMEOUT = 1", time.Second, time.Second + 100*time.Millisecond, false},
		{"hint of 5 s, idle within its margin", "timeout=5, max=100", 5 * time.Second, 0, true},
		{"no hint, idle 1.1 s", "", 0, time.Second + 100*time.Millisecond, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			var answered atomic.Int64 // unix nanos of the last answer
			b := newScriptBackend(t, func(c net.Conn, req *http.Request, n int) bool {
				if n > 0 && tc.timeout > 0 && time.Since(time.Unix(0, answered.Load())) >= tc.timeout {
					return false // the server's idle close, racing the request
				}
				head := "HTTP/1.1 200 OK\r\nConnection: keep-alive\r\n"
				if tc.hint != "" {
					head += "Keep-Alive: " + tc.hint + "\r\n"
				}
				body := req.Method + " " + req.URL.Path
				// Stored before the answer goes out: stored after it, the
				// test could read 0 once the client had the answer (under
				// -race and load: no idle wait at all, the connection
				// reused within its hint and the test failed).
				answered.Store(time.Now().UnixNano())
				return rawWrite(c, fmt.Sprintf("%sContent-Length: %d\r\n\r\n%s", head, len(body), body))
			})
			host := h.route("kahint", b.port)
			pc := h.dialProxy(t)
			if resp, body := pc.do("GET", host, "/first", ""); resp.StatusCode != 200 || body != "GET /first" {
				t.Fatalf("first request: %d %q", resp.StatusCode, body)
			}
			waitPoolConns(t, h, 1)
			if tc.idle > 0 {
				time.Sleep(time.Until(time.Unix(0, answered.Load()).Add(tc.idle)))
			}
			resp, body := pc.do("POST", host, "/second", "payload")
			if resp.StatusCode != 200 || body != "POST /second" {
				t.Fatalf("POST after %v idle: %d %q (the pooled connection was reused into the sandbox's close)", tc.idle, resp.StatusCode, body)
			}
			if tc.reused {
				b.wantAccepted(t, 1, "(the pooled connection reused)")
			} else {
				b.wantAccepted(t, 2, "(a new connection instead of the one past the hint)")
			}
			if n := b.count("POST /second"); n != 1 {
				t.Fatalf("the backend read the POST %d times, want 1", n)
			}
		})
	}
}

// keepAliveReuse takes the timeout parameter of a Keep-Alive field in any
// of the forms servers write, less the margin, and ignores what is not a
// positive number of seconds.
func TestKeepAliveReuse(t *testing.T) {
	for _, tc := range []struct {
		v    string
		want time.Duration
	}{
		{"", 0},
		{"timeout=5", 4 * time.Second},
		{"timeout=5, max=100", 4 * time.Second},
		{"max=100, timeout=5", 4 * time.Second},
		{" Timeout = 5 ,max=1000", 4 * time.Second},
		{"TIMEOUT=30", 29 * time.Second},
		{`timeout="5"`, 4 * time.Second},
		{"timeout=2", time.Second},
		{"timeout=1", 500 * time.Millisecond},
		{"timeout=0", 0},
		{"timeout=", 0},
		{"timeout=-5", 0},
		{"timeout=5s", 0},
		{"timeout=1.5", 0},
		{"timeout=99999999999999999999", 0},
		{"max=100", 0},
		{"timeouts=5", 0},
		{"timeout", 0},
		{",,,", 0},
	} {
		if got := keepAliveReuse([]byte(tc.v)); got != tc.want {
			t.Errorf("keepAliveReuse(%q) = %v, want %v", tc.v, got, tc.want)
		}
	}
}

// takeExpired takes, besides the connections idle past the cutoff, those
// idle past their own Keep-Alive hint wherever they are in the idle list,
// keeps the others in order (newest last, which acquire relies on), and
// allocates nothing.
func TestTakeExpiredHintedConns(t *testing.T) {
	const s = int64(time.Second)
	now := 100 * s
	names := map[*upstreamConn]string{}
	conn := func(name string, idleFor, reuseWithin int64) *upstreamConn {
		c := &upstreamConn{idleSince: now - idleFor, reuseWithin: reuseWithin}
		names[c] = name
		return c
	}
	list := func(cs []*upstreamConn) string {
		var l []string
		for _, c := range cs {
			l = append(l, names[c])
		}
		return strings.Join(l, " ")
	}
	for _, tc := range []struct {
		name        string
		idle        []*upstreamConn // oldest first
		cutoff, now int64
		taken, kept string
	}{
		{"none taken", []*upstreamConn{conn("a", 3*s, 4*s), conn("b", 1*s, 0)}, now - 30*s, now, "", "a b"},
		{"past the hint, between others", []*upstreamConn{conn("a", 20*s, 0), conn("b", 5*s, 4*s), conn("c", 2*s, 0)}, now - 30*s, now, "b", "a c"},
		{"past the cutoff and past hints", []*upstreamConn{conn("a", 40*s, 0), conn("b", 10*s, 29*s), conn("c", 5*s, 4*s), conn("d", 4*s, 4*s), conn("e", 0, 4*s)}, now - 30*s, now, "a c d", "b e"},
		{"hints not looked at without now", []*upstreamConn{conn("a", 40*s, 0), conn("b", 5*s, 4*s)}, now - 30*s, 0, "a", "b"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			u := &upstream{idle: tc.idle}
			stale := u.takeExpired(tc.cutoff, tc.now, nil)
			if got := list(stale); got != tc.taken {
				t.Errorf("taken %q, want %q", got, tc.taken)
			}
			if got := list(u.idle); got != tc.kept {
				t.Errorf("kept %q, want %q", got, tc.kept)
			}
		})
	}
	all := []*upstreamConn{conn("a", 5*s, 4*s), conn("b", 1*s, 4*s), conn("c", 0, 0)}
	u := &upstream{idle: make([]*upstreamConn, 0, len(all))}
	stale := make([]*upstreamConn, 0, len(all))
	if n := testing.AllocsPerRun(100, func() {
		u.idle = append(u.idle[:0], all...)
		stale = u.takeExpired(now-30*s, now, stale[:0])
	}); n != 0 {
		t.Errorf("%v allocations per look at a pool, want 0", n)
	}
}
