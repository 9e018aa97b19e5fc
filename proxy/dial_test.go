package proxy

import (
	"context"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/routing"
)

// A new sandbox connection allocates only its own struct and the connect's
// context beyond what net needs for any cancelable connect with a
// deadline. net.Dialer's Timeout made a context of its own per connect (a
// timer, a channel, an entry in the drain's context): six allocations,
// ≈ 600 B of garbage per cold lookup.
func TestDialAllocatesNoContextOfItsOwn(t *testing.T) {
	if raceDetectorOn {
		t.Skip("the race detector changes allocation counts; run without -race")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	p, _ := bareProxy(t)
	addr := ln.Addr().String()

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var d net.Dialer
	// AllocsPerRun counts the process's allocations, another goroutine's
	// too (a clean-clone run once counted 3 more for the proxied connects,
	// 26 against 23, that no run alone repeats): the least of three runs
	// of each, taken in turn, is each connect's own.
	var plain, proxied float64
	for i := range 3 {
		pl := testing.AllocsPerRun(200, func() {
			c, err := d.DialContext(ctx, "tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			c.Close()
		})
		px := testing.AllocsPerRun(200, func() {
			c, err := p.dial(addr)
			if err != nil {
				t.Fatal(err)
			}
			c.Close()
		})
		if i == 0 || pl < plain {
			plain = pl
		}
		if i == 0 || px < proxied {
			proxied = px
		}
	}
	// The upstreamConn and the connect's context.
	if extra := proxied - plain; extra > 2 {
		t.Errorf("a sandbox connect allocates %v times, %v more than a plain cancelable connect with a deadline (%v); want at most 2",
			proxied, extra, plain)
	}
}

// bareProxy is a Proxy on an empty memory store with a discarding logger,
// not served: for tests that call its methods or its admin API directly.
func bareProxy(tb testing.TB) (*Proxy, *routing.MemoryStore) {
	tb.Helper()
	store := routing.NewMemoryStore()
	cache, err := routing.NewCache(store, routing.CacheConfig{})
	if err != nil {
		tb.Fatal(err)
	}
	p, err := New(Config{Logger: slog.New(slog.DiscardHandler)}, store, cache)
	if err != nil {
		tb.Fatal(err)
	}
	return p, store
}
