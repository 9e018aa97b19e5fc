package proxy

import (
	"context"
	"io"
	"net/http"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
	"github.com/cube-sandbox/cubeproxy/routing"
	"github.com/cube-sandbox/cubeproxy/routing/redisstore"
)

// redisStore is a Redis route store on a redis-server of the test's own.
func redisStore(t *testing.T) (*testenv.Redis, *redisstore.Store) {
	t.Helper()
	r := testenv.StartRedis(t)
	store, err := redisstore.Open(redisstore.Config{Addr: r.Addr()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close() })
	return r, store
}

// In Redis mode the control plane removes a sandbox by deleting its hash
// (and publishing the id), not always through meta/delete. The soak test
// found the state map one entry larger for every sandbox paused and then
// removed so: a paused entry is never swept, and nothing else forgot it.
// A sandbox created again under the id was answered 503 "paused" for the
// pause of the one removed. A running sandbox's entry stayed the day the
// sweep waits: under the platform's churn, one entry (and one last_active
// line) per sandbox removed, millions a day. A lookup that finds the route
// gone in Redis forgets the entry; a kill's tombstone stays (410 for its hour).
func TestRedisRemovedPausedSandboxIsForgotten(t *testing.T) {
	r, store := redisStore(t)
	h := newHarness(t, func(o *harnessOpts) { o.store = store })
	port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") }))
	rdb := r.Client()
	ctx := context.Background()
	write := func(id string, createdAt int) {
		t.Helper()
		key := redisstore.DefaultKeyPrefix + id
		if err := rdb.HSet(ctx, key, "HostIP", "127.0.0.1", "SandboxIP", "127.0.0.1",
			"CreatedAt", strconv.Itoa(createdAt), itoa(port), itoa(port)).Err(); err != nil {
			t.Fatalf("hset %s: %v", key, err)
		}
		h.cache.Invalidate(id) // as the subscriber does for the control plane's PUBLISH
	}

	const perCase = 20
	cases := []struct {
		state string
		kept  bool
		after int // status once the route is gone from Redis
		again int // status once a route is written again under the id
	}{
		{"running", false, 404, 200}, // had traffic: its last activity goes too
		{"paused", false, 404, 200},
		{"pausing", false, 404, 200},
		{"killed", true, 410, 200}, // a newer CreatedAt lifts the kill
	}
	for _, tc := range cases {
		t.Run(tc.state, func(t *testing.T) {
			before := sandboxCount(h.proxy)
			for i := range perCase {
				id := "gone-" + tc.state + "-" + strconv.Itoa(i)
				host := itoa(port) + "-" + id + ".cube.test"
				write(id, 1)
				if st, _, _ := h.get(host, "/"); st != 200 {
					t.Fatalf("GET %s: %d", id, st)
				}
				if tc.state == "killed" {
					h.proxy.kill(id)
				} else if st, body := h.adminDo("POST", "/admin/state", `{"sandbox_id":"`+id+`","state":"`+tc.state+`"}`, ""); st != 200 {
					t.Fatalf("state %s: %d %s", tc.state, st, body)
				}
				if err := rdb.Del(ctx, redisstore.DefaultKeyPrefix+id).Err(); err != nil {
					t.Fatal(err)
				}
				h.cache.Invalidate(id)
				if st, _, _ := h.get(host, "/"); st != tc.after {
					t.Fatalf("GET %s removed from Redis: %d, want %d", id, st, tc.after)
				}
			}
			want := before
			if tc.kept {
				want += perCase
			}
			testenv.WaitFor(t, 5*time.Second, "sandbox entries back to "+strconv.Itoa(want), func() bool {
				return sandboxCount(h.proxy) == want
			})
			// Created again (a new CreatedAt), the sandbox is a new one.
			id := "gone-" + tc.state + "-0"
			write(id, int(time.Now().UnixNano()))
			if st, _, _ := h.get(itoa(port)+"-"+id+".cube.test", "/"); st != tc.again {
				t.Fatalf("GET %s created again: %d, want %d", id, st, tc.again)
			}
		})
	}
}

// The negative cache does not forget a pause: its answer may predate a
// route written since, and only the store's own "not found" says the
// sandbox is gone.
func TestRedisNegativeHitKeepsPause(t *testing.T) {
	r, store := redisStore(t)
	h := newHarness(t, func(o *harnessOpts) {
		o.store = store
		o.cache.NegativeTTL = time.Hour // the 404 below is answered from it, however slow the machine
	})
	port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") }))
	const id = "paused-early"
	host := itoa(port) + "-" + id + ".cube.test"
	// Unknown: the 404 is cached.
	if st, _, _ := h.get(host, "/"); st != 404 {
		t.Fatalf("GET unknown: %d, want 404", st)
	}
	// The control plane writes the route and pauses the sandbox; a request
	// answered from the negative cache meanwhile must not undo the pause.
	if err := r.Client().HSet(context.Background(), redisstore.DefaultKeyPrefix+id, "HostIP", "127.0.0.1",
		"SandboxIP", "127.0.0.1", "CreatedAt", "1", itoa(port), itoa(port)).Err(); err != nil {
		t.Fatal(err)
	}
	if st, body := h.adminDo("POST", "/admin/state", `{"sandbox_id":"`+id+`","state":"paused"}`, ""); st != 200 {
		t.Fatalf("state: %d %s", st, body)
	}
	if st, _, _ := h.get(host, "/"); st != 404 {
		t.Fatalf("GET from the negative cache: %d, want 404", st)
	}
	h.cache.Invalidate(id)
	if st, _, _ := h.get(host, "/"); st != 503 {
		t.Fatalf("GET paused sandbox: %d, want 503", st)
	}
}

// An instance that gets no request for a sandbox (most of them, behind a
// balancer) learns of its removal only from the control plane's PUBLISH:
// the subscriber hands the id to the proxy, which reads the route again
// (at once for a paused sandbox, in the janitor's next round for a
// running one) and forgets the sandbox's entry (its pause, its last
// activity) when Redis no longer has it. A sandbox whose route is still
// there is kept, paused or not.
func TestRedisInvalidationForgetsRemovedPause(t *testing.T) {
	r, store := redisStore(t)
	h := newHarness(t, func(o *harnessOpts) { o.store = store })
	sub := subscribe(t, store, h)
	rdb := r.Client()
	ctx := context.Background()
	const perCase = 20
	cases := []struct {
		state  string
		remove bool // delete the route before publishing
		kept   bool
	}{
		{"running", true, false}, // its entry and last_active line go too
		{"paused", true, false},
		{"pausing", true, false},
		{"paused", false, true},  // only changed: still paused
		{"running", false, true}, // only changed: still known
	}
	for _, tc := range cases {
		t.Run(tc.state+"/remove="+strconv.FormatBool(tc.remove), func(t *testing.T) {
			before, applied := sandboxCount(h.proxy), sub.Applied()
			ids := make([]string, perCase)
			for i := range ids {
				ids[i] = "pub-" + tc.state + "-" + strconv.FormatBool(tc.remove) + "-" + strconv.Itoa(i)
				key := redisstore.DefaultKeyPrefix + ids[i]
				if err := rdb.HSet(ctx, key, "HostIP", "127.0.0.1", "SandboxIP", "127.0.0.1", "CreatedAt", "1", "8080", "8080").Err(); err != nil {
					t.Fatal(err)
				}
				if st, body := h.adminDo("POST", "/admin/state", `{"sandbox_id":"`+ids[i]+`","state":"`+tc.state+`"}`, ""); st != 200 {
					t.Fatalf("state: %d %s", st, body)
				}
				if tc.remove {
					if err := rdb.Del(ctx, key).Err(); err != nil {
						t.Fatal(err)
					}
				}
				if err := store.Publish(ctx, ids[i]); err != nil {
					t.Fatal(err)
				}
			}
			if tc.state == "running" {
				// A running sandbox is asked about by the janitor's
				// round, once a minute, not at once by every instance.
				testenv.WaitFor(t, 5*time.Second, "invalidations applied", func() bool {
					return sub.Applied() >= applied+perCase
				})
				h.proxy.recheckInvalidated(context.Background())
			}
			if tc.kept {
				testenv.WaitFor(t, 5*time.Second, "invalidations applied", func() bool {
					return sub.Applied() >= applied+perCase
				})
				if n := sandboxCount(h.proxy); n != before+perCase {
					t.Fatalf("%d sandbox entries, want %d: a sandbox still in Redis was forgotten", n, before+perCase)
				}
				if tc.state == "running" {
					return
				}
				for _, id := range ids {
					if st, _, _ := h.get("8080-"+id+".cube.test", "/"); st != 503 {
						t.Fatalf("GET %s: %d, want 503 (still paused)", id, st)
					}
				}
				return
			}
			testenv.WaitFor(t, 5*time.Second, "sandbox entries back to "+strconv.Itoa(before), func() bool {
				return sandboxCount(h.proxy) == before
			})
		})
	}
}

// The re-read a paused sandbox's invalidation starts may find Redis unable
// to answer (here paused by CLIENT PAUSE, past LookupTimeout): the sandbox
// is then left for the janitor's round, which forgets it once Redis says
// its route is gone. Before, the one failed read was all it got, and the
// pause stayed for good (a paused entry is never swept, only rechecked
// after a day).
func TestRedisInvalidationRereadRetried(t *testing.T) {
	t.Parallel()
	r, store := redisStore(t)
	h := newHarness(t, func(o *harnessOpts) {
		o.store = store
		o.cache.LookupTimeout = 200 * time.Millisecond
	})
	rdb := r.Client()
	ctx := context.Background()
	const id = "reread-retried"
	key := redisstore.DefaultKeyPrefix + id
	if err := rdb.HSet(ctx, key, "HostIP", "127.0.0.1", "SandboxIP", "127.0.0.1", "CreatedAt", "1", "8080", "8080").Err(); err != nil {
		t.Fatal(err)
	}
	if st, body := h.adminDo("POST", "/admin/state", `{"sandbox_id":"`+id+`","state":"paused"}`, ""); st != 200 {
		t.Fatalf("state: %d %s", st, body)
	}
	sb := h.proxy.sandboxes.peek(id)
	if sb == nil {
		t.Fatal("no entry for the paused sandbox")
	}
	if err := rdb.Del(ctx, key).Err(); err != nil {
		t.Fatal(err)
	}
	// Redis answers no client for the next 4 s: far past LookupTimeout.
	// (CLIENT UNPAUSE would be paused too.)
	if err := rdb.ClientPause(ctx, 4*time.Second).Err(); err != nil {
		t.Fatal(err)
	}
	h.proxy.Invalidate(id) // as the subscriber does for the control plane's PUBLISH
	testenv.WaitFor(t, 10*time.Second, "the failed re-read to leave the sandbox for the janitor", sb.unsure.Load)
	if e := h.proxy.sandboxes.peek(id); e != sb || sb.state() != statePaused {
		t.Fatalf("entry after a re-read Redis did not answer: %p (was %p), want it kept, paused", e, sb)
	}
	testenv.WaitFor(t, 10*time.Second, "Redis to answer again", func() bool { return rdb.Ping(ctx).Err() == nil })
	// The janitor's rounds, until one's re-read succeeds: the first
	// after the pause may still miss the 200 ms LookupTimeout on a loaded
	// machine (its connection redialled), and leaves the entry unsure
	// for the next round, as a failed re-read does.
	testenv.WaitFor(t, 10*time.Second, "the janitor's rounds to forget the paused sandbox removed from Redis", func() bool {
		h.proxy.recheckInvalidated(ctx)
		return h.proxy.sandboxes.peek(id) == nil
	})
}

// firstGatedStore counts every lookup of the real store behind it, and
// holds the answer of the first one, closing entered, until gate is closed.
type firstGatedStore struct {
	routing.Store
	entered chan struct{}
	gate    chan struct{}
	n       atomic.Int64
}

func newFirstGatedStore(s routing.Store) *firstGatedStore {
	return &firstGatedStore{Store: s, entered: make(chan struct{}), gate: make(chan struct{})}
}

func (g *firstGatedStore) Lookup(ctx context.Context, id string) (*routing.Route, error) {
	n := g.n.Add(1)
	r, err := g.Store.Lookup(ctx, id)
	if n == 1 {
		close(g.entered)
		<-g.gate
	}
	return r, err
}

// subscribedHarness is a harness over the Redis store behind gs, with the
// proxy subscribed to the invalidation channel.
func subscribedHarness(t *testing.T, store *redisstore.Store, gs *firstGatedStore) (*harness, *redisstore.Subscriber) {
	t.Helper()
	h := newHarness(t, func(o *harnessOpts) {
		o.store = gs
		o.cache.LookupTimeout = time.Minute // the held read must not time out, however slow the machine
	})
	return h, subscribe(t, store, h)
}

// subscribe subscribes h's proxy to store's invalidation channel and waits
// until Redis has the subscription.
func subscribe(t *testing.T, store *redisstore.Store, h *harness) *redisstore.Subscriber {
	t.Helper()
	sub := store.Subscribe(context.Background(), h.proxy, nil)
	t.Cleanup(func() { _ = sub.Close() })
	select {
	case <-sub.Ready():
	case <-time.After(10 * time.Second):
		t.Fatal("not subscribed within 10s")
	}
	return sub
}

// pausedInRedis writes id's route to Redis and pauses it through h.
func pausedInRedis(t *testing.T, h *harness, r *testenv.Redis, id string) {
	t.Helper()
	if err := r.Client().HSet(context.Background(), redisstore.DefaultKeyPrefix+id, "HostIP", "127.0.0.1",
		"SandboxIP", "127.0.0.1", "CreatedAt", "1", "8080", "8080").Err(); err != nil {
		t.Fatal(err)
	}
	if st, body := h.adminDo("POST", "/admin/state", `{"sandbox_id":"`+id+`","state":"paused"}`, ""); st != 200 {
		t.Fatalf("state: %d %s", st, body)
	}
}

// Whoever may PUBLISH on the invalidation channel can send one paused
// sandbox's id as fast as Redis relays it. Each message started a
// goroutine that read the route again, and since each also dropped the
// read in flight (Invalidate), each read was a store call of its own: a
// million messages made 24,000 goroutines at once, 30,000 lookups and
// 230 MB more memory that stayed. A burst is one read in flight per
// sandbox, and one more after it for the messages that came meanwhile
// (the first read may predate the change they announce).
func TestRedisInvalidationFloodOfPausedSandboxReadsOnce(t *testing.T) {
	r, store := redisStore(t)
	gs := newFirstGatedStore(store)
	h, sub := subscribedHarness(t, store, gs)
	const id, flood = "flooded", 2000
	pausedInRedis(t, h, r, id)
	applied := sub.Applied()
	ctx := context.Background()
	if _, err := r.Client().Pipelined(ctx, func(p redis.Pipeliner) error {
		for range flood {
			p.Publish(ctx, redisstore.DefaultInvalidateChannel, id)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 10*time.Second, "the flood applied", func() bool { return sub.Applied() >= applied+flood })
	close(gs.gate)
	testenv.WaitGroup(t, &h.proxy.bg.wg, 10*time.Second, "the re-reads of the flood to end")
	if n := gs.n.Load(); n > 2 {
		t.Fatalf("%d route reads for a burst of %d invalidations of one paused sandbox, want at most 2", n, flood)
	}
	if st, _, _ := h.get("8080-"+id+".cube.test", "/"); st != 503 {
		t.Fatalf("GET %s: %d, want 503 (still paused)", id, st)
	}
}

// The read an invalidation starts may have read the route before the
// change the next invalidation announces: the control plane deleted the
// paused sandbox meanwhile. Coalesced, that next one still reads again,
// and the pause is forgotten.
func TestRedisInvalidationDuringRereadReadsAgain(t *testing.T) {
	r, store := redisStore(t)
	gs := newFirstGatedStore(store)
	h, sub := subscribedHarness(t, store, gs)
	const id = "deleted-meanwhile"
	pausedInRedis(t, h, r, id)
	before := sandboxCount(h.proxy)
	ctx := context.Background()
	if err := store.Publish(ctx, id); err != nil {
		t.Fatal(err)
	}
	testenv.Recv(t, gs.entered, 10*time.Second, "the invalidation's re-read in the store") // read: the route is there
	applied := sub.Applied()
	if err := r.Client().Del(ctx, redisstore.DefaultKeyPrefix+id).Err(); err != nil {
		t.Fatal(err)
	}
	if err := store.Publish(ctx, id); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 10*time.Second, "the second invalidation applied", func() bool { return sub.Applied() > applied })
	close(gs.gate)
	testenv.WaitGroup(t, &h.proxy.bg.wg, 10*time.Second, "the invalidations' re-reads to end")
	if n := sandboxCount(h.proxy); n != before-1 {
		t.Fatalf("%d sandbox entries, want %d: the pause of a sandbox deleted from Redis was kept", n, before-1)
	}
}
