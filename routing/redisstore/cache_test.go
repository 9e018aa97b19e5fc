package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
	"github.com/cube-sandbox/cubeproxy/routing"
	"github.com/cube-sandbox/cubeproxy/routing/redisstore"
)

// fakeClock is a settable clock for routing.CacheConfig.Now.
type fakeClock struct{ offset atomic.Int64 }

func (c *fakeClock) Now() time.Time          { return time.Now().Add(time.Duration(c.offset.Load())) }
func (c *fakeClock) Advance(d time.Duration) { c.offset.Add(int64(d)) }
func newCache(t testing.TB, s routing.Store, cfg routing.CacheConfig) *routing.Cache {
	t.Helper()
	c, err := routing.NewCache(s, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// getAll runs n concurrent Gets (released together) over ids round-robin and
// returns the first unexpected error.
func getAll(c *routing.Cache, n int, ids []string, want error) error {
	start := make(chan struct{})
	var wg sync.WaitGroup
	var first atomic.Value
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			_, _, err := c.Get(context.Background(), []byte(ids[i%len(ids)]))
			if !errors.Is(err, want) && (err != nil || want != nil) {
				first.CompareAndSwap(nil, fmt.Errorf("get %s: %v", ids[i%len(ids)], err))
			}
		}()
	}
	close(start)
	wg.Wait()
	if err, ok := first.Load().(error); ok {
		return err
	}
	return nil
}

// TestCacheOneHGETALLPerMiss: 1000 concurrent requests for one uncached id
// reach Redis once (one flight per id in the cache; the store pipelines the
// HGETALL of the new key and of the legacy one).
func TestCacheOneHGETALLPerMiss(t *testing.T) {
	testenv.ParallelRedis(t)
	r := testenv.StartRedis(t)
	s := openStore(t, r)
	hset(t, r, redisstore.DefaultKeyPrefix+"hot", controlPlaneFields("10.0.0.5")...)
	c := newCache(t, s, routing.CacheConfig{})
	r.ResetStats(t)
	if err := getAll(c, 1000, []string{"hot"}, nil); err != nil {
		t.Fatal(err)
	}
	if n := r.CommandCount(t, "hgetall"); n != 2 {
		t.Fatalf("1000 concurrent gets made %d HGETALLs, want 2 (new + legacy key, once)", n)
	}
}

// TestCacheUnknownIDs: 1000 requests over 50 unknown ids make one HGETALL of
// the new key and one of the legacy key per id (a miss must read both), and
// nothing more while the negative entries live.
func TestCacheUnknownIDs(t *testing.T) {
	testenv.ParallelRedis(t)
	r := testenv.StartRedis(t)
	s := openStore(t, r)
	// A long negative TTL keeps the count exact on a slow machine.
	c := newCache(t, s, routing.CacheConfig{NegativeTTL: time.Minute})
	ids := make([]string, 50)
	for i := range ids {
		ids[i] = fmt.Sprintf("unknown-%d", i)
	}
	r.ResetStats(t)
	if err := getAll(c, 1000, ids, routing.ErrNotFound); err != nil {
		t.Fatal(err)
	}
	if n := r.CommandCount(t, "hgetall"); n != 2*len(ids) {
		t.Fatalf("1000 gets over %d unknown ids made %d HGETALLs, want %d (new + legacy key per id)", len(ids), n, 2*len(ids))
	}
}

// cachedRoute starts a Redis holding the route "cached" (HostIP 10.0.0.1)
// and returns a cache on a fake clock that has read it once.
func cachedRoute(t *testing.T) (*testenv.Redis, *routing.Cache, *fakeClock) {
	t.Helper()
	r := testenv.StartRedis(t)
	s := openStore(t, r)
	clock := &fakeClock{}
	c := newCache(t, s, routing.CacheConfig{Now: clock.Now})
	hset(t, r, redisstore.DefaultKeyPrefix+"cached", "HostIP", "10.0.0.1", "50005", "30001")
	if _, res, err := c.Get(context.Background(), []byte("cached")); err != nil || res != routing.CacheMiss {
		t.Fatalf("warm: %v %v", res, err)
	}
	return r, c, clock
}

// TestCacheRedisDown: with Redis killed a cached but expired route is served
// stale, an uncached id fails fast, and after a restart everything works again.
func TestCacheRedisDown(t *testing.T) {
	testenv.ParallelRedis(t)
	r, c, clock := cachedRoute(t)

	r.Stop()
	clock.Advance(701 * time.Second) // past every positive TTL
	route, res, err := c.Get(context.Background(), []byte("cached"))
	if err != nil || res != routing.CacheStale || route.HostIP != netip.MustParseAddr("10.0.0.1") {
		t.Fatalf("expired route with redis down: %v %v %v, want stale route", route, res, err)
	}
	start := time.Now()
	_, _, err = c.Get(context.Background(), []byte("uncached"))
	if took := time.Since(start); err == nil || errors.Is(err, routing.ErrNotFound) || took > 1500*time.Millisecond {
		t.Fatalf("uncached id with redis down: err %v after %s, want availability error < 1.5s", err, took)
	}

	r.Restart() // no persistence: the control plane would rewrite its routes
	hset(t, r, redisstore.DefaultKeyPrefix+"cached", "HostIP", "10.0.0.2", "50005", "30001")
	hset(t, r, redisstore.DefaultKeyPrefix+"uncached", "HostIP", "10.0.0.3", "50005", "30001")
	route, res, err = c.Get(context.Background(), []byte("uncached"))
	if err != nil || res != routing.CacheMiss || route.HostIP != netip.MustParseAddr("10.0.0.3") {
		t.Fatalf("uncached after restart: %v %v %v, want fresh route on 10.0.0.3", route, res, err)
	}
	eventuallyFresh(t, c, clock, "cached", "10.0.0.2")
}

// eventuallyFresh wants the cache to give id's route on host, not stale,
// within a few seconds. The first Get after a store comes back may serve a
// route it failed to re-read, the re-read running in the background; a
// re-read that hung before the store came back may store what the store
// held then for a whole TTL, so each try moves the clock past it.
func eventuallyFresh(t *testing.T, c *routing.Cache, clock *fakeClock, id, host string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		clock.Advance(701 * time.Second)
		route, res, err := c.Get(context.Background(), []byte(id))
		if err == nil && res != routing.CacheStale && route.HostIP == netip.MustParseAddr(host) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %v %v %v, want the fresh route on %s within 5s", id, route, res, err, host)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestCacheRedisStalled: a Redis that takes connections and answers
// nothing (SIGSTOP; a hung host looks the same) is "unreachable" as the
// README means it, as a killed one is: a cached but expired route is
// served stale once the lookup budget runs out, never an error, and an
// uncached id is an availability error (503), never "not found", within
// about the budget. The stall ends in the store's deadline or the cache's
// own timer, a path TestCacheRedisDown (a refused dial) never takes.
func TestCacheRedisStalled(t *testing.T) {
	testenv.ParallelRedis(t)
	r, c, clock := cachedRoute(t)

	r.Pause()
	t.Cleanup(r.Resume)
	clock.Advance(701 * time.Second) // past every positive TTL
	start := time.Now()
	route, res, err := c.Get(context.Background(), []byte("cached"))
	if err != nil || res != routing.CacheStale || route.HostIP != netip.MustParseAddr("10.0.0.1") {
		t.Fatalf("expired route with redis stalled: %v %v %v, want the stale route", route, res, err)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("stale route with redis stalled after %v, want about the 1s budget", took)
	}
	start = time.Now()
	_, _, err = c.Get(context.Background(), []byte("uncached"))
	if took := time.Since(start); err == nil || errors.Is(err, routing.ErrNotFound) || took > 2*time.Second {
		t.Fatalf("uncached id with redis stalled: err %v after %s, want an availability error within about 1s", err, took)
	}
	// Past the stale entry's retry pause Redis is asked again, but the
	// request does not wait for it (it waited the whole budget once every
	// three seconds for as long as the stall lasted).
	for i := range 3 {
		clock.Advance(time.Minute)
		start = time.Now()
		route, res, err = c.Get(context.Background(), []byte("cached"))
		if took := time.Since(start); err != nil || res != routing.CacheStale || route.HostIP != netip.MustParseAddr("10.0.0.1") || took > 300*time.Millisecond {
			t.Fatalf("retry %d with redis stalled: %v %v %v after %v, want the stale route at once", i+1, route, res, err, took)
		}
	}

	r.Resume()
	hset(t, r, redisstore.DefaultKeyPrefix+"cached", "HostIP", "10.0.0.2", "50005", "30001")
	eventuallyFresh(t, c, clock, "cached", "10.0.0.2")
}
