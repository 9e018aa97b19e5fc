package main

import (
	"strconv"
	"testing"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
	"github.com/cube-sandbox/cubeproxy/routing/redisstore"
)

// A corrupted route hash with more fields than a reply may hold is
// answered as invalid route data, 404 route_invalid, and logged once per
// read with the key that holds it, like any other broken route: it was
// read whole (95 MiB and 2.3 s for a million fields), past the lookup
// budget, a 503 that every request for it repeated.
func TestRedisOversizedRouteIsInvalid(t *testing.T) {
	// Parallel: its redis-servers and proxies are its own, and it asserts
	// no latency; what it reads of the log is its own proxies' lines.
	testenv.ParallelRedis(t)
	r := testenv.StartRedis(t)
	key := redisstore.DefaultKeyPrefix + "bloated"
	hsetRoute(t, r, key, cpFields("127.0.0.1", "127.0.0.1", redisBackend(t, "bloated"))...)
	for i := 0; i <= redisstore.MaxReplyElems/2; i += 10000 {
		args := make([]any, 0, 20000)
		for j := i; j < min(i+10000, redisstore.MaxReplyElems/2+1); j++ {
			args = append(args, "junk"+strconv.Itoa(j), "v")
		}
		hsetRoute(t, r, key, args...)
	}
	p := startRedisProxy(t, r.Addr(), "--cache-negative-ttl", "1m")
	// A lookup in flight when the subscription comes up is not cached
	// (ExpireAll), and the next request would read and log again.
	p.subscribed(t)
	for range 5 {
		if got := p.get(t, "bloated"); got.status != 404 || got.code() != "route_invalid" {
			t.Fatalf("oversized route: %d %s, want 404 route_invalid", got.status, got.body)
		}
	}
	// The process log is written behind the caller (proclog): stopping
	// serve writes all of it, and the count is then final.
	p.stop()
	if n := testenv.CountLines(p.logs.String(), `"msg":"invalid route data"`, key, "too large"); n != 1 {
		t.Fatalf("%d log lines for 5 requests to an oversized route, want 1 naming the key:\n%s", n, p.logs.String())
	}
}
