package routing

import (
	"context"
	"fmt"
	"net/netip"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// versionStore answers each of four ids ("a".."d") with a route whose
// port 80 maps to the id's current version, or ErrNotFound for a version
// divisible by 3 (a sandbox deleted, then created again).
type versionStore struct {
	// ver is the store's version of each id; announced is the latest
	// version whose change was announced (Invalidate/Expire/ExpireAll
	// returned after the store had it).
	ver, announced [4]atomic.Int64
}

func (s *versionStore) Lookup(_ context.Context, id string) (*Route, error) {
	v := s.ver[id[0]-'a'].Load()
	runtime.Gosched() // let a change and its announcement land mid-read
	if v%3 == 0 {
		return nil, ErrNotFound
	}
	return &Route{ID: id, HostIP: netip.MustParseAddr("10.0.0.1"), Public: true, Ports: map[uint16]uint16{80: uint16(v)}}, nil
}

// A Get (or Refresh) that begins after a change was announced never
// answers from before it, however lookups, announcements and evictions
// interleave: a cache of one entry (and one negative entry) churns
// through four ids while one goroutine changes them and announces each
// change by Invalidate, Expire or ExpireAll. A lookup in flight across
// an announcement must answer its own callers only; cached, it would be
// served for the TTL (a deleted sandbox still reached, a token rotated
// still taken).
func TestCacheNoAnswerFromBeforeAnAnnouncement(t *testing.T) {
	s := &versionStore{}
	for i := range s.ver {
		s.ver[i].Store(1)
		s.announced[i].Store(1)
	}
	// The negative TTL is long so that only an announcement drops a
	// "not found".
	c, err := NewCache(s, CacheConfig{Size: 1, NegativeSize: 1, NegativeTTL: time.Hour, LookupTimeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var wg sync.WaitGroup
	var stale atomic.Int64
	var example atomic.Value
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := range 5000 {
				i := (n + g) % 4
				id := string(rune('a' + i))
				if g == 0 && n%7 == 0 {
					s.ver[i].Add(1)
					switch n % 3 {
					case 0:
						c.Invalidate(id)
					case 1:
						c.Expire(id)
					default:
						c.ExpireAll()
					}
					s.announced[i].Store(s.ver[i].Load())
					continue
				}
				want := s.announced[i].Load()
				r, _, err := c.Get(context.Background(), []byte(id))
				if err == nil && n%5 == 0 {
					r, _, err = c.Refresh(context.Background(), []byte(id), r)
				}
				// A route older than the announced version, or a "not
				// found" while the store has had a route since before
				// this Get began.
				if err == nil && int64(r.Ports[80]) < want || err != nil && want%3 != 0 && s.ver[i].Load() == want {
					stale.Add(1)
					example.Store(fmt.Sprintf("Get(%s) after version %d was announced: route %v, %v", id, want, r, err))
				}
			}
		}()
	}
	wg.Wait()
	if n := stale.Load(); n > 0 {
		t.Fatalf("%d answers from before an announcement, e.g. %v", n, example.Load())
	}
}
