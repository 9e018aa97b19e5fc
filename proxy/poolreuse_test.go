package proxy

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/accesslog"
	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// What a reset does to a pooled sandbox connection, where
// TestUpstreamStaleConnRetry covers a close (FIN): a sandbox that crashes,
// or whose server aborts a connection (SO_LINGER 0, nginx's
// reset_timedout_connection), resets it. Reset while idle, the connection
// is not used for the next request, whatever its method. Reset once it
// has read the request, with no byte of an answer, the request is re-sent
// on a new connection only when it is idempotent and has no body, as by
// nginx since 1.9.13 (proxy_next_upstream error); otherwise the client
// gets a 502 upstream_reset and the access log says so, with no retry.
func TestUpstreamResetPooledConn(t *testing.T) {
	for _, tc := range []struct {
		name, method, body string
		// idle: reset while idle, before the request; else reset once
		// the request was read.
		idle    bool
		retried bool
		// chunked: the body goes chunked (streamed to the sandbox).
		chunked bool
	}{
		{"reset while idle/GET", "GET", "", true, false, false},
		{"reset while idle/POST", "POST", "payload", true, false, false},
		{"reset after reading/GET", "GET", "", false, true, false},
		{"reset after reading/HEAD", "HEAD", "", false, true, false},
		{"reset after reading/OPTIONS", "OPTIONS", "", false, true, false},
		{"reset after reading/POST", "POST", "payload", false, false, false},
		{"reset after reading/POST without a body", "POST", "", false, false, false},
		{"reset after reading/PATCH without a body", "PATCH", "", false, false, false},
		{"reset after reading/PUT with a body", "PUT", "payload", false, false, false},
		{"reset after reading/GET with a chunked body", "GET", "payload", false, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, logs := logHarness(t, accesslog.FormatJSON)
			answered := make(chan struct{})
			b := newScriptBackend(t, func(c net.Conn, req *http.Request, n int) bool {
				if n == 1 && !tc.idle {
					_ = c.(*net.TCPConn).SetLinger(0) // read, then reset unanswered
					return false
				}
				head := "HTTP/1.1 200 OK\r\nContent-Length: " + fmt.Sprint(len(req.Method)) + "\r\n\r\n"
				if req.Method == "HEAD" {
					rawWrite(c, head)
				} else {
					rawWrite(c, head+req.Method)
				}
				if n > 0 || !tc.idle {
					return true
				}
				// Reset only once the proxy pooled the connection (its
				// client has the answer).
				select {
				case <-answered:
				case <-t.Context().Done():
				}
				_ = c.(*net.TCPConn).SetLinger(0)
				return false
			})
			host := h.route("reset", b.port)
			c := dialRaw(t, h.addr)
			br := bufio.NewReader(c)
			if st, body := pooledExchange(t, c, br, "GET", "/first", host, "reset-first", "", false); st != 200 || body != "GET" {
				t.Fatalf("first request: %d %q", st, body)
			}
			close(answered)
			if tc.idle {
				if err := b.waitEnded(t); err != nil {
					t.Fatalf("backend connection ended with %v, want its own reset", err)
				}
			}
			if n := poolConns(h); n != 1 {
				t.Fatalf("%d pooled connections before the second request, want 1", n)
			}
			id := "reset-" + strings.NewReplacer(" ", "-", "/", "-").Replace(tc.name)
			st, body := pooledExchange(t, c, br, tc.method, "/second", host, id, tc.body, tc.chunked)
			seen, accepted := b.count(tc.method+" /second"), b.accepted.Load()
			e := logs.waitJSON(t, id)
			want := tc.method
			if tc.method == "HEAD" {
				want = ""
			}
			switch {
			case tc.idle:
				// The reset was in the socket before the request: the peek
				// before reuse drops the connection, and the request goes
				// once, on a new one, without counting as a retry.
				if st != 200 || body != want || seen != 1 || accepted != 2 {
					t.Fatalf("%s after an idle reset: %d %q, backend saw it %d times on %d connections; want 200 %q, once, on a second connection",
						tc.method, st, body, seen, accepted, want)
				}
				if e["upstream_retries"] != 0.0 {
					t.Errorf("access log upstream_retries %v, want 0: the request went out once", e["upstream_retries"])
				}
			case tc.retried:
				if st != 200 || body != want || seen != 2 || accepted != 2 {
					t.Fatalf("%s: %d %q, backend saw it %d times on %d connections; want 200 %q re-sent once on a new connection",
						tc.method, st, body, seen, accepted, want)
				}
				if e["status"] != 200.0 || e["upstream_retries"] != 1.0 || e["upstream_retry_code"] != CodeUpstreamReset {
					t.Errorf("access log: status %v upstream_retries %v upstream_retry_code %v, want 200, 1, %q",
						e["status"], e["upstream_retries"], e["upstream_retry_code"], CodeUpstreamReset)
				}
			default:
				if st != 502 || !strings.Contains(body, `"code":"`+CodeUpstreamReset+`"`) {
					t.Fatalf("%s: %d %q, want 502 with code %q", tc.method, st, body, CodeUpstreamReset)
				}
				if seen != 1 || accepted != 1 {
					t.Fatalf("%s was re-sent: backend saw it %d times on %d connections, want once on 1", tc.method, seen, accepted)
				}
				if e["status"] != 502.0 || e["error_code"] != CodeUpstreamReset || e["upstream_retries"] != 0.0 {
					t.Errorf("access log: status %v error_code %v upstream_retries %v, want 502, %q, 0",
						e["status"], e["error_code"], e["upstream_retries"], CodeUpstreamReset)
				}
			}
			// The reset connection is gone; one that answered is pooled.
			if tc.idle || tc.retried {
				waitPoolConns(t, h, 1)
			} else {
				waitPoolConns(t, h, 0)
			}
		})
	}
}

// pooledExchange sends one request on c (a keep-alive connection to the
// proxy) and reads its answer: status and body. chunked sends body in
// two chunks, so that the proxy streams it.
func pooledExchange(t *testing.T, c net.Conn, br *bufio.Reader, method, path, host, id, body string, chunked bool) (int, string) {
	t.Helper()
	head := fmt.Sprintf("%s %s HTTP/1.1\r\nHost: %s\r\nX-Cube-Request-Id: %s\r\n", method, path, host, id)
	switch {
	case chunked:
		half := len(body) / 2
		head += fmt.Sprintf("Transfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n%x\r\n%s\r\n0\r\n\r\n", half, body[:half], len(body)-half, body[half:])
	case body != "":
		head += fmt.Sprintf("Content-Length: %d\r\n\r\n%s", len(body), body)
	default:
		head += "\r\n"
	}
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, head); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(br, &http.Request{Method: method})
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

// A pooled connection belongs to the sandbox and address it was opened
// to. When the route (written through the admin API here) no longer sends
// a port to an address (moved to another node or host port, back from
// one, deleted) or names a sandbox created again, the idle connections
// there are closed at once (earlier builds left them to the janitor,
// upstream.idle_conn_timeout), and the next request opens a connection to
// what the route names now. One that still sends a port there keeps them.
// A kill closes the sandbox's idle connections at once: its VM may never
// close them. A pause sends nothing to the sandbox, and the pool is there
// as it was when it runs again.
func TestPooledConnsAcrossRouteChanges(t *testing.T) {
	for _, tc := range []struct {
		name string
		// change is made between the two requests; the second goes to
		// old's answer or, with moved, to that of a second backend,
		// listening on movedIP.
		change  func(t *testing.T, h *harness, old, moved *scriptBackend)
		moved   bool
		movedIP string
		// second: the second request's status and code ("" = 200 and the
		// backend's own answer).
		status int
		code   string
		// want is what happens to the first connection: "closed" (by the
		// proxy, at once) or "reused"; pooled
		// is how many connections the proxy holds after the second
		// request.
		want   string
		pooled int
	}{
		{"moved to another node", func(t *testing.T, h *harness, _, moved *scriptBackend) {
			putRoute(t, h, "1", moved)
		}, true, "127.0.0.2", 200, "", "closed", 1},
		{"moved to another port at the same address", func(t *testing.T, h *harness, _, moved *scriptBackend) {
			putRoute(t, h, "1", moved)
		}, true, "127.0.0.1", 200, "", "closed", 1},
		{"another port exposed too", func(t *testing.T, h *harness, old, moved *scriptBackend) {
			body := `{"HostIP":"127.0.0.1","SandboxIP":"127.0.0.1","CreatedAt":"1","8080":"` + itoa(old.port) + `","8081":"` + itoa(moved.port) + `"}`
			if st, resp := h.adminDo("PUT", "/admin/routes/poolroute", body, ""); st != 200 {
				t.Fatalf("PUT route: %d %s", st, resp)
			}
		}, false, "127.0.0.1", 200, "", "reused", 1},
		{"moved to another node and back", func(t *testing.T, h *harness, old, moved *scriptBackend) {
			putRoute(t, h, "1", moved)
			if resp, body := h.dialProxy(t).do("GET", "8080-poolroute.cube.test", "/away", ""); resp.StatusCode != 200 || body != "moved /away" {
				t.Fatalf("request to the other node: %d %q", resp.StatusCode, body)
			}
			waitPoolConns(t, h, 1)
			// Back to an address whose pool is still there: no pool is
			// made, and the other node's connection is closed all the same.
			putRoute(t, h, "1", old)
			if err := moved.waitEnded(t); err != io.EOF {
				t.Fatalf("the other node's connection ended with %v, want EOF: the proxy closes it", err)
			}
		}, false, "127.0.0.2", 200, "", "closed", 1},
		{"deleted", func(t *testing.T, h *harness, _, _ *scriptBackend) {
			if st, body := h.adminDo("DELETE", "/admin/routes/poolroute", "", ""); st != 200 {
				t.Fatalf("DELETE route: %d %s", st, body)
			}
		}, false, "127.0.0.1", 404, CodeNotFound, "closed", 0},
		{"created again at the same address", func(t *testing.T, h *harness, old, _ *scriptBackend) {
			putRoute(t, h, "2", old)
		}, false, "127.0.0.1", 200, "", "closed", 1},
		{"killed", func(t *testing.T, h *harness, _, _ *scriptBackend) {
			if st, body := h.adminDo("POST", "/admin/meta/delete", `{"sandbox_id":"poolroute"}`, ""); st != 200 {
				t.Fatalf("kill: %d %s", st, body)
			}
		}, false, "127.0.0.1", 410, CodeSandboxKilled, "closed", 0},
		{"paused, then running", func(t *testing.T, h *harness, _, _ *scriptBackend) {
			setState(t, h, "paused")
			c := h.dialProxy(t)
			resp, body := c.do("GET", "8080-poolroute.cube.test", "/paused", "")
			checkProxyError(t, resp, body, 503, CodeSandboxPausing)
			setState(t, h, "running")
		}, false, "127.0.0.1", 200, "", "reused", 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			answer := func(ip, name string) *scriptBackend {
				return newScriptBackendAt(t, ip, func(c net.Conn, req *http.Request, _ int) bool {
					return rawWrite(c, okResponse(name+" "+req.URL.Path))
				})
			}
			old, moved := answer("127.0.0.1", "old"), answer(tc.movedIP, "moved")
			putRoute(t, h, "1", old)
			const host = "8080-poolroute.cube.test"
			if resp, body := h.dialProxy(t).do("GET", host, "/first", ""); resp.StatusCode != 200 || body != "old /first" {
				t.Fatalf("first request: %d %q", resp.StatusCode, body)
			}
			waitPoolConns(t, h, 1)
			tc.change(t, h, old, moved)
			// A new client connection: adminDo's are the test's own.
			resp, body := h.dialProxy(t).do("GET", host, "/second", "")
			switch {
			case tc.code != "":
				checkProxyError(t, resp, body, tc.status, tc.code)
			case tc.moved:
				if resp.StatusCode != 200 || body != "moved /second" {
					t.Fatalf("second request: %d %q, want 200 from the backend the route names now", resp.StatusCode, body)
				}
			default:
				if resp.StatusCode != 200 || body != "old /second" {
					t.Fatalf("second request: %d %q, want 200 %q", resp.StatusCode, body, "old /second")
				}
			}
			if n := old.count("GET /paused"); n != 0 {
				t.Fatalf("a paused sandbox got %d requests", n)
			}
			switch tc.want {
			case "closed":
				if err := old.waitEnded(t); err != io.EOF {
					t.Fatalf("the first connection ended with %v, want EOF: the proxy closes it", err)
				}
			case "reused":
				old.wantAccepted(t, 1, "(the pool is kept across a pause)")
			}
			waitPoolConns(t, h, tc.pooled)
		})
	}
}

// putRoute stores route poolroute, created at createdAt, with its
// container port 8080 at b's address, through the admin API.
func putRoute(t *testing.T, h *harness, createdAt string, b *scriptBackend) {
	t.Helper()
	body := `{"HostIP":"` + b.ip + `","SandboxIP":"` + b.ip + `","CreatedAt":"` + createdAt + `","8080":"` + itoa(b.port) + `"}`
	if st, resp := h.adminDo("PUT", "/admin/routes/poolroute", body, ""); st != 200 {
		t.Fatalf("PUT route: %d %s", st, resp)
	}
}

// setState sets sandbox poolroute's state through the admin API.
func setState(t *testing.T, h *harness, state string) {
	t.Helper()
	if st, body := h.adminDo("POST", "/admin/state", `{"sandbox_id":"poolroute","state":"`+state+`"}`, ""); st != 200 {
		t.Fatalf("state %s: %d %s", state, st, body)
	}
}

// At upstream.max_conns under load, with every connection busy, the
// requests over the limit are refused at once with 503 upstream_busy (none
// waits for a slot, so none can wait forever), the busy ones complete, and
// every slot is free again afterwards: the pool then serves as many
// requests as come, on at most max_conns connections.
func TestUpstreamMaxConnsUnderLoad(t *testing.T) {
	const limit, clients = 2, 8
	h := newHarness(t, func(o *harnessOpts) { o.cfg.MaxConnsPerUpstream = limit })
	arrived := make(chan struct{}, clients)
	release := make(chan struct{})
	b := newScriptBackend(t, func(c net.Conn, req *http.Request, _ int) bool {
		if req.URL.Path == "/held" && !holdOn(t, arrived, release) {
			return false
		}
		return rawWrite(c, okResponse("done"))
	})
	host := h.route("maxload", b.port)
	type result struct {
		status int
		body   string
		err    error
	}
	results := make(chan result, clients)
	for range clients {
		pc := h.dialProxy(t)
		go func() {
			resp, body, err := pc.send("GET", host, "/held", "")
			if err != nil {
				results <- result{err: err}
				return
			}
			results <- result{status: resp.StatusCode, body: string(body)}
		}()
	}
	// The refusals come while both slots are still held: nobody waits.
	for range clients - limit {
		r := <-results
		if r.err != nil || r.status != 503 || !strings.Contains(r.body, `"code":"`+CodeUpstreamBusy+`"`) {
			t.Fatalf("over the limit: %d %q %v, want 503 %s", r.status, r.body, r.err, CodeUpstreamBusy)
		}
	}
	for range limit {
		testenv.Recv(t, arrived, 10*time.Second, "a held request at the sandbox")
	}
	close(release)
	for range limit {
		if r := <-results; r.err != nil || r.status != 200 || r.body != "done" {
			t.Fatalf("held request: %d %q %v, want 200 done", r.status, r.body, r.err)
		}
	}
	if n := b.count("GET /held"); n != limit {
		t.Fatalf("backend got %d requests, want %d: a refused one was sent", n, limit)
	}
	waitPoolConns(t, h, limit)
	// Every slot is back: limit clients at once are all served, on the
	// pooled connections.
	done := make(chan result, limit)
	for range limit {
		pc := h.dialProxy(t)
		go func() {
			resp, body, err := pc.send("GET", host, "/again", "")
			if err != nil {
				done <- result{err: err}
				return
			}
			done <- result{status: resp.StatusCode, body: string(body)}
		}()
	}
	for range limit {
		if r := <-done; r.err != nil || r.status != 200 {
			t.Fatalf("after the load: %d %q %v, want 200", r.status, r.body, r.err)
		}
	}
	if n := b.accepted.Load(); n > limit {
		t.Fatalf("backend accepted %d connections with max_conns %d", n, limit)
	}
}

// A client that leaves in the middle of a streamed answer leaves the
// sandbox connection in the middle of that answer's framing: it is
// closed, not pooled, even when the sandbox then sends the rest and waits
// for the next request on it (the leak table cannot tell: its check closes
// idle connections before it counts). Pooled, the rest would be read as
// the next client's answer.
func TestUpstreamClientLeftMidBodyNotPooled(t *testing.T) {
	rest := countingBody(4 * wholeBody)
	for _, tc := range []struct{ name, head, first, rest string }{
		{"Content-Length", "HTTP/1.1 200 OK\r\nContent-Length: " + fmt.Sprint(wholeBody+len(rest)) + "\r\n\r\n",
			countingBody(wholeBody), rest},
		{"chunked", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
			chunkedPieces(countingBody(wholeBody), 4096), chunkedBody(rest, 4096)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			left := make(chan struct{})
			b := newScriptBackend(t, func(c net.Conn, req *http.Request, _ int) bool {
				if req.URL.Path != "/big" {
					return rawWrite(c, okResponse(strings.TrimPrefix(req.URL.Path, "/")))
				}
				if !rawWrite(c, tc.head+tc.first) {
					return false
				}
				select {
				case <-left:
				case <-t.Context().Done():
					return false
				}
				// The rest, and on to the next request: a keep-alive
				// server does not know its client's client left.
				rawWrite(c, tc.rest)
				return true
			})
			host := h.route("midbody", b.port)
			c := dialRaw(t, h.addr)
			fmt.Fprintf(c, "GET /big HTTP/1.1\r\nHost: %s\r\n\r\n", host)
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := io.ReadFull(resp.Body, make([]byte, 1024)); err != nil {
				t.Fatal(err)
			}
			reset(c.(*net.TCPConn))
			close(left)
			if err := b.waitEnded(t); err == nil {
				t.Fatal("the sandbox closed its connection itself, want the proxy to close it")
			}
			waitPoolConns(t, h, 0)
			for _, want := range []string{"next", "after"} {
				if resp, body := h.dialProxy(t).do("GET", host, "/"+want, ""); resp.StatusCode != 200 || body != want {
					t.Fatalf("GET /%s: %d, %d bytes %.40q; want 200 %q", want, resp.StatusCode, len(body), body, want)
				}
			}
			b.wantAccepted(t, 2, "(the connection left mid-answer was reused)")
		})
	}
}

// holdOn is a script's held request: it tells arrived, then waits for
// release, reporting false when the test ended first.
func holdOn(t *testing.T, arrived chan<- struct{}, release <-chan struct{}) bool {
	arrived <- struct{}{}
	select {
	case <-release:
		return true
	case <-t.Context().Done():
		return false
	}
}

// A sandbox rolled back to a snapshot has lost every connection opened
// after it, and the proxy's pool does not know: the guest sends nothing on
// them until a request comes, which its kernel resets. The first request
// to learn it costs a 502 (a POST) or a retry (a GET); the pool's other idle
// connections, idle at least as long, are closed then rather than each
// costing another request the same.
func TestRolledBackSandboxCostsOneRequestPerPool(t *testing.T) {
	const pooled = 3
	for _, tc := range []struct {
		method, body string
		first        int // the status of the request that finds the pool stale
		sent         int // how many times the backend reads that request
	}{
		{"POST", `{"jsonrpc":"2.0"}`, 502, 1}, // not re-sent: it has a body
		{"GET", "", 200, 2},                   // re-sent once, on a new connection
	} {
		t.Run(tc.method, func(t *testing.T) {
			h := newHarness(t)
			arrived := make(chan struct{}, pooled)
			all := make(chan struct{})
			var old sync.Map // connections opened before the rollback
			b := newScriptBackend(t, func(c net.Conn, req *http.Request, _ int) bool {
				if req.URL.Path == "/held" {
					// Held until all are in, so the proxy opens pooled
					// connections.
					old.Store(c, true)
					arrived <- struct{}{}
					select {
					case <-all:
					case <-t.Context().Done():
					}
					return rawWrite(c, okResponse("held"))
				}
				if _, ok := old.Load(c); ok {
					_ = c.(*net.TCPConn).SetLinger(0) // the rolled-back kernel's reset
					return false
				}
				return rawWrite(c, okResponse(req.Method))
			})
			host := h.route("rollback", b.port)
			var wg sync.WaitGroup
			for range pooled {
				pc := h.dialProxy(t)
				wg.Go(func() { _, _, _ = pc.send("GET", host, "/held", "") })
			}
			for range pooled {
				testenv.Recv(t, arrived, 10*time.Second, "a held request at the sandbox")
			}
			close(all)
			wg.Wait()
			waitPoolConns(t, h, pooled)

			var got []int
			for i := range pooled {
				resp, _ := h.dialProxy(t).do(tc.method, host, fmt.Sprintf("/after/%d", i), tc.body)
				got = append(got, resp.StatusCode)
			}
			if want := []int{tc.first, 200, 200}; !slices.Equal(got, want) {
				t.Fatalf("%s after the rollback, one per request: statuses %v, want %v (one request pays for the pool)", tc.method, got, want)
			}
			if n := b.count(tc.method + " /after/0"); n != tc.sent {
				t.Errorf("the backend read the first %s %d times, want %d", tc.method, n, tc.sent)
			}
			for i := 1; i < pooled; i++ {
				if n := b.count(fmt.Sprintf("%s /after/%d", tc.method, i)); n != 1 {
					t.Errorf("the backend read %s /after/%d %d times, want once", tc.method, i, n)
				}
			}
			// The pooled connections plus the one opened after the rollback,
			// which served every later request.
			b.wantAccepted(t, pooled+1, "")
			waitPoolConns(t, h, 1)
		})
	}
}
