package main

import (
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
	"github.com/cube-sandbox/cubeproxy/routing/redisstore"
)

// cache.ttl_min/ttl_max and cache.negative_ttl reach the route cache. The
// proxy's own clock is the judge, not the test's: a cached 404 is taken
// first, then a route; both change in Redis without an announcement. Once
// the route's 3 s TTL has run out (the new route is served; 500-700 s by
// default), more than the default 2 s has passed for the 404 too, which
// the configured hour still holds.
func TestRedisCacheSettingsApplied(t *testing.T) {
	// Parallel: its redis-servers are its own, it waits on them and on
	// timers, and it asserts no latency a busy machine could exceed.
	testenv.ParallelRedis(t)
	r := testenv.StartRedis(t)
	p := startRedisProxy(t, r.Addr(), "--cache-ttl-min", "3s", "--cache-ttl-max", "3s", "--cache-negative-ttl", "1h")
	p.subscribed(t) // the subscription expires the cache: take entries after it
	oldBackend, newBackend := redisBackend(t, "old"), redisBackend(t, "new")

	if got := p.get(t, "ghost"); got.status != 404 {
		t.Fatalf("unknown sandbox: %d %s", got.status, got.body)
	}
	hsetRoute(t, r, redisstore.DefaultKeyPrefix+"live", cpFields("127.0.0.1", "192.168.0.2", oldBackend)...)
	if got := p.get(t, "live"); got.status != 200 || got.body != "old" {
		t.Fatalf("live: %d %s", got.status, got.body)
	}
	hsetRoute(t, r, redisstore.DefaultKeyPrefix+"ghost", cpFields("127.0.0.1", "192.168.0.3", newBackend)...)
	hsetRoute(t, r, redisstore.DefaultKeyPrefix+"live", cpFields("127.0.0.1", "192.168.0.2", newBackend)...)

	testenv.WaitFor(t, 15*time.Second, "the changed route once cache.ttl_max (3 s) ran out", func() bool {
		return p.get(t, "live").body == "new"
	})
	if got := p.get(t, "ghost"); got.status != 404 {
		t.Errorf("sandbox created after its cached 404, more than 2 s later: %d %s, want the 404 cache.negative_ttl (1 h) keeps", got.status, got.body)
	}
}
