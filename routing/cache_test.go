package routing

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// countingStore counts Lookup calls; what it answers is set per test. It
// exists only where the number of store calls is what is being tested.
type countingStore struct {
	calls atomic.Int64
	mu    sync.Mutex
	fn    func(ctx context.Context, id string) (*Route, error)
}

func (s *countingStore) Lookup(ctx context.Context, id string) (*Route, error) {
	s.calls.Add(1)
	s.mu.Lock()
	fn := s.fn
	s.mu.Unlock()
	return fn(ctx, id)
}

func (s *countingStore) set(fn func(ctx context.Context, id string) (*Route, error)) {
	s.mu.Lock()
	s.fn = fn
	s.mu.Unlock()
}

func newCountingStore(fn func(ctx context.Context, id string) (*Route, error)) *countingStore {
	s := &countingStore{}
	s.set(fn)
	return s
}

func routeFor(id string) *Route {
	return &Route{ID: id, HostIP: netip.MustParseAddr("10.0.0.1"), Public: true, Ports: map[uint16]uint16{80: 8080}}
}

func answerRoute(_ context.Context, id string) (*Route, error) { return routeFor(id), nil }
func answerNotFound(context.Context, string) (*Route, error)   { return nil, ErrNotFound }

var errStoreDown = errors.New("redis: connection refused")

func answerDown(context.Context, string) (*Route, error) { return nil, errStoreDown }

// fakeClock is an injectable CacheConfig.Now.
type fakeClock struct{ ns atomic.Int64 }

func newFakeClock() *fakeClock {
	c := &fakeClock{}
	c.ns.Store(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	return c
}
func (c *fakeClock) Now() time.Time          { return time.Unix(0, c.ns.Load()) }
func (c *fakeClock) Advance(d time.Duration) { c.ns.Add(int64(d)) }

var testCacheConfig = CacheConfig{
	Size: 1000, NegativeSize: 100,
	TTLMin: 500 * time.Second, TTLMax: 700 * time.Second,
	NegativeTTL: 2 * time.Second, LookupTimeout: time.Second,
}

func newTestCache(t testing.TB, store Store, clock *fakeClock) *Cache {
	t.Helper()
	cfg := testCacheConfig
	if clock != nil {
		cfg.Now = clock.Now
	}
	c, err := NewCache(store, cfg)
	if err != nil {
		t.Fatal(err)
	}
	// In a synctest bubble, a kept store-call goroutine still waiting
	// for its next call when the test ends is a deadlock.
	t.Cleanup(c.Close)
	return c
}

func get(t testing.TB, c *Cache, id string) (*Route, CacheResult, error) {
	t.Helper()
	return c.Get(context.Background(), []byte(id))
}

// settle waits until c has no store call in progress, so that a test
// counts the calls a Get started without waiting for them.
func settle(t testing.TB, c *Cache) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		c.mu.Lock()
		n := len(c.flights)
		c.mu.Unlock()
		if n == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d store calls still in progress after 5s", n)
		}
		time.Sleep(time.Millisecond)
	}
}

func expect(t testing.TB, c *Cache, s *countingStore, id string, wantRes CacheResult, wantErr error, wantCalls int64) *Route {
	t.Helper()
	r, res, err := get(t, c, id)
	if res != wantRes || !errors.Is(err, wantErr) {
		t.Fatalf("Get(%s) = %v, %v, %v; want %v, %v", id, r, res, err, wantRes, wantErr)
	}
	if res == CacheStale {
		settle(t, c) // a stale answer may leave its re-read running
	}
	if wantErr == nil && (r == nil || r.ID != id) {
		t.Fatalf("Get(%s) returned route %+v", id, r)
	}
	if n := s.calls.Load(); n != wantCalls {
		t.Fatalf("after Get(%s): %d store calls, want %d", id, n, wantCalls)
	}
	return r
}

func TestNewCacheConfig(t *testing.T) {
	s := newCountingStore(answerRoute)
	c, err := NewCache(s, CacheConfig{})
	if err != nil {
		t.Fatal(err)
	}
	want := CacheConfig{Size: DefaultCacheSize, NegativeSize: DefaultNegativeSize, TTLMin: DefaultTTLMin,
		TTLMax: DefaultTTLMax, NegativeTTL: DefaultNegativeTTL, LookupTimeout: DefaultLookupTimeout}
	got := c.cfg
	got.Now = nil
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("defaults = %+v", c.cfg)
	}
	// DESIGN.md's numbers, spelled out: comparing with the constants
	// above alone would pass whatever they were changed to.
	if got.TTLMin != 500*time.Second || got.TTLMax != 700*time.Second || got.NegativeTTL != 2*time.Second {
		t.Errorf("defaults: TTL %v-%v, negative %v; the contract is 500-700 s and about 2 s", got.TTLMin, got.TTLMax, got.NegativeTTL)
	}
	if c, err := NewCache(s, CacheConfig{TTLMin: time.Hour}); err != nil || c.cfg.TTLMax != time.Hour {
		t.Fatalf("TTLMin above the default max: %v, %v", c, err)
	}
	for _, bad := range []CacheConfig{
		{Size: -1},
		{TTLMin: 10 * time.Second, TTLMax: 5 * time.Second},
		{NegativeTTL: -time.Second},
		{LookupTimeout: -time.Second},
	} {
		if _, err := NewCache(s, bad); err == nil {
			t.Errorf("NewCache(%+v) succeeded", bad)
		}
	}
	if _, err := NewCache(nil, CacheConfig{}); err == nil {
		t.Error("NewCache(nil store) succeeded")
	}
}

// Each entry's TTL is drawn from the whole of [TTLMin, TTLMax], both ends
// included, so that routes cached together (a burst after a restart) do
// not expire together; a draw from part of the range, or one short of
// TTLMax, spreads them less than the configuration says.
func TestCacheTTLSpansItsRange(t *testing.T) {
	for _, tc := range []struct{ min, max time.Duration }{
		{100, 103},
		{time.Second, time.Second},
	} {
		c, err := NewCache(newCountingStore(answerRoute), CacheConfig{TTLMin: tc.min, TTLMax: tc.max})
		if err != nil {
			t.Fatal(err)
		}
		seen := map[time.Duration]bool{}
		for range 1000 { // each of 4 values missed by all: (3/4)^1000
			d := c.ttl()
			if d < tc.min || d > tc.max {
				t.Fatalf("ttl %v outside [%v, %v]", d, tc.min, tc.max)
			}
			seen[d] = true
		}
		if want := int(tc.max-tc.min) + 1; len(seen) != want {
			t.Errorf("[%v, %v]: %d distinct TTLs drawn, want %d", tc.min, tc.max, len(seen), want)
		}
	}
}

func TestCacheHitAndMiss(t *testing.T) {
	s := newCountingStore(answerRoute)
	c := newTestCache(t, s, newFakeClock())
	first := expect(t, c, s, "a", CacheMiss, nil, 1)
	if second := expect(t, c, s, "a", CacheHit, nil, 1); second != first {
		t.Fatal("hit returned a different route")
	}
	// The key must be a copy: reusing the caller's buffer must not corrupt it.
	buf := []byte("b")
	c.Get(context.Background(), buf)
	buf[0] = 'z'
	expect(t, c, s, "b", CacheHit, nil, 2)
	if c.Len() != 2 || c.NegativeLen() != 0 {
		t.Fatalf("Len %d NegativeLen %d", c.Len(), c.NegativeLen())
	}
}

// 100 concurrent Gets for one unknown id make one store call (one flight per id).
func TestCacheSingleflight(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		s := newCountingStore(func(context.Context, string) (*Route, error) {
			<-release
			return nil, ErrNotFound
		})
		c := newTestCache(t, s, nil)
		const n = 100
		results := make(chan error, n)
		for range n {
			go func() {
				_, _, err := c.Get(context.Background(), []byte("unknown"))
				results <- err
			}()
		}
		synctest.Wait() // every Get is waiting on the one flight
		close(release)
		for range n {
			if err := <-results; !errors.Is(err, ErrNotFound) {
				t.Fatalf("Get = %v, want ErrNotFound", err)
			}
		}
		if got := s.calls.Load(); got != 1 {
			t.Fatalf("%d store calls, want 1", got)
		}
		expect(t, c, s, "unknown", CacheNegativeHit, ErrNotFound, 1)
	})
}

func TestCacheNegativeEntries(t *testing.T) {
	clock := newFakeClock()
	s := newCountingStore(answerNotFound)
	c := newTestCache(t, s, clock)
	expect(t, c, s, "gone", CacheMiss, ErrNotFound, 1)
	expect(t, c, s, "gone", CacheNegativeHit, ErrNotFound, 1)
	clock.Advance(testCacheConfig.NegativeTTL - 1)
	expect(t, c, s, "gone", CacheNegativeHit, ErrNotFound, 1)
	clock.Advance(1)
	expect(t, c, s, "gone", CacheMiss, ErrNotFound, 2)

	// An invalid route is cached negatively too, and keeps its FieldError.
	fe := &FieldError{Field: FieldAllowPublicTraffic, Reason: "bad"}
	s.set(func(context.Context, string) (*Route, error) { return nil, fe })
	for i, want := range []CacheResult{CacheMiss, CacheNegativeHit} {
		_, res, err := get(t, c, "broken")
		var got *FieldError
		if res != want || !errors.As(err, &got) || got != fe {
			t.Fatalf("Get #%d = %v, %v; want %v with the FieldError", i, res, err, want)
		}
	}
	if s.calls.Load() != 3 {
		t.Fatalf("%d store calls, want 3", s.calls.Load())
	}
	// A sandbox that appears after its negative entry expired is found.
	s.set(answerRoute)
	clock.Advance(testCacheConfig.NegativeTTL)
	expect(t, c, s, "gone", CacheMiss, nil, 4)
	expect(t, c, s, "gone", CacheHit, nil, 4)
}

func TestCacheTTLJitter(t *testing.T) {
	clock := newFakeClock()
	s := newCountingStore(answerRoute)
	c := newTestCache(t, s, clock)
	const n = 200
	start := clock.Now().UnixNano()
	distinct := map[int64]bool{}
	for i := range n {
		id := fmt.Sprint("box-", i)
		get(t, c, id)
		e, ok := c.pos.Peek(id)
		if !ok {
			t.Fatalf("%s not cached", id)
		}
		ttl := time.Duration(e.expires - start)
		if ttl < testCacheConfig.TTLMin || ttl > testCacheConfig.TTLMax {
			t.Fatalf("TTL %s outside [%s, %s]", ttl, testCacheConfig.TTLMin, testCacheConfig.TTLMax)
		}
		distinct[e.expires] = true
	}
	if len(distinct) < n/2 {
		t.Fatalf("only %d distinct expiries for %d entries: no jitter", len(distinct), n)
	}
	// Just before TTLMin every entry is still fresh; at TTLMax every one is due.
	clock.Advance(testCacheConfig.TTLMin - 1)
	for i := range n {
		expect(t, c, s, fmt.Sprint("box-", i), CacheHit, nil, n)
	}
	clock.Advance(testCacheConfig.TTLMax - testCacheConfig.TTLMin + 1)
	for i := range n {
		expect(t, c, s, fmt.Sprint("box-", i), CacheMiss, nil, int64(n+i+1))
	}
}

func TestCacheInvalidate(t *testing.T) {
	s := newCountingStore(answerRoute)
	c := newTestCache(t, s, newFakeClock())
	expect(t, c, s, "a", CacheMiss, nil, 1)
	expect(t, c, s, "a", CacheHit, nil, 1)
	if n := c.Invalidate("a"); n != 1 {
		t.Fatalf("Invalidate(a) = %d, want 1", n)
	}
	expect(t, c, s, "a", CacheMiss, nil, 2)

	s.set(answerNotFound)
	expect(t, c, s, "b", CacheMiss, ErrNotFound, 3)
	if n := c.Invalidate("b"); n != 1 {
		t.Fatalf("Invalidate(b) = %d, want 1", n)
	}
	expect(t, c, s, "b", CacheMiss, ErrNotFound, 4)
	if n := c.Invalidate("never-seen"); n != 0 {
		t.Fatalf("Invalidate(never-seen) = %d, want 0", n)
	}
}

// A lookup that was in flight when the id was invalidated (or the whole
// cache expired) answers its callers but does not cache the (possibly
// old) route.
func TestCacheInvalidateDuringLookup(t *testing.T) {
	for name, invalidate := range invalidationsOfA {
		t.Run(name, func(t *testing.T) {
			entered, release := make(chan struct{}), make(chan struct{})
			old := routeFor("a")
			s := newCountingStore(func(context.Context, string) (*Route, error) {
				close(entered)
				<-release
				return old, nil
			})
			c := newTestCache(t, s, newFakeClock())
			done := getAsync(t, c, "a")
			<-entered
			invalidate(c)
			close(release)
			if r := <-done; r != old {
				t.Fatalf("in-flight caller got %v", r)
			}
			s.set(answerRoute)
			if r := expect(t, c, s, "a", CacheMiss, nil, 2); r == old {
				t.Fatal("the route read before the invalidation was cached")
			}
		})
	}
}

// getAsync runs get(c, id) on a goroutine of its own and sends the route
// it got.
func getAsync(t *testing.T, c *Cache, id string) <-chan *Route {
	done := make(chan *Route, 1)
	go func() {
		r, _, _ := get(t, c, id)
		done <- r
	}()
	return done
}

// invalidationsOfA are the two ways a cached route of id "a" is made
// void: Invalidate (an admin change, a pub/sub message) and ExpireAll (a
// Redis resubscription).
var invalidationsOfA = map[string]func(*Cache){
	"Invalidate": func(c *Cache) { c.Invalidate("a") },
	"ExpireAll":  func(c *Cache) { c.ExpireAll() },
}

// A Get that starts after Invalidate asks the store itself rather than
// joining a lookup that began before: a sandbox deleted through the admin
// API must not be served, even once, from a read that predates the delete.
// So with ExpireAll, which the Redis subscriber calls once resubscribed: a
// read begun before it may predate a change whose announcement was lost.
func TestCacheGetAfterInvalidateAsksAgain(t *testing.T) {
	for name, invalidate := range invalidationsOfA {
		t.Run(name, func(t *testing.T) {
			entered, release := make(chan struct{}), make(chan struct{})
			old := routeFor("a")
			var first atomic.Bool
			s := newCountingStore(func(context.Context, string) (*Route, error) {
				if first.CompareAndSwap(false, true) {
					close(entered)
					<-release
					return old, nil
				}
				return nil, ErrNotFound
			})
			c := newTestCache(t, s, newFakeClock())
			done := getAsync(t, c, "a")
			<-entered
			invalidate(c)
			r, _, err := get(t, c, "a")
			close(release)
			if !errors.Is(err, ErrNotFound) {
				t.Fatalf("Get after %s = %v, %v; want ErrNotFound from a new store read", name, r, err)
			}
			if r := <-done; r != old {
				t.Fatalf("in-flight caller got %v", r)
			}
			if n := s.calls.Load(); n != 2 {
				t.Fatalf("%d store calls, want 2", n)
			}
		})
	}
}

func TestCacheStaleIfError(t *testing.T) {
	clock := newFakeClock()
	s := newCountingStore(answerRoute)
	c := newTestCache(t, s, clock)
	first := expect(t, c, s, "a", CacheMiss, nil, 1)
	clock.Advance(testCacheConfig.TTLMax)
	s.set(answerDown)
	if r := expect(t, c, s, "a", CacheStale, nil, 2); r != first {
		t.Fatal("stale answer is not the cached route")
	}
	// While the store is failing, the stale route is served without asking it.
	clock.Advance(testCacheConfig.NegativeTTL - 1)
	expect(t, c, s, "a", CacheStale, nil, 2)
	// Then the store is tried again, the stale route served without
	// waiting for it; once it recovers the new route is used.
	clock.Advance(1)
	expect(t, c, s, "a", CacheStale, nil, 3)
	clock.Advance(testCacheConfig.NegativeTTL)
	s.set(answerRoute)
	if r := expect(t, c, s, "a", CacheStale, nil, 4); r != first {
		t.Fatal("stale answer is not the cached route")
	}
	if r := expect(t, c, s, "a", CacheHit, nil, 4); r == first {
		t.Fatal("refreshed route is the old one")
	}
	// A definite "not found" is never answered with the stale route.
	clock.Advance(testCacheConfig.TTLMax)
	s.set(answerNotFound)
	expect(t, c, s, "a", CacheMiss, ErrNotFound, 5)
	if c.Len() != 0 {
		t.Fatal("route kept after the store said it is gone")
	}
}

// A route whose re-read failed is served at once while the store is asked
// again: a store that hangs (a partition, a stopped Redis) made every
// request for the sandbox wait out LookupTimeout once per NegativeTTL, a
// second of every three for as long as it hung. The first failure is
// waited for (the store may only be slow), and so is the re-read after
// ExpireAll (invalidations may have been lost).
func TestCacheStaleRouteDoesNotWaitForAHungStore(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var hang atomic.Bool
		s := newCountingStore(func(ctx context.Context, id string) (*Route, error) {
			if hang.Load() {
				<-ctx.Done()
				return nil, ctx.Err()
			}
			return routeFor(id), nil
		})
		cfg := testCacheConfig
		c, err := NewCache(s, cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		first := expect(t, c, s, "a", CacheMiss, nil, 1)
		hang.Store(true)
		time.Sleep(cfg.TTLMax + 1)

		// get asks for a's route and wants the first one, as stale, after
		// waiting exactly wait; n is the store calls made by then.
		get := func(step string, wait time.Duration, n int64) {
			t.Helper()
			start := time.Now()
			r, res, err := c.Get(context.Background(), []byte("a"))
			if waited := time.Since(start); r != first || res != CacheStale || err != nil || waited != wait {
				t.Fatalf("%s: %v %v %v after %v, want the first route, stale, after %v", step, r, res, err, waited, wait)
			}
			synctest.Wait()
			if got := s.calls.Load(); got != n {
				t.Fatalf("%s: %d store calls, want %d", step, got, n)
			}
		}
		get("first failure", cfg.LookupTimeout, 2)
		get("within NegativeTTL of it", 0, 2)
		for i := range int64(3) {
			// Each re-read hangs for its budget, then leaves the store
			// alone for NegativeTTL.
			time.Sleep(cfg.LookupTimeout + cfg.NegativeTTL)
			get(fmt.Sprintf("re-read %d", i+1), 0, 3+i)
		}
		c.ExpireAll()
		time.Sleep(cfg.LookupTimeout) // the last re-read has given up
		get("after ExpireAll", cfg.LookupTimeout, 6)

		hang.Store(false)
		time.Sleep(cfg.NegativeTTL)
		get("the store back", 0, 7)
		if r := expect(t, c, s, "a", CacheHit, nil, 7); r == first {
			t.Fatal("the store's answer was not cached")
		}
	})
}

// A lookup that fails after the caller gave up on it (LookupTimeout) does
// not mark stale the route a later lookup stored meanwhile: that route is
// the store's current answer, and marking it would serve it as "store
// failing" (logged, counted stale) and keep the store from being asked for
// NegativeTTL.
func TestCacheLateFailureKeepsFresherRoute(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		s := newCountingStore(answerRoute)
		cfg := testCacheConfig
		cfg.LookupTimeout = 100 * time.Millisecond
		c, err := NewCache(s, cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		first := expect(t, c, s, "a", CacheMiss, nil, 1)
		time.Sleep(cfg.TTLMax + 1) // expired: the next Get asks the store
		s.set(func(ctx context.Context, id string) (*Route, error) {
			if s.calls.Load() == 2 {
				<-release // the slow lookup: past its caller's LookupTimeout
				return nil, errStoreDown
			}
			return routeFor(id), nil
		})
		// Its caller gets the old route once LookupTimeout passes.
		if r := expect(t, c, s, "a", CacheStale, nil, 2); r != first {
			t.Fatal("the timed-out lookup's caller did not get the old route")
		}
		fresh := expect(t, c, s, "a", CacheMiss, nil, 3)
		close(release)
		synctest.Wait() // the slow lookup has failed and stored what it stores
		if r := expect(t, c, s, "a", CacheHit, nil, 3); r != fresh {
			t.Fatal("the fresher route was replaced")
		}
	})
}

// ExpireAll re-reads every route and forgets unknown ids, but serves the
// old route while the store fails the re-read.
func TestCacheExpireAll(t *testing.T) {
	clock := newFakeClock()
	s := newCountingStore(answerRoute)
	c := newTestCache(t, s, clock)
	first := expect(t, c, s, "a", CacheMiss, nil, 1)
	s.set(answerNotFound)
	expect(t, c, s, "gone", CacheMiss, ErrNotFound, 2)
	if n := c.ExpireAll(); n != 2 {
		t.Fatalf("ExpireAll = %d, want 2", n)
	}
	expect(t, c, s, "gone", CacheMiss, ErrNotFound, 3) // negative entry dropped
	s.set(answerDown)
	if r := expect(t, c, s, "a", CacheStale, nil, 4); r != first {
		t.Fatal("store down after ExpireAll: not the cached route")
	}
	clock.Advance(testCacheConfig.NegativeTTL)
	s.set(answerRoute)
	expect(t, c, s, "a", CacheStale, nil, 5) // re-read in the background
	if r := expect(t, c, s, "a", CacheHit, nil, 5); r == first {
		t.Fatal("store back after ExpireAll: the old route")
	}
}

// ExpireAll starts a new generation: what is loaded after it is cached as
// usual, a route already served stale is re-read like any other, and a
// second ExpireAll expires the first one's re-reads.
func TestCacheExpireAllGenerations(t *testing.T) {
	clock := newFakeClock()
	s := newCountingStore(answerRoute)
	c := newTestCache(t, s, clock)
	expect(t, c, s, "a", CacheMiss, nil, 1)
	expect(t, c, s, "b", CacheMiss, nil, 2)
	c.ExpireAll()
	expect(t, c, s, "a", CacheMiss, nil, 3)
	expect(t, c, s, "a", CacheHit, nil, 3) // re-read in the new generation

	// b fails its re-read: served stale, and the store is left alone for
	// NegativeTTL, in the new generation as in the old.
	s.set(answerDown)
	expect(t, c, s, "b", CacheStale, nil, 4)
	expect(t, c, s, "b", CacheStale, nil, 4)
	// Another ExpireAll (a second reconnect) re-reads the stale route too.
	c.ExpireAll()
	expect(t, c, s, "b", CacheStale, nil, 5)
	expect(t, c, s, "b", CacheStale, nil, 5)
	s.set(answerNotFound)
	expect(t, c, s, "a", CacheMiss, ErrNotFound, 6)
	expect(t, c, s, "a", CacheNegativeHit, ErrNotFound, 6)
	c.ExpireAll()
	s.set(answerRoute)
	expect(t, c, s, "a", CacheMiss, nil, 7)
	expect(t, c, s, "a", CacheHit, nil, 7)
}

// ExpireAll touches no entry: the subscriber calls it on every reconnect,
// and walking 100k routes under mu made every miss wait 50–90 ms (see
// BenchmarkCacheExpireAll). A walk allocates the list of keys.
func TestCacheExpireAllNoAllocs(t *testing.T) {
	s := newCountingStore(answerRoute)
	c := newTestCache(t, s, nil)
	fillCache(t, c, scaleIDs("box", testCacheConfig.Size))
	if allocs := testing.AllocsPerRun(10, func() { c.ExpireAll() }); allocs != 0 {
		t.Errorf("ExpireAll over %d routes: %v allocs, want 0 (it must not walk the entries)", c.Len(), allocs)
	}
}

func TestCacheStoreErrorNotCached(t *testing.T) {
	s := newCountingStore(answerDown)
	c := newTestCache(t, s, newFakeClock())
	expect(t, c, s, "a", CacheMiss, errStoreDown, 1)
	expect(t, c, s, "a", CacheMiss, errStoreDown, 2)
	if c.Len() != 0 || c.NegativeLen() != 0 {
		t.Fatalf("transient error cached: Len %d NegativeLen %d", c.Len(), c.NegativeLen())
	}
	s.set(answerRoute)
	expect(t, c, s, "a", CacheMiss, nil, 3)
}

func TestCacheStorePanic(t *testing.T) {
	s := newCountingStore(func(context.Context, string) (*Route, error) { panic("boom") })
	c := newTestCache(t, s, newFakeClock())
	_, _, err := get(t, c, "a")
	if err == nil || !strings.Contains(err.Error(), "boom") {
		t.Fatalf("Get = %v, want the panic as an error", err)
	}
	s.set(answerRoute)
	expect(t, c, s, "a", CacheMiss, nil, 2)
}

// A store that hangs and ignores its context still cannot hold a caller
// past LookupTimeout. In a synctest bubble: on the real clock, a lookup
// goroutine not yet scheduled when the caller's timer fired left the store
// uncalled, and the count below was 0 on a loaded machine.
func TestCacheLookupTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		hang := make(chan struct{})
		defer close(hang) // before the bubble waits for its goroutines
		s := newCountingStore(func(context.Context, string) (*Route, error) {
			<-hang
			return nil, errStoreDown
		})
		cfg := testCacheConfig
		cfg.LookupTimeout = 100 * time.Millisecond
		c, err := NewCache(s, cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		for i := int64(1); i <= 2; i++ {
			start := time.Now()
			errc := make(chan error, 1)
			go func() {
				_, _, err := get(t, c, "a")
				errc <- err
			}()
			// The bubble's clock moves only when every goroutine in it is
			// blocked: a Get that the timer does not end is a deadlock,
			// which synctest reports.
			err := <-errc
			if !errors.Is(err, ErrLookupTimeout) {
				t.Fatalf("Get = %v, want ErrLookupTimeout", err)
			}
			// The grace a store that keeps its deadline gets to answer
			// with its own error (naming its server), then no longer.
			if elapsed := time.Since(start); elapsed != cfg.LookupTimeout+storeAnswerGrace {
				t.Fatalf("Get took %s with LookupTimeout %s", elapsed, cfg.LookupTimeout)
			}
			// The stuck lookup was forgotten: the next caller asks the store again.
			if n := s.calls.Load(); n != i {
				t.Fatalf("%d store calls, want %d", n, i)
			}
		}
	})
}

// The store call gets its own deadline, independent of the caller's context.
func TestCacheLookupDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newCountingStore(func(ctx context.Context, _ string) (*Route, error) {
			deadline, ok := ctx.Deadline()
			if !ok || time.Until(deadline) != testCacheConfig.LookupTimeout {
				return nil, fmt.Errorf("store ctx deadline %v %v", deadline, ok)
			}
			<-ctx.Done()
			return nil, ctx.Err()
		})
		c := newTestCache(t, s, nil)
		start := time.Now()
		_, _, err := get(t, c, "a")
		if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, ErrLookupTimeout) {
			t.Fatalf("Get = %v", err)
		}
		if d := time.Since(start); d != testCacheConfig.LookupTimeout {
			t.Fatalf("Get returned after %s", d)
		}
	})
}

// One caller giving up does not fail the others waiting on the same lookup.
func TestCacheCallerCancel(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		s := newCountingStore(func(_ context.Context, id string) (*Route, error) {
			<-release
			return routeFor(id), nil
		})
		c := newTestCache(t, s, nil)
		ctx, cancel := context.WithCancel(context.Background())
		errA := make(chan error, 1)
		routeB := make(chan *Route, 1)
		go func() {
			_, _, err := c.Get(ctx, []byte("a"))
			errA <- err
		}()
		go func() {
			r, _, err := c.Get(context.Background(), []byte("a"))
			if err != nil {
				t.Error(err)
			}
			routeB <- r
		}()
		synctest.Wait()
		cancel()
		if err := <-errA; !errors.Is(err, context.Canceled) {
			t.Fatalf("cancelled caller got %v", err)
		}
		close(release)
		if r := <-routeB; r == nil || r.ID != "a" {
			t.Fatalf("other caller got %v", r)
		}
		if s.calls.Load() != 1 {
			t.Fatalf("%d store calls, want 1", s.calls.Load())
		}
	})
}

// The cache in front of the real memory store: admin changes become
// visible after Invalidate.
func TestCacheWithMemoryStore(t *testing.T) {
	m := NewMemoryStore()
	c, err := NewCache(m, testCacheConfig)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := get(t, c, "box"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Get = %v, want ErrNotFound", err)
	}
	if err := m.Put(mustRoute(t, "box", "80", "8080")); err != nil {
		t.Fatal(err)
	}
	if _, res, _ := get(t, c, "box"); res != CacheNegativeHit {
		t.Fatalf("before invalidation: %v, want the negative entry", res)
	}
	c.Invalidate("box")
	if r, res, err := get(t, c, "box"); err != nil || res != CacheMiss || r.Ports[80] != 8080 {
		t.Fatalf("after invalidation: %v %v %v", r, res, err)
	}
}

func TestCacheHitNoAllocs(t *testing.T) {
	s := newCountingStore(func(_ context.Context, id string) (*Route, error) {
		if id == "gone" {
			return nil, ErrNotFound
		}
		return routeFor(id), nil
	})
	c := newTestCache(t, s, nil)
	ctx := context.Background()
	for _, id := range []string{"box", "gone"} {
		key := []byte(id)
		c.Get(ctx, key)
		allocs := testing.AllocsPerRun(100, func() { c.Get(ctx, key) })
		if allocs != 0 {
			t.Errorf("Get(%s) from cache: %v allocs, want 0", id, allocs)
		}
	}
}

// A miss reuses its wait timer: a new one per miss was ≈ 260 B of
// garbage in a cold-start burst, where every request misses. What a miss
// still allocates: its flight and the flight's channel, the id as a stored
// string, the cache entry, the load's deadline context, and this store's
// route and its ports map. singleflight's flights (a call, a channel per
// caller, a closure, a result) made 15.
func TestCacheMissAllocs(t *testing.T) {
	if raceDetectorOn {
		t.Skip("the race detector changes allocation counts (and sync.Pool drops items under it)")
	}
	c := newTestCache(t, newCountingStore(answerRoute), nil)
	ctx := context.Background()
	key := []byte("box")
	allocs := testing.AllocsPerRun(200, func() {
		c.Invalidate("box")
		if _, res, err := c.Get(ctx, key); res != CacheMiss || err != nil {
			t.Fatalf("Get after Invalidate: %v %v", res, err)
		}
	})
	// 18 with a new timer per miss, 15 with singleflight.
	if allocs > 11 {
		t.Errorf("a miss allocates %v times, want at most 11", allocs)
	}
}

func BenchmarkCacheHit(b *testing.B) {
	s := newCountingStore(answerRoute)
	c := newTestCache(b, s, nil)
	ctx := context.Background()
	keys := make([][]byte, 512)
	for i := range keys {
		keys[i] = fmt.Appendf(nil, "sandbox-%d", i)
		c.Get(ctx, keys[i])
	}
	b.Run("serial", func(b *testing.B) {
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			if _, res, _ := c.Get(ctx, keys[i%len(keys)]); res != CacheHit {
				b.Fatal(res)
			}
			i++
		}
	})
	b.Run("parallel", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			i := 0
			for pb.Next() {
				if _, res, _ := c.Get(ctx, keys[i%len(keys)]); res != CacheHit {
					b.Fatal(res)
				}
				i++
			}
		})
	})
}

// Changes moves with every announced change, and only then: a request
// that reads it around its own work knows whether one came meanwhile.
func TestCacheChangesCountsAnnouncements(t *testing.T) {
	c := newTestCache(t, NewMemoryStore(), nil)
	n := c.Changes()
	if _, _, err := c.Get(context.Background(), []byte("x")); err == nil {
		t.Fatal("lookup of an unknown id: no error")
	}
	if got := c.Changes(); got != n {
		t.Fatalf("a lookup moved Changes %d → %d", n, got)
	}
	c.Invalidate("x")
	if got := c.Changes(); got != n+1 {
		t.Fatalf("after Invalidate: %d, want %d", got, n+1)
	}
	c.ExpireAll()
	if got := c.Changes(); got != n+2 {
		t.Fatalf("after ExpireAll: %d, want %d", got, n+2)
	}
}

// A Store that answers neither a route nor an error (a bug in one written
// for the interface) is an outage, never a nil route: the proxy uses the
// route Get returns without error, and a nil one cached would fail every
// request for the sandbox until its TTL.
func TestCacheStoreAnsweringNothingIsAnError(t *testing.T) {
	s := newCountingStore(func(context.Context, string) (*Route, error) { return nil, nil })
	c := newTestCache(t, s, nil)
	for i := range 2 {
		r, _, err := get(t, c, "a")
		if err == nil || r != nil {
			t.Fatalf("Get %d: %v, %v; want an error and no route", i, r, err)
		}
		if !strings.Contains(err.Error(), "no route and no error") {
			t.Fatalf("Get %d: error %q does not say what the store did", i, err)
		}
	}
	if n := s.calls.Load(); n != 2 {
		t.Fatalf("%d store calls, want 2: the failure must not be cached", n)
	}
}

// A caller that found a route expired, and starts its own flight only
// after another flight's re-read failed and marked the route stale (it
// looked just before that flight's end), must ask the store: a stale
// route is no answer of the store's. Answered from the cache instead, it
// got the route of a failed read, reported as a fresh read (CacheMiss),
// and the store, back by then, was not asked.
func TestCacheFlightAfterAFailedReReadAsksTheStore(t *testing.T) {
	clock := newFakeClock()
	s := newCountingStore(answerRoute)
	c := newTestCache(t, s, clock)
	first := expect(t, c, s, "a", CacheMiss, nil, 1)
	clock.Advance(testCacheConfig.TTLMax)
	var raced atomic.Bool
	c.beforeJoin = func(id string) {
		if raced.Swap(true) {
			return // the other caller's own miss
		}
		// Between this caller's look at the cache (the route expired)
		// and its join: another caller's re-read fails, marks the route
		// stale and ends; then the store is back.
		s.set(answerDown)
		if r, res, err := get(t, c, id); r != first || res != CacheStale || err != nil {
			t.Errorf("the failed re-read: %v, %v, %v; want the cached route, stale", r, res, err)
		}
		s.set(answerRoute)
	}
	r, res, err := get(t, c, "a")
	if err != nil || res != CacheMiss || r == nil || r == first {
		t.Fatalf("Get after the failed re-read = %v, %v, %v; want the store's new route, a miss (the cached one is %v)", r, res, err, first)
	}
	if n := s.calls.Load(); n != 3 {
		t.Errorf("%d store calls, want 3 (the load, the failed re-read, this one's)", n)
	}
}
