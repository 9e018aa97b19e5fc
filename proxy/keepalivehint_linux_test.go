package proxy

import (
	"net"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// An idle sandbox connection whose server announced its idle timeout
// (Keep-Alive: timeout=N) is closed by that server after N seconds. The
// proxy no longer reuses it past the hint, but its janitor closed it only
// at upstream.idle_conn_timeout (30 s by default): until then the proxy's
// end sat in CLOSE_WAIT holding a descriptor, one per idle connection of
// every sandbox running Node (timeout=5), six times as long as it was of
// any use. The janitor now closes it at its first round past the hint.
//
// The backend is what such a sandbox runs: net/http with an IdleTimeout of
// N seconds announcing it, as Node's http.Server does (keepAliveTimeout,
// 5 s). The test waits for the backend to close the connection, then for
// the proxy to close its end (its TCP state from sock_diag, what ss
// shows), well before idle_conn_timeout.
func TestJanitorClosesConnPastKeepAliveHint(t *testing.T) {
	const idleConnTimeout = 8 * time.Second // the janitor ticks every 2 s
	for _, tc := range []struct {
		name string
		hint string
		idle time.Duration // the backend's IdleTimeout
	}{
		{"timeout=1", "timeout=1", time.Second},
		{"Node's form, timeout=2, max=100", "timeout=2, max=100", 2 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, func(o *harnessOpts) { o.cfg.UpstreamIdleConnTimeout = idleConnTimeout })
			ln := listen(t, "127.0.0.1:0")
			closed := make(chan int, 4) // the proxy's ports of the connections the backend closed
			srv := &http.Server{
				IdleTimeout: tc.idle,
				Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					w.Header().Set("Keep-Alive", tc.hint)
					_, _ = w.Write([]byte("ok"))
				}),
				ConnState: func(c net.Conn, st http.ConnState) {
					if st == http.StateClosed {
						closed <- c.RemoteAddr().(*net.TCPAddr).Port
					}
				},
			}
			go srv.Serve(ln)
			t.Cleanup(func() { _ = srv.Close() })
			port := ln.Addr().(*net.TCPAddr).Port
			host := h.route("kajanitor", uint16(port))

			code, body, _ := h.get(host, "/")
			if code != 200 || body != "ok" {
				t.Fatalf("GET: %d %q", code, body)
			}
			waitPoolConns(t, h, 1)
			proxyPort := testenv.Recv(t, closed, tc.idle+5*time.Second, "the backend's idle close")
			closedAt := time.Now()
			// Closed by the proxy within two janitor rounds of the
			// backend's close, well before the idle_conn_timeout (8 s)
			// that closed it before: gone, or in TIME_WAIT (no descriptor)
			// when the janitor's round came between the hint's margin and
			// the backend's close, not ESTABLISHED or CLOSE_WAIT.
			testenv.WaitFor(t, idleConnTimeout/2, "the proxy to close its end of the connection the backend closed ("+
				strconv.Itoa(proxyPort)+" -> "+strconv.Itoa(port)+")",
				func() bool {
					st, _ := tcpSocketState(t, proxyPort, port)
					return st != tcpStateEstablished && st != tcpStateCloseWait
				})
			if n := poolConns(h); n != 0 {
				t.Fatalf("%d upstream connections counted open, want 0", n)
			}
			st, _ := tcpSocketState(t, proxyPort, port)
			t.Logf("closed by %v after the backend's close (TCP state %d)", time.Since(closedAt).Round(time.Millisecond), st)
		})
	}
}
