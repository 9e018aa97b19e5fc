package proxy

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/cube-sandbox/cubeproxy/auth"
	"github.com/cube-sandbox/cubeproxy/internal/testenv"
	"github.com/cube-sandbox/cubeproxy/routing"
)

// A WebSocket whose upgrade was judged, and whose route changes after its
// sandbox connection left the pool's busy list for the tunnel's (splice)
// but before the tunnel was listed there, is judged as it is listed: the
// change's walk found it on neither list. Opened with the rotated token,
// it is cut (credential_revoked), not left relaying until the janitor's
// next look.
func TestRouteChangeDuringTunnelHandOffIsJudged(t *testing.T) {
	const host = "8080-rh.cube.test"
	// The janitor's look (rejudgeOpen) comes each 30 s here, after the
	// waits below: what they see cut is the change's own doing.
	h, logs := logHarness(t, "json", func(o *harnessOpts) { o.cfg.UpstreamIdleConnTimeout = 2 * time.Minute })
	b := newRJBackend(t)
	putRJ(t, h, "rh", rjFields(b.port, "1", rjTokenA, ""))
	var changed atomic.Bool
	h.proxy.afterHandOff = func() {
		if changed.CompareAndSwap(false, true) {
			putRJ(t, h, "rh", rjFields(b.port, "1", rjTokenB, ""))
			rereadsDone(t, h, "rh")
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ws, _, err := websocket.Dial(ctx, "ws://"+h.addr+"/ws", &websocket.DialOptions{Host: host, HTTPHeader: rjCreds{token: rjTokenA}.header()})
	if !changed.Load() {
		t.Fatalf("the upgrade did not reach its hand-off (%v): the case tests nothing", err)
	}
	if err == nil {
		// The 101 may have gone out before the cut: the tunnel is cut.
		defer ws.CloseNow()
		wsCut(t, ws, "WebSocket across the change")
	}
	testenv.WaitFor(t, 10*time.Second, "the access log line with error_code "+CodeCredentialRevoked, func() bool {
		return strings.Contains(logs.String(), `"error_code":"`+CodeCredentialRevoked+`"`)
	})
}

// A request re-sent on a new connection because the kept-alive one it
// took had been closed by the sandbox (roundTrip's retry) is judged again
// as it takes the new one: a change whose walk ran in between, while no
// list of the pool held the request, would otherwise let the old token's
// request through on the retry.
func TestRouteChangeBeforeRetryIsJudged(t *testing.T) {
	const host = "8080-rr.cube.test"
	h := newHarness(t)
	var dropped atomic.Bool
	port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/drop" && dropped.CompareAndSwap(false, true) {
			// Closed before any answer: the proxy re-sends the GET.
			conn, _, err := w.(http.Hijacker).Hijack()
			if err == nil {
				conn.Close()
			}
			return
		}
		_, _ = io.WriteString(w, "ok")
	}))
	putRJ(t, h, "rr", rjFields(port, "1", rjTokenA, ""))
	get := func(path string) (int, string) {
		t.Helper()
		req := h.req("GET", host, path, nil)
		req.Header.Set(auth.HeaderE2BTrafficToken, rjTokenA)
		resp := h.do(req)
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp.StatusCode, string(body)
	}
	// A connection to keep alive for the next request.
	if st, body := get("/"); st != 200 {
		t.Fatalf("first request: %d %s", st, body)
	}
	var changed atomic.Bool
	h.proxy.beforeRetry = func() {
		if changed.CompareAndSwap(false, true) {
			putRJ(t, h, "rr", rjFields(port, "1", rjTokenB, ""))
			rereadsDone(t, h, "rr")
		}
	}
	st, body := get("/drop")
	if !changed.Load() {
		t.Fatalf("the request was not re-sent (%d %s): the case tests nothing", st, body)
	}
	if st != 403 || !strings.Contains(body, CodeCredentialRevoked) {
		t.Fatalf("request re-sent across the change: %d %s, want 403 %s", st, body, CodeCredentialRevoked)
	}
}

// A route deleted without an announcement, whose "no route" the
// negative cache holds when the janitor looks (requests for the sandbox
// keep asking, each a 404), is as gone as the store's own answer: what
// the sandbox has open is cut (route_changed). The janitor took a
// negative hit for no answer, and a sandbox that kept getting requests
// kept its streams for as long as one came within each negative TTL of
// the last store read.
func TestRouteDeletedUnannouncedRejudgedFromTheNegativeCache(t *testing.T) {
	const host = "8080-rn.cube.test"
	// The cache's clock stands still but where the test moves it: the
	// negative entry stays fresh for every look of the janitor.
	var now atomic.Int64
	now.Store(time.Now().UnixNano())
	h := newHarness(t, func(o *harnessOpts) {
		o.cache.Now = func() time.Time { return time.Unix(0, now.Load()) }
		o.cfg.UpstreamIdleConnTimeout = time.Second // a janitor tick each 250 ms
	})
	b := newRJBackend(t)
	putRJ(t, h, "rn", rjFields(b.port, "1", rjTokenA, ""))
	s := openRJStream(t, h, host, "stream, token A", rjCreds{token: rjTokenA})
	if _, err := h.store.Remove("rn"); err != nil { // nothing announced
		t.Fatal(err)
	}
	now.Add(int64(routing.DefaultTTLMax + time.Second)) // the cached route's TTL over
	expectDeleted(t, h, host)
	s.cut(t)
}

// gateStore is a route store whose next lookup of armed's id, once armed,
// waits for open and then fails as an unreachable store does.
type gateStore struct {
	routing.Store
	armed   atomic.Pointer[string]
	entered chan struct{}
	open    chan struct{}
}

func (g *gateStore) Lookup(ctx context.Context, id string) (*routing.Route, error) {
	if a := g.armed.Load(); a != nil && *a == id && g.armed.CompareAndSwap(a, nil) {
		close(g.entered)
		<-g.open
		return nil, errors.New("store unreachable")
	}
	return g.Store.Lookup(ctx, id)
}

// The re-read an announced delete asks for may find the "no route" a
// request cached meanwhile (the re-read before it failed, and one more
// was asked for): what the sandbox has open is cut on it, as on the
// store's own answer, not left for the janitor.
func TestRouteDeletedAnnouncedRejudgedFromTheNegativeCache(t *testing.T) {
	const id, host = "ra", "8080-ra.cube.test"
	ms := routing.NewMemoryStore()
	gs := &gateStore{Store: ms, entered: make(chan struct{}), open: make(chan struct{})}
	h := newHarness(t, func(o *harnessOpts) {
		o.store = gs
		o.noAdminRoutes = true
		// The janitor's look (rejudgeOpen) comes each 30 s, after the
		// waits below: what they see cut is the re-read's doing.
		o.cfg.UpstreamIdleConnTimeout = 2 * time.Minute
	})
	b := newRJBackend(t)
	r, err := routing.ParseRouteStrict(id, rjFields(b.port, "1", rjTokenA, ""))
	if err != nil {
		t.Fatal(err)
	}
	if err := ms.Put(r); err != nil {
		t.Fatal(err)
	}
	s := openRJStream(t, h, host, "stream, token A", rjCreds{token: rjTokenA})
	if _, err := ms.Remove(id); err != nil {
		t.Fatal(err)
	}
	// The first re-read waits in the store, and will fail.
	armed := id
	gs.armed.Store(&armed)
	h.proxy.Invalidate(id)
	testenv.Recv(t, gs.entered, 10*time.Second, "the invalidation's re-read in the store")
	// A second invalidation asks for one more re-read, and a request
	// caches the store's "no route" before it.
	h.proxy.Invalidate(id)
	expectDeleted(t, h, host)
	close(gs.open)
	s.cut(t)
}

// expectDeleted asks host with token A, whose route was deleted: 404.
func expectDeleted(t *testing.T, h *harness, host string) {
	t.Helper()
	req := h.req("GET", host, "/", nil)
	req.Header.Set(auth.HeaderE2BTrafficToken, rjTokenA)
	resp := h.do(req)
	resp.Body.Close()
	if resp.StatusCode != 404 {
		t.Fatalf("request after the delete: %d, want 404", resp.StatusCode)
	}
}
