package routing

import (
	"context"
	"errors"
	"testing"
	"time"
)

// Refresh reads the store again for a route that lacks what a request
// needs (a port exposed after it was cached), at most once per
// NegativeTTL, and never when the route was replaced since.
func TestCacheRefresh(t *testing.T) {
	exposed := func(_ context.Context, id string) (*Route, error) {
		r := routeFor(id)
		r.Ports = map[uint16]uint16{80: 8080, 3000: 30000}
		return r, nil
	}
	type step struct {
		advance time.Duration
		answer  func(context.Context, string) (*Route, error) // nil: unchanged
		// refreshOld: refresh the route first cached rather than the
		// one the last step returned.
		refreshOld bool
		wantRes    CacheResult
		wantErr    error
		wantPort   bool  // the route returned maps 3000
		wantCalls  int64 // store calls so far, the first Get's included
	}
	tests := []struct {
		name  string
		steps []step
	}{
		{"a port exposed since is read", []step{
			{advance: 2 * time.Second, answer: exposed, wantRes: CacheMiss, wantPort: true, wantCalls: 2},
		}},
		{"not within NegativeTTL of the load", []step{
			{advance: time.Second, answer: exposed, wantRes: CacheHit, wantCalls: 1},
			{advance: time.Second, wantRes: CacheMiss, wantPort: true, wantCalls: 2},
		}},
		{"not within NegativeTTL of the last refresh", []step{
			{advance: 2 * time.Second, wantRes: CacheMiss, wantCalls: 2},
			{advance: time.Second, answer: exposed, wantRes: CacheHit, wantCalls: 2},
			{advance: time.Second, wantRes: CacheMiss, wantPort: true, wantCalls: 3},
		}},
		{"a replaced route is the answer", []step{
			{advance: 2 * time.Second, answer: exposed, wantRes: CacheMiss, wantPort: true, wantCalls: 2},
			{advance: 2 * time.Second, refreshOld: true, wantRes: CacheHit, wantPort: true, wantCalls: 2},
		}},
		{"a failing store keeps the route, and is not asked again at once", []step{
			{advance: 2 * time.Second, answer: answerDown, wantRes: CacheStale, wantCalls: 2},
			{advance: time.Second, wantRes: CacheHit, wantCalls: 2},
		}},
		// The store failed the route's re-read, and the route is served
		// stale: requests for a port it lacks must not ask the failing
		// store again (nor wait on it) before NegativeTTL has passed.
		{"a route whose re-read failed is not read again within NegativeTTL", []step{
			{advance: 701 * time.Second, answer: answerDown, wantRes: CacheStale, wantCalls: 2},
			{advance: time.Second, wantRes: CacheStale, wantCalls: 2},
		}},
		{"a sandbox gone is not found", []step{
			{advance: 2 * time.Second, answer: answerNotFound, wantRes: CacheMiss, wantErr: ErrNotFound, wantCalls: 2},
		}},
		{"an expired route is looked up as by Get", []step{
			{advance: 701 * time.Second, answer: exposed, wantRes: CacheMiss, wantPort: true, wantCalls: 2},
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			clock := newFakeClock()
			store := newCountingStore(answerRoute)
			c := newTestCache(t, store, clock)
			ctx := context.Background()
			first, _, err := c.Get(ctx, []byte("sb"))
			if err != nil {
				t.Fatal(err)
			}
			last := first
			for i, s := range tc.steps {
				clock.Advance(s.advance)
				if s.answer != nil {
					store.set(s.answer)
				}
				of := last
				if s.refreshOld {
					of = first
				}
				r, res, err := c.Refresh(ctx, []byte("sb"), of)
				if !errors.Is(err, s.wantErr) || res != s.wantRes {
					t.Fatalf("step %d: %v, %v; want %v, %v", i, res, err, s.wantRes, s.wantErr)
				}
				if err == nil {
					if _, ok := r.HostPort(3000); ok != s.wantPort {
						t.Fatalf("step %d: port 3000 mapped %v, want %v", i, ok, s.wantPort)
					}
					last = r
				}
				if n := store.calls.Load(); n != s.wantCalls {
					t.Fatalf("step %d: %d store calls, want %d", i, n, s.wantCalls)
				}
			}
		})
	}
}
