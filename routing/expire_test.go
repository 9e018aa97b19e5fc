package routing

import (
	"testing"
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
