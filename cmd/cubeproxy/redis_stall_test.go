package main

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
	"github.com/cube-sandbox/cubeproxy/routing/redisstore"
)

// A Redis that takes connections but answers nothing (frozen by SIGSTOP;
// CLIENT PAUSE, DEBUG SLEEP and a hung host look the same to the proxy) while a burst of lookups for
// sandboxes not cached arrives: each client gets 503 store_unavailable
// within about the lookup budget, every lookup ends with its budget rather
// than waiting on Redis in the background, the outage is logged at most
// once a second, and the proxy serves from Redis again once it answers.
func TestRedisStallBoundsColdLookups(t *testing.T) {
	r := testenv.StartRedis(t)
	p := startRedisProxy(t, r.Addr())
	hsetRoute(t, r, redisstore.DefaultKeyPrefix+"late", cpFields("127.0.0.1", "192.168.0.2", redisBackend(t, "late"))...)

	r.Pause()
	paused := time.Now()

	const burst = 50
	replies := make([]redisReply, burst)
	var wg sync.WaitGroup
	for i := range burst {
		wg.Go(func() { replies[i] = p.get(t, fmt.Sprintf("cold-%d", i)) })
	}
	wg.Wait()
	for i, got := range replies {
		if got.status != 503 || got.code() != "store_unavailable" || got.header.Get("Retry-After") != "1" {
			t.Fatalf("lookup %d with Redis stalled: %d %v %s", i, got.status, got.header, got.body)
		}
		// The budget is 1 s; the rest is a loaded test machine.
		if got.took > 3*time.Second {
			t.Errorf("lookup %d answered after %v, want about the 1s budget", i, got.took)
		}
	}
	// Still paused: no lookup may be left waiting on Redis.
	testenv.WaitFor(t, 5*time.Second, "every route lookup to end", func() bool {
		// "load(": the route cache's idle store-call goroutines
		// wait in its loader.
		return goroutinesIn("routing.(*Cache).load(") == 0
	})
	// The process log is written behind the caller (proclog): wait for
	// the outage's first line before judging how many there are.
	outage := func() int { return strings.Count(p.logs.String(), `"msg":"route store unavailable"`) }
	testenv.WaitFor(t, 5*time.Second, "the outage in the process log", func() bool { return outage() > 0 })
	if n := outage(); n > 1+int(time.Since(paused)/time.Second) {
		t.Errorf("outage logged %d times in %v, want at most once a second", n, time.Since(paused).Round(time.Millisecond))
	}

	r.Resume()
	testenv.WaitFor(t, 10*time.Second, "a route read from Redis after the stall", func() bool {
		got := p.get(t, "late")
		return got.status == 200 && got.body == "late"
	})
}
