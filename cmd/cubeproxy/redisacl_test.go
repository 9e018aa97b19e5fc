package main

import (
	"context"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
	"github.com/cube-sandbox/cubeproxy/routing/redisstore"
	"github.com/redis/go-redis/v9"
)

// A deployment that never had legacy keys may grant the proxy's ACL user
// only the new key pattern (~cube:v1:*). Redis refuses the legacy read
// each lookup makes, and the proxy answered every unknown id 503, and its
// readiness probe (a lookup of an unknown id) too, so it never became
// ready. It is ready, serves known ids, answers unknown ones 404, and says
// once, at start, which pattern it may not read. A user that may not read
// the new keys is still an outage, whose log line names the pattern.
func TestRedisACLWithoutLegacyPattern(t *testing.T) {
	// Parallel: its redis-servers and proxies are its own, and it asserts
	// no latency; what it reads of the log is its own proxies' lines.
	testenv.ParallelRedis(t)
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

// The README's Redis section lists the ACL rules the proxy's user needs,
// and operators paste them: with exactly those (read from the README),
// plus +select for a database other than 0, the proxy becomes ready,
// serves a new and a legacy key, publishes an invalidation, keeps its
// registry entry and removes it at a clean stop, and Redis refuses none
// of its commands. Without +select on database 1 every lookup fails.
func TestRedisACLFromREADME(t *testing.T) {
	// Parallel: its redis-servers and proxies are its own, and it asserts
	// no latency; what it reads of the log is its own proxies' lines.
	testenv.ParallelRedis(t)
	raw, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile("needs no more than `([^`]+)`, plus `([^`]+)` for the registry").FindSubmatch(raw)
	if m == nil {
		t.Fatal("README: the Redis section's ACL rules (needs no more than `…`, plus `…` for the registry) not found")
	}
	readmeRules := append(strings.Fields(string(m[1])), strings.Fields(string(m[2]))...)
	ctx := context.Background()
	for _, tc := range []struct {
		name  string
		db    int
		extra []string
		ready bool
	}{
		{"database 0", 0, nil, true},
		{"database 1 with +select", 1, []string{"+select"}, true},
		{"database 1 without +select", 1, nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := testenv.StartRedis(t)
			acl := []any{"ACL", "SETUSER", "proxy", "on", ">pw", "resetkeys", "resetchannels", "-@all"}
			for _, rule := range append(readmeRules, tc.extra...) {
				acl = append(acl, rule)
			}
			if err := r.Client().Do(ctx, acl...).Err(); err != nil {
				t.Fatalf("ACL SETUSER %v: %v", acl[3:], err)
			}
			db := r.Client()
			if tc.db != 0 {
				db = redis.NewClient(&redis.Options{Addr: r.Addr(), DB: tc.db, Protocol: 2, DisableIdentity: true})
				t.Cleanup(func() { _ = db.Close() })
			}
			if err := db.HSet(ctx, redisstore.DefaultKeyPrefix+"aclnew", cpFields("127.0.0.1", "127.0.0.1", redisBackend(t, "aclnew"))...).Err(); err != nil {
				t.Fatal(err)
			}
			if err := db.HSet(ctx, redisstore.DefaultLegacyKeyPrefix+"aclold", cpFields("127.0.0.1", "127.0.0.1", redisBackend(t, "aclold"))...).Err(); err != nil {
				t.Fatal(err)
			}
			p := startRedisProxy(t, r.Addr(), "--redis-username", "proxy", "--redis-password", "pw",
				"--redis-db", strconv.Itoa(tc.db), "--registry-enabled", "--instance-id", "acl-readme")
			if !tc.ready {
				if got := p.get(t, "aclnew"); got.status != 503 || got.code() != "store_unavailable" {
					t.Fatalf("lookup: %d %s, want 503 store_unavailable", got.status, got.body)
				}
				if got := p.adminGet(t, "/readyz"); got.status != 503 {
					t.Fatalf("readyz: %d %s, want 503", got.status, got.body)
				}
				return
			}
			testenv.WaitFor(t, 5*time.Second, "readyz 200", func() bool { return p.adminGet(t, "/readyz").status == 200 })
			p.subscribed(t)
			for _, id := range []string{"aclnew", "aclold"} {
				if got := p.get(t, id); got.status != 200 || got.body != id {
					t.Fatalf("%s: %d %s, want 200 from its backend", id, got.status, got.body)
				}
			}
			if got := p.adminPost(t, "/admin/backend_cache/delete", "aclnew", ""); got.status != 200 {
				t.Fatalf("backend_cache/delete (PUBLISH): %d %s", got.status, got.body)
			}
			// The first heartbeat is written at start.
			testenv.WaitFor(t, 5*time.Second, "the registry entry", func() bool {
				n, err := db.HExists(ctx, redisstore.DefaultRegistryHash, "acl-readme").Result()
				return err == nil && n
			})
			p.stop()
			if n, err := db.HLen(ctx, redisstore.DefaultRegistryHash).Result(); err != nil || n != 0 {
				t.Errorf("registry after a clean stop: %d entries (%v), want none", n, err)
			}
			if n, err := db.ZCard(ctx, redisstore.DefaultRegistryZSet).Result(); err != nil || n != 0 {
				t.Errorf("heartbeat set after a clean stop: %d members (%v), want none", n, err)
			}
			if strings.Contains(p.logs.String(), "NOPERM") {
				t.Errorf("Redis refused a command of the README's ACL user:\n%s", p.logs.String())
			}
		})
	}
}
