package routing

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"runtime"
	"strconv"
	"testing"
	"testing/synctest"
	"time"
)

// goroutineID is the id in the first line of the caller's stack trace.
func goroutineID() int {
	var buf [64]byte
	b := buf[:runtime.Stack(buf[:], false)]
	b = bytes.TrimPrefix(b, []byte("goroutine "))
	id, _ := strconv.Atoi(string(b[:bytes.IndexByte(b, ' ')]))
	return id
}

// Misses one after another make their store calls on one kept goroutine,
// whose stack has grown to the store's depth: a new goroutine per miss
// grew a small stack by copying it, ≈ 5 % of the proxy's CPU in a
// cold-start burst. In a bubble, so that each miss comes once the kept
// goroutine waits for it again: one that came as the goroutine was still
// ending the last call (it answers before it waits) got a goroutine of
// its own, and the test failed 2 % of its runs (10 % under -race).
func TestCacheStoreCallsReuseAGoroutine(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ids := map[int]bool{}
		s := newCountingStore(func(_ context.Context, id string) (*Route, error) {
			ids[goroutineID()] = true // one call at a time: no race
			return routeFor(id), nil
		})
		c := newTestCache(t, s, nil)
		for i := range 20 {
			synctest.Wait()
			expect(t, c, s, fmt.Sprint("box", i), CacheMiss, nil, int64(i+1))
		}
		if len(ids) != 1 {
			t.Fatalf("20 misses in turn made their store calls on %d goroutines, want 1", len(ids))
		}
		c.Close()
	})
}

// Store calls beyond the kept goroutines (a store that hangs while ids
// keep missing) get goroutines of their own: a miss never waits for a
// kept one to come free, and no more than maxLoaders are kept.
func TestCacheStoreCallsBeyondKeptGoroutinesRunAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		s := newCountingStore(func(_ context.Context, id string) (*Route, error) {
			if id != "fast" {
				<-release
			}
			return routeFor(id), nil
		})
		c := newTestCache(t, s, nil)
		const hung = maxLoaders + 8
		done := make(chan error, hung)
		for i := range hung {
			go func() {
				_, _, err := get(t, c, fmt.Sprint("hung", i))
				done <- err
			}()
		}
		synctest.Wait()
		if n := c.loaders.Load(); n != maxLoaders {
			t.Fatalf("%d kept goroutines with %d calls hanging, want %d", n, hung, maxLoaders)
		}
		start := time.Now()
		if _, res, err := get(t, c, "fast"); res != CacheMiss || err != nil {
			t.Fatalf("a miss behind %d hanging calls: %v %v, want an answer", hung, res, err)
		}
		if d := time.Since(start); d != 0 {
			t.Fatalf("a miss behind %d hanging calls took %v (bubble time), want none", hung, d)
		}
		close(release)
		for range hung {
			if err := <-done; err != nil {
				t.Fatal(err)
			}
		}
		c.Close()
	})
}

// A kept goroutine ends once it has waited loaderIdle for a call, or at
// Close; a miss after Close is still answered.
func TestCacheKeptGoroutinesEnd(t *testing.T) {
	for _, end := range []string{"idle", "close"} {
		t.Run(end, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				s := newCountingStore(answerRoute)
				c := newTestCache(t, s, nil)
				expect(t, c, s, "box", CacheMiss, nil, 1)
				synctest.Wait()
				if n := c.loaders.Load(); n != 1 {
					t.Fatalf("%d kept goroutines after a miss, want 1", n)
				}
				if end == "idle" {
					time.Sleep(loaderIdle - time.Millisecond)
					synctest.Wait()
					if n := c.loaders.Load(); n != 1 {
						t.Fatalf("%d kept goroutines before loaderIdle, want 1", n)
					}
					time.Sleep(time.Millisecond)
				} else {
					c.Close()
				}
				synctest.Wait()
				if n := c.loaders.Load(); n != 0 {
					t.Fatalf("%d kept goroutines after %s, want 0", n, end)
				}
				expect(t, c, s, "other", CacheMiss, nil, 2)
				c.Close()
			})
		})
	}
}

// deepStore answers after using about 16 KiB of stack, as a go-redis
// pipeline call does.
type deepStore struct{}

//go:noinline
func deepen(n int) byte {
	var pad [512]byte
	pad[n%len(pad)] = byte(n)
	if n == 0 {
		return pad[0]
	}
	return deepen(n-1) + pad[n%len(pad)]
}

func (deepStore) Lookup(_ context.Context, id string) (*Route, error) {
	deepen(32)
	return routeFor(id), nil
}

// BenchmarkCacheMissDeepStore is a miss against a store that needs a deep
// stack: what a kept goroutine saves over a new one per miss.
func BenchmarkCacheMissDeepStore(b *testing.B) {
	c := newTestCache(b, deepStore{}, nil)
	ctx := context.Background()
	key := []byte("box")
	b.ReportAllocs()
	for b.Loop() {
		c.Invalidate("box")
		if _, res, err := c.Get(ctx, key); res != CacheMiss || err != nil {
			b.Fatal(res, err)
		}
	}
}

// A flight that lands after a caller gave up on it (the store ignored
// LookupTimeout) ends only itself: the flight started since for the id
// stays the one later misses join. Had it removed that one, every miss
// while a slow store call is abandoned and another in progress would
// start one more store call, the stampede the shared call exists to stop.
func TestCacheAbandonedFlightLandsAlone(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		first, second := make(chan struct{}), make(chan struct{})
		s := newCountingStore(nil)
		s.set(func(context.Context, string) (*Route, error) {
			if s.calls.Load() == 1 {
				<-first // ignores its deadline
				return nil, errStoreDown
			}
			<-second
			return routeFor("a"), nil
		})
		cfg := testCacheConfig
		cfg.LookupTimeout = 100 * time.Millisecond
		c, err := NewCache(s, cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if _, _, err := get(t, c, "a"); !errors.Is(err, ErrLookupTimeout) {
			t.Fatalf("Get on a hung store = %v, want ErrLookupTimeout", err)
		}
		results := make(chan error, 2)
		getA := func() {
			_, _, err := get(t, c, "a")
			results <- err
		}
		go getA() // starts the second flight
		synctest.Wait()
		close(first) // the abandoned flight lands now
		synctest.Wait()
		go getA() // must join the second flight
		synctest.Wait()
		close(second)
		for range 2 {
			if err := <-results; err != nil {
				t.Fatalf("Get = %v, want the route", err)
			}
		}
		if n := s.calls.Load(); n != 2 {
			t.Fatalf("%d store calls, want 2: a miss during the second flight started its own", n)
		}
	})
}
