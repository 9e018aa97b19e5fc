package proxy

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/cube-sandbox/cubeproxy/auth"
	"github.com/cube-sandbox/cubeproxy/internal/testenv"
	"github.com/cube-sandbox/cubeproxy/routing"
	"github.com/cube-sandbox/cubeproxy/routing/redisstore"
)

// Tokens of the routes below (64 hex characters, as the control plane's).
var (
	rjTokenA = strings.Repeat("a1", 32)
	rjTokenB = strings.Repeat("b2", 32)
)

// rjBackend is a sandbox port that serves an event stream on /sse (one
// event at once, the next only once the test lets it go: the stream is
// silent meanwhile, as an agent's stream between events) and a WebSocket
// echo on /ws.
type rjBackend struct {
	port    uint16
	mu      sync.Mutex
	release chan struct{} // closed: every open stream sends its second event
}

func newRJBackend(t *testing.T) *rjBackend {
	b := &rjBackend{release: make(chan struct{})}
	b.port = backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/sse":
			b.mu.Lock()
			release := b.release
			b.mu.Unlock()
			w.Header().Set("Content-Type", "text/event-stream")
			_, _ = io.WriteString(w, "data: before\n\n")
			w.(http.Flusher).Flush()
			select {
			case <-release:
				_, _ = io.WriteString(w, "data: after\n\n")
				w.(http.Flusher).Flush()
			case <-r.Context().Done():
				return
			}
			<-r.Context().Done()
		case "/ws":
			c, err := websocket.Accept(w, r, nil)
			if err != nil {
				return
			}
			defer c.CloseNow()
			for {
				typ, msg, err := c.Read(r.Context())
				if err != nil {
					return
				}
				if err := c.Write(r.Context(), typ, msg); err != nil {
					return
				}
			}
		default:
			_, _ = io.WriteString(w, "ok")
		}
	}))
	return b
}

// letGo makes every stream open now send its second event.
func (b *rjBackend) letGo() {
	b.mu.Lock()
	defer b.mu.Unlock()
	close(b.release)
	b.release = make(chan struct{})
}

// rjStream is an event stream opened through the proxy whose first event
// came; its lines are read on as they come.
type rjStream struct {
	name  string
	lines chan string
	ended chan error
	body  io.Closer
}

// rjCreds is the credential a test client presents: a traffic token
// header, a Cookie header or a query (a signed link), or nothing.
type rjCreds struct {
	token, cookie, query string
	hdr                  []string // more header lines, name then value
}

func (c rjCreds) header() http.Header {
	h := http.Header{}
	if c.token != "" {
		h.Set(auth.HeaderE2BTrafficToken, c.token)
	}
	if c.cookie != "" {
		h.Set("Cookie", c.cookie)
	}
	for i := 0; i+1 < len(c.hdr); i += 2 {
		h.Set(c.hdr[i], c.hdr[i+1])
	}
	return h
}

func openRJStream(t *testing.T, h *harness, host, name string, c rjCreds) *rjStream {
	t.Helper()
	req := h.req("GET", host, "/sse"+c.query, nil)
	req.Header = c.header()
	req.Header.Set("Accept", "text/event-stream")
	resp := h.do(req)
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		t.Fatalf("%s: %d %s", name, resp.StatusCode, b)
	}
	s := &rjStream{name: name, lines: make(chan string, 16), ended: make(chan error, 1), body: resp.Body}
	t.Cleanup(func() { resp.Body.Close() })
	br := bufio.NewReader(resp.Body)
	if line, err := br.ReadString('\n'); err != nil || line != "data: before\n" {
		t.Fatalf("%s: first event %q %v", name, line, err)
	}
	go func() {
		for {
			line, err := br.ReadString('\n')
			if err != nil {
				s.ended <- err
				return
			}
			if strings.HasPrefix(line, "data:") {
				s.lines <- line
			}
		}
	}()
	return s
}

// cut waits for the stream's end; the deadline only bounds a failure.
func (s *rjStream) cut(t *testing.T) {
	t.Helper()
	select {
	case <-s.ended:
	case line := <-s.lines:
		t.Errorf("%s: relayed %q after the change, want it cut", s.name, line)
	case <-time.After(10 * time.Second):
		t.Errorf("%s: still open 10 s after the change, want it cut", s.name)
	}
}

// relays waits for the event the backend sends once let go.
func (s *rjStream) relays(t *testing.T) {
	t.Helper()
	select {
	case line := <-s.lines:
		if line != "data: after\n" {
			t.Errorf("%s: %q after the change", s.name, line)
		}
	case err := <-s.ended:
		t.Errorf("%s: ended after the change (%v), want it kept", s.name, err)
	case <-time.After(10 * time.Second):
		t.Errorf("%s: no event within 10 s of the change", s.name)
	}
}

func dialRJ(t *testing.T, h *harness, host, name string, c rjCreds) *websocket.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ws, _, err := websocket.Dial(ctx, "ws://"+h.addr+"/ws"+c.query, &websocket.DialOptions{Host: host, HTTPHeader: c.header()})
	if err != nil {
		t.Fatalf("%s: dial: %v", name, err)
	}
	t.Cleanup(func() { ws.CloseNow() })
	if err := wsEcho(t, ws); err != nil {
		t.Fatalf("%s: echo before the change: %v", name, err)
	}
	return ws
}

// wsCut waits for the tunnel's end (a read that fails before its deadline).
func wsCut(t *testing.T, ws *websocket.Conn, name string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, msg, err := ws.Read(ctx)
	switch {
	case err == nil:
		t.Errorf("%s: read %q after the change, want the tunnel cut", name, msg)
	case errors.Is(err, context.DeadlineExceeded) || ctx.Err() != nil:
		t.Errorf("%s: still open 10 s after the change, want it cut", name)
	}
}

// putRJ stores id's route through the admin API, as an operator does.
func putRJ(t *testing.T, h *harness, id string, f map[string]string) {
	t.Helper()
	body, _ := json.Marshal(f)
	if st, out := h.adminDo("PUT", "/admin/routes/"+id, string(body), ""); st != 200 {
		t.Fatalf("PUT route %s: %d %s", id, st, out)
	}
}

// rjFields is a route with port 8080 mapped to backend port bp; token ""
// makes it public, with tokenKept stored all the same when given.
func rjFields(bp uint16, createdAt, token, tokenKept string, extra ...string) map[string]string {
	f := map[string]string{"HostIP": "127.0.0.1", "SandboxIP": "127.0.0.1", "CreatedAt": createdAt, "8080": itoa(bp)}
	if token != "" {
		f["AllowPublicTraffic"] = "false"
		f["TrafficAccessToken"] = token
	} else if tokenKept != "" {
		f["TrafficAccessToken"] = tokenKept
	}
	for _, p := range extra {
		f[p] = itoa(bp)
	}
	return f
}

// rereadsDone waits until no re-read of id's route is in flight: the
// admin call asked for one before it answered, so its judgement is made.
func rereadsDone(t *testing.T, h *harness, id string) {
	t.Helper()
	testenv.WaitFor(t, 10*time.Second, "the re-read of "+id+"'s route", func() bool {
		sb := h.proxy.sandboxes.peek(id)
		return sb == nil || sb.rereads.Load() == 0
	})
}

// A change of a route through the admin API (the memory store) judges the
// sandbox's open event streams and WebSockets again, each with the
// credential it came with: what the new route no longer lets through to
// the same backend is cut at once, logged with why; the rest keeps
// relaying.
func TestRouteChangeRejudgesOpenStreams(t *testing.T) {
	const host = "8080-rj.cube.test"
	anon, withA := rjCreds{}, rjCreds{token: rjTokenA}
	type client struct {
		name  string
		creds rjCreds
		cut   string // the access log's error_code of its cut; "" = kept
	}
	for _, tc := range []struct {
		name    string
		before  func(bp uint16) map[string]string
		change  func(t *testing.T, h *harness, bp uint16)
		clients []client
		after   func(t *testing.T, h *harness)
	}{
		{
			name:   "token rotated",
			before: func(bp uint16) map[string]string { return rjFields(bp, "1", rjTokenA, "") },
			change: func(t *testing.T, h *harness, bp uint16) {
				putRJ(t, h, "rj", rjFields(bp, "1", rjTokenB, ""))
			},
			clients: []client{{"token A", withA, CodeCredentialRevoked}},
			after: func(t *testing.T, h *harness) {
				// The reconnect with the old token is refused as before.
				req := h.req("GET", host, "/", nil)
				req.Header.Set(auth.HeaderE2BTrafficToken, rjTokenA)
				resp := h.do(req)
				resp.Body.Close()
				if resp.StatusCode != 403 {
					t.Errorf("request with the old token after the rotation: %d, want 403", resp.StatusCode)
				}
			},
		},
		{
			name:   "another port added",
			before: func(bp uint16) map[string]string { return rjFields(bp, "1", rjTokenA, "") },
			change: func(t *testing.T, h *harness, bp uint16) {
				putRJ(t, h, "rj", rjFields(bp, "1", rjTokenA, "", "9090"))
			},
			clients: []client{{"token A", withA, ""}},
		},
		{
			name:   "public made private",
			before: func(bp uint16) map[string]string { return rjFields(bp, "1", "", rjTokenA) },
			change: func(t *testing.T, h *harness, bp uint16) {
				putRJ(t, h, "rj", rjFields(bp, "1", rjTokenA, ""))
			},
			clients: []client{{"anonymous", anon, CodeCredentialRevoked}, {"token A", withA, ""}},
		},
		{
			name:   "sandbox created again",
			before: func(bp uint16) map[string]string { return rjFields(bp, "1", rjTokenA, "") },
			change: func(t *testing.T, h *harness, bp uint16) {
				putRJ(t, h, "rj", rjFields(bp, "2", rjTokenA, ""))
			},
			clients: []client{{"token A", withA, CodeRouteChanged}},
		},
		{
			name:   "route deleted",
			before: func(bp uint16) map[string]string { return rjFields(bp, "1", rjTokenA, "") },
			change: func(t *testing.T, h *harness, _ uint16) {
				if st, out := h.adminDo("DELETE", "/admin/routes/rj", "", ""); st != 200 {
					t.Fatalf("DELETE route: %d %s", st, out)
				}
			},
			clients: []client{{"token A", withA, CodeRouteChanged}},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tel := obsTelemetry(t, nil)
			h, logs := logHarness(t, "json", func(o *harnessOpts) { o.cfg.Telemetry = tel })
			metrics := obsMetricsAdmin(t, h, tel)
			b := newRJBackend(t)
			putRJ(t, h, "rj", tc.before(b.port))
			streams := make([]*rjStream, len(tc.clients))
			tunnels := make([]*websocket.Conn, len(tc.clients))
			for i, c := range tc.clients {
				streams[i] = openRJStream(t, h, host, "stream, "+c.name, c.creds)
				tunnels[i] = dialRJ(t, h, host, "WebSocket, "+c.name, c.creds)
			}
			tc.change(t, h, b.port)
			cuts := map[string]int{}
			for i, c := range tc.clients {
				if c.cut != "" {
					streams[i].cut(t)
					wsCut(t, tunnels[i], "WebSocket, "+c.name)
					cuts[c.cut] += 2
				}
			}
			// The kept ones were judged too before they are let go on.
			rereadsDone(t, h, "rj")
			b.letGo()
			for i, c := range tc.clients {
				if c.cut == "" {
					streams[i].relays(t)
					if err := wsEcho(t, tunnels[i]); err != nil {
						t.Errorf("WebSocket, %s: echo after the change: %v", c.name, err)
					}
				}
			}
			total := 0
			for code, n := range cuts {
				testenv.WaitFor(t, 10*time.Second, "access log lines with error_code "+code, func() bool {
					return strings.Count(logs.String(), `"error_code":"`+code+`"`) >= n
				})
				total += n
			}
			// Counted among the streams ended, with a reason of their own.
			for _, kind := range []string{"sse", "websocket"} {
				want := float64(total / 2)
				testenv.WaitFor(t, 10*time.Second, kind+" ends counted as route_changed", func() bool {
					v, _ := metricValue(scrapeMetrics(t, metrics), "cubeproxy_streams_ended_total", map[string]string{"route_kind": kind, "reason": "route_changed"})
					return v == want
				})
			}
			if tc.after != nil {
				tc.after(t, h)
			}
		})
	}
}

// A browser's WebSocket opened on the cookie a signed link was traded for
// is cut when the traffic token the cookie is bound to is rotated; one
// opened with the link itself in its URL is not: a link is signed with
// the proxy's keys and bound to no token (it passes the next request too).
func TestRouteChangeRejudgesSignedCredentials(t *testing.T) {
	signer, sign := authSigner(t, strings.Repeat("k", 32))
	h := newHarness(t, func(o *harnessOpts) { o.cfg.Signer = signer })
	b := newRJBackend(t)
	const host = "8080-rjs.cube.test"
	putRJ(t, h, "rjs", rjFields(b.port, "1", rjTokenA, ""))
	link := sign("rjs", 8080, time.Hour)

	// The link traded for its cookie, as a browser's first load does.
	nav := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	req := h.req("GET", host, "/?"+auth.QueryParamName+"="+link, nil)
	resp, err := nav.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	var cookie string
	for _, c := range resp.Cookies() {
		if c.Name == auth.CookieName {
			cookie = c.Name + "=" + c.Value
		}
	}
	if resp.StatusCode != 302 || cookie == "" {
		t.Fatalf("signed link: %d, cookie %q; want the 302 that sets it", resp.StatusCode, cookie)
	}

	byCookie := dialRJ(t, h, host, "WebSocket on the cookie", rjCreds{cookie: cookie})
	byLink := dialRJ(t, h, host, "WebSocket on the link", rjCreds{query: "?" + auth.QueryParamName + "=" + link})
	putRJ(t, h, "rjs", rjFields(b.port, "1", rjTokenB, ""))
	wsCut(t, byCookie, "WebSocket on the cookie")
	rereadsDone(t, h, "rjs")
	if err := wsEcho(t, byLink); err != nil {
		t.Errorf("WebSocket on the link: echo after the rotation: %v", err)
	}
}

// With the Redis store the control plane writes the route and publishes
// its id: every instance judges the sandbox's open streams again at once.
// Unannounced, the janitor finds the change once the cached route's TTL is
// over. A route deleted is as definitive as a rotated token; a store that
// cannot answer the re-read cuts nothing.
func TestRouteChangeInRedisRejudgesOpenStreams(t *testing.T) {
	const id, host = "rjr", "8080-rjr.cube.test"
	for _, tc := range []struct {
		name      string
		janitor   bool // small TTLs and janitor ticks; nothing published
		change    func(t *testing.T, r *testenv.Redis, h *harness, store *redisstore.Store, write func(token string))
		cut, kept bool
	}{
		{name: "token rotated, published", change: func(t *testing.T, _ *testenv.Redis, _ *harness, store *redisstore.Store, write func(string)) {
			write(rjTokenB)
			if err := store.Publish(context.Background(), id); err != nil {
				t.Fatal(err)
			}
		}, cut: true},
		{name: "route deleted, published", change: func(t *testing.T, r *testenv.Redis, _ *harness, store *redisstore.Store, _ func(string)) {
			if err := r.Client().Del(context.Background(), redisstore.DefaultKeyPrefix+id).Err(); err != nil {
				t.Fatal(err)
			}
			if err := store.Publish(context.Background(), id); err != nil {
				t.Fatal(err)
			}
		}, cut: true},
		{name: "token rotated, not published", janitor: true, change: func(_ *testing.T, _ *testenv.Redis, _ *harness, _ *redisstore.Store, write func(string)) {
			write(rjTokenB)
		}, cut: true},
		{name: "Redis down during the re-read", change: func(t *testing.T, r *testenv.Redis, h *harness, _ *redisstore.Store, write func(string)) {
			write(rjTokenB)
			r.Stop()
			h.proxy.Invalidate(id) // as the subscriber would for a PUBLISH
			testenv.WaitFor(t, 10*time.Second, "the failed re-read", func() bool {
				sb := h.proxy.sandboxes.peek(id)
				return sb.rereads.Load() == 0 && sb.unsure.Load()
			})
		}, kept: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, store := redisStore(t)
			h := newHarness(t, func(o *harnessOpts) {
				o.store = store
				o.noAdminRoutes = true
				if tc.janitor {
					o.cache.TTLMin, o.cache.TTLMax = 300*time.Millisecond, 300*time.Millisecond
					o.cfg.UpstreamIdleConnTimeout = time.Second // a janitor tick each 250 ms
				}
			})
			if !tc.janitor {
				subscribe(t, store, h)
			}
			b := newRJBackend(t)
			write := func(token string) {
				t.Helper()
				if err := r.Client().HSet(context.Background(), redisstore.DefaultKeyPrefix+id, "HostIP", "127.0.0.1", "SandboxIP", "127.0.0.1",
					"CreatedAt", "1", "8080", itoa(b.port), "AllowPublicTraffic", "false", "TrafficAccessToken", token).Err(); err != nil {
					t.Fatal(err)
				}
			}
			write(rjTokenA)
			s := openRJStream(t, h, host, "stream, token A", rjCreds{token: rjTokenA})
			ws := dialRJ(t, h, host, "WebSocket, token A", rjCreds{token: rjTokenA})
			tc.change(t, r, h, store, write)
			if tc.cut {
				s.cut(t)
				wsCut(t, ws, "WebSocket, token A")
				return
			}
			b.letGo()
			s.relays(t)
			if err := wsEcho(t, ws); err != nil {
				t.Errorf("WebSocket: echo after the failed re-read: %v", err)
			}
		})
	}
}

// judge, case by case: how each way of passing fares against each kind of
// change, as authorize would judge the opening request now.
func TestJudgeRouteChange(t *testing.T) {
	p := &Proxy{cfg: Config{ExemptPorts: []uint16{9000}}}
	route := func(public bool, token string, createdAt int64, hostPort uint16) *routing.Route {
		return &routing.Route{ID: "j", HostIP: netip.MustParseAddr("10.0.0.2"), CreatedAt: createdAt, Public: public,
			TrafficToken: token, Ports: map[uint16]uint16{8080: hostPort, 9000: hostPort + 1}}
	}
	private := route(false, rjTokenA, 1, 30000)
	public := route(true, rjTokenA, 1, 30000)
	for _, tc := range []struct {
		name string
		old  *routing.Route
		port uint16
		via  authVia
		now  *routing.Route
		want cutCause
	}{
		{"same route", private, 8080, viaToken, private, cutNone},
		{"equal copy", private, 8080, viaToken, route(false, rjTokenA, 1, 30000), cutNone},
		{"unjudged", private, 8080, viaUnjudged, nil, cutNone},
		{"deleted", private, 8080, viaToken, nil, cutMoved},
		{"recreated", private, 8080, viaToken, route(false, rjTokenA, 2, 30000), cutMoved},
		{"port mapped elsewhere", private, 8080, viaToken, route(false, rjTokenA, 1, 30002), cutMoved},
		{"port unmapped", private, 8080, viaToken, &routing.Route{ID: "j", HostIP: private.HostIP, CreatedAt: 1, TrafficToken: rjTokenA}, cutMoved},
		{"token rotated", private, 8080, viaToken, route(false, rjTokenB, 1, 30000), cutRevoked},
		{"token rotated, cookie", private, 8080, viaCookie, route(false, rjTokenB, 1, 30000), cutRevoked},
		{"token rotated, link", private, 8080, viaLink, route(false, rjTokenB, 1, 30000), cutNone},
		{"token dropped, link", private, 8080, viaLink, route(false, "", 1, 30000), cutRevoked},
		{"made public", private, 8080, viaToken, route(true, rjTokenB, 1, 30000), cutNone},
		{"made private, anonymous", public, 8080, viaAnonymous, private, cutRevoked},
		{"made private, token", public, 8080, viaToken, private, cutNone},
		{"made private with a new token, token", public, 8080, viaToken, route(false, rjTokenB, 1, 30000), cutRevoked},
		{"made private, exempt port", public, 9000, viaAnonymous, private, cutNone},
		{"made private without a token, exempt port", public, 9000, viaAnonymous, route(false, "", 1, 30000), cutRevoked},
	} {
		if got := p.judge(grant{route: tc.old, port: tc.port, via: tc.via}, tc.now); got != tc.want {
			t.Errorf("%s: judged %d, want %d", tc.name, got, tc.want)
		}
	}
}

// A request whose route was read just before a change was announced, and
// that takes its sandbox connection only after the change was judged (the
// walk found it on no pool's list), is judged when it gets the connection
// (judgeLate): a plain request and a WebSocket's upgrade with the rotated
// token get the 403 credential_revoked. One across a change that judges
// the same (a port added) goes through.
func TestRouteChangeBeforeCheckoutIsJudged(t *testing.T) {
	const host = "8080-rl.cube.test"
	for _, tc := range []struct {
		name   string
		token  string                            // what the request carries
		change func(bp uint16) map[string]string // nil: the route deleted
		want   int
		code   string // the error code of a refusal
	}{
		{"token rotated", rjTokenA, func(bp uint16) map[string]string { return rjFields(bp, "1", rjTokenB, "") }, 403, CodeCredentialRevoked},
		{"port added", rjTokenA, func(bp uint16) map[string]string { return rjFields(bp, "1", rjTokenA, "", "9090") }, 200, ""},
		// The change's re-read leaves "no route" in the negative cache,
		// where the request's own judgement finds it: as definitive as
		// the store's answer it caches (a new request gets its 404).
		{"route deleted", rjTokenA, func(uint16) map[string]string { return nil }, 502, CodeRouteChanged},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			b := newRJBackend(t)
			putRJ(t, h, "rl", rjFields(b.port, "1", rjTokenA, ""))
			change := tc.change(b.port)
			// The change once the request has read its route and looked
			// its pool up, before it takes a connection; judged (its
			// re-read done) before the request goes on.
			var changed atomic.Bool
			h.proxy.afterPool = func() {
				if changed.CompareAndSwap(false, true) {
					if change == nil {
						if st, out := h.adminDo("DELETE", "/admin/routes/rl", "", ""); st != 200 {
							t.Errorf("DELETE route: %d %s", st, out)
						}
					} else {
						putRJ(t, h, "rl", change)
					}
					rereadsDone(t, h, "rl")
				}
			}
			req := h.req("GET", host, "/", nil)
			req.Header.Set(auth.HeaderE2BTrafficToken, tc.token)
			resp := h.do(req)
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if !changed.Load() {
				t.Fatal("the request did not look its pool up: the case tests nothing")
			}
			if resp.StatusCode != tc.want || !strings.Contains(string(body), tc.code) {
				t.Fatalf("request across the change: %d %s, want %d %s", resp.StatusCode, body, tc.want, tc.code)
			}
			if tc.want != 403 {
				return
			}
			// The WebSocket's upgrade, the same way.
			putRJ(t, h, "rl", rjFields(b.port, "1", rjTokenA, ""))
			rereadsDone(t, h, "rl")
			changed.Store(false)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			ws, wresp, err := websocket.Dial(ctx, "ws://"+h.addr+"/ws", &websocket.DialOptions{Host: host, HTTPHeader: rjCreds{token: rjTokenA}.header()})
			if err == nil {
				ws.CloseNow()
				t.Fatal("WebSocket across the change: upgraded, want 403")
			}
			if wresp == nil || wresp.StatusCode != 403 {
				t.Fatalf("WebSocket across the change: %v, want 403 %s", err, CodeCredentialRevoked)
			}
		})
	}
}
