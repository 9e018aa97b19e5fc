package main

import (
	"context"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
	"github.com/cube-sandbox/cubeproxy/routing/redisstore"
)

// A deployment that never had legacy keys may grant the proxy's ACL user
// only the new key pattern (~cube:v1:*). Redis refuses the legacy read
// each lookup makes, and the proxy answered every unknown id 503, and its
// readiness probe (a lookup of an unknown id) too, so it never became
// ready. It is ready, serves known ids, answers unknown ones 404, and says
// once, at start, which pattern it may not read. A user that may not read
// the new keys is still an outage, whose log line names the pattern.
func TestRedisACLWithoutLegacyPattern(t *testing.T) {
	ctx := context.Background()
	r := testenv.StartRedis(t)
	for user, keys := range map[string]string{"newonly": "~cube:v1:*", "legacyonly": "~bypass_host_proxy:*"} {
		if err := r.Client().Do(ctx, "ACL", "SETUSER", user, "on", ">pw", "resetkeys", "resetchannels", "-@all",
			keys, "+hgetall", "+ping", "&"+redisstore.DefaultInvalidateChannel, "+subscribe", "+publish").Err(); err != nil {
			t.Fatal(err)
		}
	}
	backend := redisBackend(t, "known")
	hsetRoute(t, r, redisstore.DefaultKeyPrefix+"known", cpFields("127.0.0.1", "127.0.0.1", backend)...)

	p := startRedisProxy(t, r.Addr(), "--redis-username", "newonly", "--redis-password", "pw")
	testenv.WaitFor(t, 5*time.Second, "readyz 200 without the legacy key pattern", func() bool {
		return p.adminGet(t, "/readyz").status == 200
	})
	warning := func() int {
		return testenv.CountLines(p.logs.String(), `"level":"WARN"`, "~bypass_host_proxy:*")
	}
	// Logged by the readiness probe's lookup, and written behind it
	// (proclog): wait for the line rather than read the log at once.
	testenv.WaitFor(t, 5*time.Second, "a warning naming ~bypass_host_proxy:* at start", func() bool {
		return warning() > 0
	})
	for i := range 3 {
		if got := p.get(t, "known"); got.status != 200 || got.body != "known" {
			t.Fatalf("known id: %d %s, want 200 from its backend", got.status, got.body)
		}
		if got := p.get(t, "unknown"+string(rune('a'+i))); got.status != 404 || got.code() != "sandbox_not_found" {
			t.Fatalf("unknown id: %d %s, want 404 sandbox_not_found", got.status, got.body)
		}
	}
	// Stopping serve writes what its log still queues: the count is final.
	p.stop()
	if n := warning(); n != 1 {
		t.Fatalf("%d warnings naming ~bypass_host_proxy:*, want the one at start:\n%s", n, p.logs.String())
	}

	q := startRedisProxy(t, r.Addr(), "--redis-username", "legacyonly", "--redis-password", "pw")
	if got := q.get(t, "known"); got.status != 503 || got.code() != "store_unavailable" {
		t.Fatalf("known id, user without the route key pattern: %d %s, want 503 store_unavailable", got.status, got.body)
	}
	testenv.WaitFor(t, 5*time.Second, "an error naming the route key pattern", func() bool {
		return testenv.CountLines(q.logs.String(), `"level":"ERROR"`, "NOPERM", "~cube:v1:shared:sandbox:proxy:*") > 0
	})
}
