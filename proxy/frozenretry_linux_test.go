package proxy

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/accesslog"
	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// A client that leaves during the retried connect of a frozen sandbox is a
// 499 too, its retry in the log as in the metrics. The dial looked at the
// client only before the retry: one that left during it was logged 504
// when the sandbox stayed frozen, and, when it thawed in time, 499 with
// upstream_retries 0 where cubeproxy_upstream_retries_total counted it.
func TestFrozenRetriedConnectClientLeaves(t *testing.T) {
	for _, tc := range []struct {
		name    string
		connect time.Duration
		thaw    bool
	}{
		// The retry's SYN, dropped, is sent again 1 s into it, after the thaw.
		{"sandbox thaws", 1500 * time.Millisecond, true},
		// 1 s: the close, a third of it into the retry, has as much to
		// spare either way on a loaded machine (the retry's end must not
		// come before it: a 504).
		{"sandbox stays frozen", time.Second, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, logs := logHarness(t, accesslog.FormatJSON, func(o *harnessOpts) { o.cfg.ConnectTimeout = tc.connect })
			port, thaw := testenv.ThawableFrozenListener(t)
			host := h.route("frozenretry", port)
			c, err := net.Dial("tcp", h.addr)
			if err != nil {
				t.Fatal(err)
			}
			fmt.Fprintf(c, "POST /call HTTP/1.1\r\nHost: %s\r\nX-Cube-Request-Id: frozen-retry\r\nContent-Length: 2\r\n\r\n{}", host)
			testenv.WaitFor(t, 5*time.Second, "the connect to start", func() bool { return poolConns(h) == 1 })
			// Midway through the retried connect: it began one connect
			// timeout after the first.
			time.Sleep(tc.connect * 4 / 3)
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
			e := logs.waitJSON(t, "frozen-retry")
			if e["status"] != 499.0 || e["upstream_retries"] != 1.0 {
				t.Errorf("access log status %v upstream_retries %v, want 499 after one retried connect", e["status"], e["upstream_retries"])
			}
			if !tc.thaw {
				return
			}
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
