package proxy

import (
	"context"
	"io"
	"net/http"
	"net/netip"
	"testing"

	"github.com/cube-sandbox/cubeproxy/routing/redisstore"
	"github.com/redis/go-redis/v9"
)

// With Redis, a sandbox the lifecycle manager restores at another address
// is served there once the call answers 200, though this instance still
// caches the route it read before the pause: the lifecycle manager writes
// the new route and then answers, and the announcement (PUBLISH) reaches
// this instance on another connection, maybe after that 200, or not at
// all. The route is read from the store again after a resume (the cached
// one kept should the store fail). Earlier builds served the cached route
// after the call, sending the request to the address the sandbox had
// before its pause, which may be another sandbox's by then.
func TestRedisResumedSandboxIsServedAtItsNewAddress(t *testing.T) {
	r, store := redisStore(t)
	rdb := r.Client()
	ctx := context.Background()
	key := redisstore.DefaultKeyPrefix + "sleepy"
	var newPort uint16
	sc := newFakeSidecar(t, func() int {
		// Restored elsewhere; the route written, not yet announced here.
		if err := rdb.HSet(ctx, key, itoa(oldPortForMove), itoa(newPort)).Err(); err != nil {
			t.Errorf("HSET the restored route: %v", err)
			return 500
		}
		return 200
	})
	h := newHarness(t, func(o *harnessOpts) {
		o.store = store
		o.cfg.ResumeAddr = sc.addr
		o.cfg.NodeIP = netip.MustParseAddr("127.0.0.2") // dial HostIP:<mapped port>
	})
	var host string
	host, newPort = servedAtOldAddress(t, h, rdb, key)
	h.setSandboxState("sleepy", "paused")
	st, body, _ := h.get(host, "/")
	if n := len(sc.seen()); n != 1 {
		t.Fatalf("%d resume calls, want 1", n)
	}
	if st != 200 || body != "new" {
		t.Errorf("after a resume that moved the sandbox: %d %q, want 200 from its new address", st, body)
	}
	// The next request is served from the route read after the resume.
	if st, body, _ := h.get(host, "/"); st != 200 || body != "new" {
		t.Errorf("the request after: %d %q, want 200 from the new address", st, body)
	}
}

// Without a lifecycle manager to call (lifecycle.sidecar_addr empty), the
// control plane resumes a paused sandbox itself and says so with
// /admin/state running. Restored from its snapshot, it may be at another
// address, which the control plane wrote to Redis; its announcement may
// reach this instance after the state, or not at all (the sidecar path
// above reads the route again for that reason). Earlier builds served the
// route cached before the pause, for up to its 500-700 s TTL: every
// request after the resume went to the sandbox's old address, which may
// be another sandbox's by then.
func TestRedisSandboxSetRunningIsServedAtItsNewAddress(t *testing.T) {
	for _, from := range []string{"paused", "pausing"} {
		t.Run(from, func(t *testing.T) {
			r, store := redisStore(t)
			rdb := r.Client()
			ctx := context.Background()
			key := redisstore.DefaultKeyPrefix + "sleepy"
			h := newHarness(t, func(o *harnessOpts) {
				o.store = store
				o.cfg.NodeIP = netip.MustParseAddr("127.0.0.2") // dial HostIP:<mapped port>
			})
			host, newPort := servedAtOldAddress(t, h, rdb, key)
			h.setSandboxState("sleepy", from)
			if st, body, _ := h.get(host, "/"); st != 503 || errorCode(t, body) != CodeSandboxPausing {
				t.Fatalf("while %s: %d %q, want 503 %s", from, st, body, CodeSandboxPausing)
			}
			// Restored elsewhere; the route written, not announced.
			if err := rdb.HSet(ctx, key, itoa(oldPortForMove), itoa(newPort)).Err(); err != nil {
				t.Fatal(err)
			}
			h.setSandboxState("sleepy", "running")
			if st, body, _ := h.get(host, "/"); st != 200 || body != "new" {
				t.Errorf("after running: %d %q, want 200 from the new address", st, body)
			}
		})
	}
}

// servedAtOldAddress starts the sandbox "sleepy"'s backend at its old
// address (answering "old") and the one it will be restored at ("new"),
// writes its route at key with the old one, and checks that h serves it
// from there. It returns the host to request and the new backend's port.
func servedAtOldAddress(t *testing.T, h *harness, rdb *redis.Client, key string) (host string, newPort uint16) {
	t.Helper()
	newPort = backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "new") }))
	oldPort := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "old") }))
	if err := rdb.HSet(context.Background(), key, "HostIP", "127.0.0.1", "SandboxIP", "127.0.0.1", "CreatedAt", "1",
		itoa(oldPortForMove), itoa(oldPort)).Err(); err != nil {
		t.Fatal(err)
	}
	host = itoa(oldPortForMove) + "-sleepy.cube.test"
	if st, body, _ := h.get(host, "/"); st != 200 || body != "old" {
		t.Fatalf("before the pause: %d %q", st, body)
	}
	return host, newPort
}
