package routing

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"
)

// A miss's wait timer is reused only once it is known to hold no tick.
// With GODEBUG=asynctimerchan=1 (the channel semantics before Go 1.23,
// still selectable) a timer whose Stop reports false may not have sent
// its tick yet: drained at once and put back, it sent the tick later, and
// the next miss that reused it ended at once, long before LookupTimeout.
func TestCacheMissReusesNoFiredTimer(t *testing.T) {
	t.Setenv("GODEBUG", strings.TrimPrefix(os.Getenv("GODEBUG")+",asynctimerchan=1", ","))
	called := make(chan struct{}, 1)
	c := newTestCache(t, newCountingStore(func(_ context.Context, id string) (*Route, error) {
		called <- struct{}{} // after load read LookupTimeout: the test may change it
		return routeFor(id), nil
	}), nil)
	ctx := context.Background()
	key := []byte("box")
	// Without the fix it failed within 20,000 rounds in each of 30 runs
	// (within 1,100 under -race); a round takes ≈ 8 µs.
	deadline := time.Now().Add(2 * time.Second)
	for i := 0; i < 50_000 && time.Now().Before(deadline); i++ {
		// A timeout about as long as the store takes to answer: the
		// timer fires while the answer arrives.
		c.cfg.LookupTimeout = time.Duration(1+i%20) * time.Microsecond
		c.Invalidate("box")
		c.Get(ctx, key)
		<-called
		c.cfg.LookupTimeout = time.Hour
		c.Invalidate("box")
		if _, res, err := c.Get(ctx, key); res != CacheMiss || err != nil {
			t.Fatalf("after %d racing misses, a miss with an hour's LookupTimeout: %v %v", i, res, err)
		}
		<-called
	}
}
