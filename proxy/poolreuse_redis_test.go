package proxy

import (
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
	"github.com/cube-sandbox/cubeproxy/routing/redisstore"
)

// A route the control plane moves to another node in Redis (the hash
// rewritten, the id published) sends the next request to the new address,
// on a connection of its own; the idle one to the old address is not used
// for it, and is closed then, as when the admin API moves it
// (TestPooledConnsAcrossRouteChanges).
func TestPooledConnMovedInRedis(t *testing.T) {
	const id, host = "poolredis", "8080-poolredis.cube.test"
	r, store, h := subscribedRedisHarness(t)
	answer := func(ip, name string) *scriptBackend {
		return newScriptBackendAt(t, ip, func(c net.Conn, _ *http.Request, _ int) bool {
			return rawWrite(c, okResponse(name))
		})
	}
	old, moved := answer("127.0.0.1", "old"), answer("127.0.0.2", "moved")
	hsetRoute(t, r, id, old)
	pc := h.dialProxy(t)
	if resp, body := pc.do("GET", host, "/", ""); resp.StatusCode != 200 || body != "old" {
		t.Fatalf("first request: %d %q", resp.StatusCode, body)
	}
	waitPoolConns(t, h, 1)
	hsetRoute(t, r, id, moved)
	if err := store.Publish(context.Background(), id); err != nil {
		t.Fatal(err)
	}
	// The invalidation comes through the subscription: until it does,
	// the old route is served, on its pooled connection, and a request
	// it finds waiting for the old address's answer is cut (502
	// route_changed, README: Proxy auth).
	cut := false
	testenv.WaitFor(t, 10*time.Second, "a request to reach the moved route", func() bool {
		resp, body := pc.do("GET", host, "/", "")
		if resp.Close {
			pc = h.dialProxy(t) // a cut closes its client connection
		}
		if resp.StatusCode == 502 && strings.Contains(body, `"code":"`+CodeRouteChanged+`"`) {
			cut = true
			return false
		}
		if resp.StatusCode != 200 || body != "old" && body != "moved" {
			t.Fatalf("during the move: %d %q", resp.StatusCode, body)
		}
		return body == "moved"
	})
	old.wantAccepted(t, 1, "(one connection, reused until the move)")
	moved.wantAccepted(t, 1, "(a new connection for the new address)")
	// The old one is closed, by a cut or by the first request to the new
	// node.
	if err := old.waitEnded(t); err != io.EOF {
		t.Fatalf("the old address's connection ended with %v (a request cut: %v), want EOF: the proxy closes it", err, cut)
	}
	waitPoolConns(t, h, 1)
}

// A route the control plane deletes from Redis (the hash removed, the id
// published) while a request waits for its answer: the invalidation makes
// the proxy read the route again, which cuts the waiting request (502
// route_changed) and closes the sandbox's idle connection at once; earlier
// builds left it open until upstream.idle_conn_timeout.
func TestIdleConnClosedWhenRouteGoneFromRedis(t *testing.T) {
	const id, host = "poolgone", "8080-poolgone.cube.test"
	r, store, h := subscribedRedisHarness(t)
	arrived, release := make(chan struct{}, 1), make(chan struct{})
	b := newScriptBackend(t, func(c net.Conn, req *http.Request, _ int) bool {
		if req.URL.Path == "/held" {
			holdOn(t, arrived, release)
			return false // ends with nil: told apart from the idle one's EOF
		}
		return rawWrite(c, okResponse("ok"))
	})
	defer close(release)
	hsetRoute(t, r, id, b)
	type answer struct {
		resp *http.Response
		body string
		err  error
	}
	held, pc := make(chan answer, 1), h.dialProxy(t)
	go func() {
		resp, body, err := pc.send("GET", host, "/held", "")
		held <- answer{resp, string(body), err}
	}()
	testenv.Recv(t, arrived, 10*time.Second, "the held request at the sandbox")
	// The held request has the first connection: this one gets a second,
	// idle once answered.
	if resp, body := h.dialProxy(t).do("GET", host, "/", ""); resp.StatusCode != 200 || body != "ok" {
		t.Fatalf("second request: %d %q", resp.StatusCode, body)
	}
	waitPoolConns(t, h, 2)
	if err := r.Client().Del(context.Background(), redisstore.DefaultKeyPrefix+id).Err(); err != nil {
		t.Fatal(err)
	}
	if err := store.Publish(context.Background(), id); err != nil {
		t.Fatal(err)
	}
	select {
	case a := <-held:
		if a.err != nil {
			t.Fatalf("held request: %v, want 502 %s", a.err, CodeRouteChanged)
		}
		checkProxyError(t, a.resp, a.body, 502, CodeRouteChanged)
	case <-time.After(10 * time.Second):
		t.Fatal("the held request was not cut within 10s of the route's deletion")
	}
	// The held connection's script is still waiting for release: the first
	// end is the idle connection's.
	if err := b.waitEnded(t); err != io.EOF {
		t.Fatalf("the idle connection ended with %v, want EOF: the proxy closes it", err)
	}
	waitPoolConns(t, h, 0)
}

// subscribedRedisHarness is a harness on a Redis store of its own,
// subscribed to the store's invalidations, with no admin route API.
func subscribedRedisHarness(t *testing.T) (*testenv.Redis, *redisstore.Store, *harness) {
	t.Helper()
	r, store := redisStore(t)
	h := newHarness(t, func(o *harnessOpts) {
		o.store = store
		o.noAdminRoutes = true
	})
	subscribe(t, store, h)
	return r, store, h
}

// hsetRoute writes sandbox id's route to Redis as the control plane does,
// created at 1, with its container port 8080 at b's address.
func hsetRoute(t *testing.T, r *testenv.Redis, id string, b *scriptBackend) {
	t.Helper()
	if err := r.Client().HSet(context.Background(), redisstore.DefaultKeyPrefix+id, "HostIP", b.ip,
		"SandboxIP", b.ip, "CreatedAt", "1", "8080", itoa(b.port)).Err(); err != nil {
		t.Fatal(err)
	}
}
