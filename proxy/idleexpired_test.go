package proxy

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// A keep-alive connection idle past upstream.idle_conn_timeout is not used
// for a request, though the janitor has not closed it yet: the janitor
// runs only every quarter of the timeout (at most 30 s), and a connection
// it has yet to reach was reused up to that much later. An operator who
// sets the timeout just under a sandbox server's own keep-alive timeout
// (uvicorn's and Node's 5 s, Jetty's 30 s), as nginx's keepalive_timeout
// is set to keep clear of the race of a request with the server's close,
// got the race all the same, and a POST sent into it a 502.
//
// The timeout is a minute, so that the janitor does not run during the
// test; the connections' idle time is moved back instead of waited out.
func TestUpstreamIdleConnExpiredNotReused(t *testing.T) {
	const timeout = time.Minute
	for _, tc := range []struct {
		name   string
		idle   time.Duration // how long the pooled connections have been idle
		conns  int           // idle connections pooled before the request
		reused bool
	}{
		{"idle within the timeout", timeout / 2, 1, true},
		{"idle past the timeout", timeout + time.Second, 1, false},
		{"several idle past the timeout", timeout + time.Second, 3, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, func(o *harnessOpts) { o.cfg.UpstreamIdleConnTimeout = timeout })
			arrived := make(chan struct{}, tc.conns)
			release := make(chan struct{})
			b := newScriptBackend(t, func(c net.Conn, req *http.Request, _ int) bool {
				if req.URL.Path == "/held" {
					// Held until every first request is in, so that the
					// proxy opens one connection for each.
					arrived <- struct{}{}
					<-release
				}
				return rawWrite(c, okResponse(req.Method))
			})
			host := h.route("expired", b.port)
			var wg sync.WaitGroup
			errs := make(chan error, tc.conns)
			for range tc.conns {
				pc := h.dialProxy(t)
				wg.Add(1)
				go func() {
					defer wg.Done()
					resp, body, err := pc.send("POST", host, "/held", "")
					if err == nil && (resp.StatusCode != 200 || string(body) != "POST") {
						err = fmt.Errorf("got %d %q", resp.StatusCode, body)
					}
					errs <- err
				}()
			}
			for i := range tc.conns {
				testenv.Recv(t, arrived, 10*time.Second, fmt.Sprintf("held request %d at the backend", i))
			}
			close(release)
			wg.Wait()
			for range tc.conns {
				if err := <-errs; err != nil {
					t.Fatalf("first requests: %v", err)
				}
			}
			waitPoolConns(t, h, tc.conns)

			// As if tc.idle had passed since each connection's answer.
			idleSince := time.Now().Add(-tc.idle).UnixNano()
			h.proxy.pools.mu.RLock()
			for _, u := range h.proxy.pools.m {
				u.mu.Lock()
				for _, c := range u.idle {
					c.idleSince = idleSince
				}
				u.mu.Unlock()
			}
			h.proxy.pools.mu.RUnlock()

			resp, body := h.dialProxy(t).do("POST", host, "/next", "")
			if resp.StatusCode != 200 || body != "POST" {
				t.Fatalf("POST after %v idle: %d %q", tc.idle, resp.StatusCode, body)
			}
			if tc.reused {
				b.wantAccepted(t, int32(tc.conns), "(an idle connection within the timeout reused)")
				waitPoolConns(t, h, tc.conns)
				return
			}
			b.wantAccepted(t, int32(tc.conns+1), "(the expired ones not reused)")
			// Every expired connection is closed by the proxy now, not left
			// to the janitor.
			for range tc.conns {
				if err := b.waitEnded(t); err != io.EOF {
					t.Fatalf("an expired connection ended with %v, want EOF from the proxy closing it", err)
				}
			}
			waitPoolConns(t, h, 1)
		})
	}
}
