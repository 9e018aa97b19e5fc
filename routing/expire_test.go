package routing

import (
	"testing"
	"time"
)

// Expire makes one route due for a re-read: the next Get asks the store
// (a miss, its new answer cached), and a store that fails that read is
// answered with the old route (stale), as for an entry past its TTL,
// where Invalidate would leave nothing to answer with. Other routes stay
// cached, and nothing counts as an announced change.
func TestCacheExpireRereadsOneRoute(t *testing.T) {
	s := newCountingStore(answerRoute)
	c := newTestCache(t, s, newFakeClock())
	first := expect(t, c, s, "a", CacheMiss, nil, 1)
	expect(t, c, s, "b", CacheMiss, nil, 2)
	changes := c.Changes()

	c.Expire("a")
	if c.Changes() != changes {
		t.Error("Expire raised Changes: nothing was announced")
	}
	if r := expect(t, c, s, "a", CacheMiss, nil, 3); r == first {
		t.Fatal("the re-read after Expire answered the old route")
	}
	expect(t, c, s, "a", CacheHit, nil, 3)
	expect(t, c, s, "b", CacheHit, nil, 3)

	// The store fails the re-read: the cached route is the answer.
	cached := expect(t, c, s, "a", CacheHit, nil, 3)
	s.set(answerDown)
	c.Expire("a")
	if r := expect(t, c, s, "a", CacheStale, nil, 4); r != cached {
		t.Fatalf("store down after Expire: %+v, want the cached route", r)
	}

	// A negative entry goes: the next Get asks the store.
	s.set(answerNotFound)
	expect(t, c, s, "n", CacheMiss, ErrNotFound, 5)
	expect(t, c, s, "n", CacheNegativeHit, ErrNotFound, 5)
	s.set(answerRoute)
	c.Expire("n")
	expect(t, c, s, "n", CacheMiss, nil, 6)
}

// A route whose last re-read failed (marked stale) is re-read by the Get
// after Expire, and that Get waits for the answer, as for any expired
// route: a stale route is otherwise served at once while the store is
// asked in the background, and the requests that waited on a resume went
// to the sandbox's old address although the store, back by then, had its
// new one. Both while the stale route is within its NegativeTTL and after.
func TestCacheExpireRereadsAStaleRoute(t *testing.T) {
	for _, tc := range []struct {
		name  string
		after time.Duration // since the failed re-read
	}{
		{"within negative ttl", 0},
		{"past negative ttl", 2 * testCacheConfig.NegativeTTL},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clock := newFakeClock()
			s := newCountingStore(answerRoute)
			c := newTestCache(t, s, clock)
			old := expect(t, c, s, "a", CacheMiss, nil, 1)
			clock.Advance(testCacheConfig.TTLMax)
			s.set(answerDown)
			expect(t, c, s, "a", CacheStale, nil, 2) // marked stale
			clock.Advance(tc.after)

			s.set(answerRoute) // the store is back, with the moved route
			c.Expire("a")
			calls := s.calls.Load()
			if r := expect(t, c, s, "a", CacheMiss, nil, calls+1); r == old {
				t.Fatal("the Get after Expire answered the old route")
			}
			expect(t, c, s, "a", CacheHit, nil, calls+1)
		})
	}
}
