package proxy

import (
	"context"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"testing/synctest"

	"github.com/valyala/fasthttp"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
	"github.com/cube-sandbox/cubeproxy/routing"
)

// gatedBadStore answers every lookup with invalid route data (no HostIP),
// once release is closed, counting the reads.
type gatedBadStore struct {
	release chan struct{}
	mu      sync.Mutex
	reads   int
}

func (s *gatedBadStore) Lookup(_ context.Context, id string) (*routing.Route, error) {
	<-s.release
	s.mu.Lock()
	s.reads++
	s.mu.Unlock()
	return routing.ParseRoute(id, map[string]string{"SandboxIP": "10.0.0.1"})
}

// The invalid-route warning is logged once per store read: requests that
// waited on the same read (the cache's one flight per id), and those the
// negative cache answers with its error after, share one line. Each
// waiting request logged its own: a burst of traffic to a sandbox with
// bad route data was a burst of identical warnings.
func TestInvalidRouteLoggedOncePerRead(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := &gatedBadStore{release: make(chan struct{})}
		cache, err := routing.NewCache(store, routing.CacheConfig{})
		if err != nil {
			t.Fatal(err)
		}
		defer cache.Close()
		var logs testenv.LogBuffer
		p, err := New(Config{Logger: slog.New(slog.NewTextHandler(&logs, nil))}, cache)
		if err != nil {
			t.Fatal(err)
		}
		const n = 20
		status := make(chan int, n+1)
		request := func() {
			var ctx fasthttp.RequestCtx
			var req fasthttp.Request
			req.Header.SetHost("80-broken.cube.test")
			req.SetRequestURI("/")
			ctx.Init(&req, &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 40000}, nil)
			p.Handler(&ctx)
			status <- ctx.Response.StatusCode()
		}
		for range n {
			go request()
		}
		synctest.Wait() // every request waits on the one read
		close(store.release)
		request() // after: the negative cache's answer
		for range n + 1 {
			if s := <-status; s != 404 {
				t.Errorf("status %d, want 404", s)
			}
		}
		if store.reads != 1 {
			t.Fatalf("%d store reads, want 1 shared", store.reads)
		}
		if got := strings.Count(logs.String(), "invalid route data"); got != 1 {
			t.Errorf("%d warnings for one store read, want 1:\n%s", got, logs.String())
		}
	})
}
