package redisstore_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
	"github.com/cube-sandbox/cubeproxy/routing"
	"github.com/cube-sandbox/cubeproxy/routing/redisstore"
)

// aclDeployments starts a standalone server, a Sentinel-managed master
// (the "sentinel" entry's r) and a one-node Cluster, each with the ACL
// user "proxy" (password "pw") granted rules on top of nothing, and
// returns a store config reaching each as that user. The three go through
// the one Lookup: a fix on one path must hold on all.
func aclDeployments(t *testing.T, rules ...any) map[string]struct {
	r   *testenv.Redis
	cfg redisstore.Config
} {
	t.Helper()
	ctx := context.Background()
	cluster := startOneNodeCluster(t)
	standalone := testenv.StartRedis(t)
	master := testenv.StartRedis(t)
	sentinel := testenv.StartSentinel(t, "acl", master.Addr())
	for _, r := range []*testenv.Redis{standalone, master, cluster} {
		acl := append([]any{"ACL", "SETUSER", "proxy", "on", ">pw", "resetkeys", "resetchannels", "-@all"}, rules...)
		if err := r.Client().Do(ctx, acl...).Err(); err != nil {
			t.Fatalf("ACL SETUSER %v: %v", rules, err)
		}
	}
	return map[string]struct {
		r   *testenv.Redis
		cfg redisstore.Config
	}{
		"standalone": {standalone, redisstore.Config{Addr: standalone.Addr(), Username: "proxy", Password: "pw"}},
		"sentinel": {master, redisstore.Config{Username: "proxy", Password: "pw",
			Sentinel: redisstore.SentinelConfig{MasterName: "acl", Addrs: []string{sentinel.Addr()}}}},
		"cluster": {cluster, redisstore.Config{Username: "proxy", Password: "pw",
			Cluster: redisstore.ClusterConfig{Addrs: []string{cluster.Addr()}}}},
	}
}

// TestLookupWithoutLegacyKeyACL: a deployment that never had legacy keys
// may grant the proxy's ACL user the new key pattern only. Redis answers
// the legacy read of every lookup NOPERM, and an unknown id was a 503
// (store unavailable) instead of a 404, the readiness probe's lookup
// included, so such a proxy never became ready. A denied legacy read now
// counts as no legacy key, and the store says so once, naming the
// pattern to grant; the new key answers as before.
func TestLookupWithoutLegacyKeyACL(t *testing.T) {
	testenv.ParallelRedis(t)
	ctx := context.Background()
	deployments := aclDeployments(t, "~cube:v1:*", "+hgetall", "+ping", "+cluster|slots")
	for name, d := range deployments {
		t.Run(name, func(t *testing.T) {
			hset(t, d.r, redisstore.DefaultKeyPrefix+"known", "HostIP", "10.0.0.1", "50005", "30001")
			var logs testenv.LogBuffer
			cfg := d.cfg
			cfg.Logger = slog.New(slog.NewJSONHandler(&logs, nil))
			s := openStoreCfg(t, cfg)
			for range 5 {
				if r, err := s.Lookup(ctx, "known"); err != nil || r.HostIP.String() != "10.0.0.1" {
					t.Fatalf("lookup of a route the user may read: %v %v", r, err)
				}
				if _, err := s.Lookup(ctx, "unknown"); !errors.Is(err, routing.ErrNotFound) {
					t.Fatalf("lookup of an unknown id without the legacy pattern: %v, want ErrNotFound", err)
				}
			}
			if n := testenv.CountLines(logs.String(), `"level":"WARN"`, "~bypass_host_proxy:*", "NOPERM"); n != 1 {
				t.Fatalf("%d warnings naming the legacy pattern for 5 denied reads, want 1:\n%s", n, logs.String())
			}
		})
	}
}

// TestLookupWithoutRouteKeyACL: an ACL user that may not read the new
// key is an outage the operator has to fix, not "no route": every lookup
// fails (503 store_unavailable, or a stale route) with an error that
// names the pattern to grant, whether or not it may read the legacy key,
// and with the legacy key holding a route.
func TestLookupWithoutRouteKeyACL(t *testing.T) {
	testenv.ParallelRedis(t)
	ctx := context.Background()
	deployments := aclDeployments(t, "~bypass_host_proxy:*", "~unrelated:*", "+hgetall", "+ping", "+cluster|slots")
	for name, d := range deployments {
		for _, legacy := range []bool{true, false} {
			t.Run(name+map[bool]string{true: "", false: " legacy disabled"}[legacy], func(t *testing.T) {
				hset(t, d.r, redisstore.DefaultLegacyKeyPrefix+"old", "HostIP", "10.0.0.2")
				cfg := d.cfg
				cfg.DisableLegacy = !legacy
				s := openStoreCfg(t, cfg)
				for _, id := range []string{"old", "unknown"} {
					_, err := s.Lookup(ctx, id)
					var fe *routing.FieldError
					if err == nil || errors.Is(err, routing.ErrNotFound) || errors.As(err, &fe) {
						t.Fatalf("lookup %s without the route key pattern: %v, want an outage", id, err)
					}
					if msg := err.Error(); !strings.Contains(msg, "NOPERM") || !strings.Contains(msg, "~"+redisstore.DefaultKeyPrefix+"*") {
						t.Fatalf("lookup %s: %q, want NOPERM and the pattern to grant", id, msg)
					}
				}
			})
		}
	}
}

// TestLookupNamesTheRefusedCommand: a user that may read the route keys
// but not run a command every lookup needs (SELECT with a database other
// than 0, CLUSTER SLOTS in a Cluster) fails every lookup NOPERM, and the
// error (logged, and /readyz's detail) names the rule to grant: the
// operator reads it to fix the ACL. It named "+hgetall ~<prefix>*", which
// the user had already, for every NOPERM of the route key's read.
func TestLookupNamesTheRefusedCommand(t *testing.T) {
	testenv.ParallelRedis(t)
	ctx := context.Background()
	rules := []any{"~" + redisstore.DefaultKeyPrefix + "*", "~" + redisstore.DefaultLegacyKeyPrefix + "*", "+hgetall", "+ping"}
	standalone := testenv.StartRedis(t)
	cluster := startOneNodeCluster(t)
	for _, r := range []*testenv.Redis{standalone, cluster} {
		acl := append([]any{"ACL", "SETUSER", "proxy", "on", ">pw", "resetkeys", "resetchannels", "-@all"}, rules...)
		if err := r.Client().Do(ctx, acl...).Err(); err != nil {
			t.Fatalf("ACL SETUSER: %v", err)
		}
	}
	// A user with the key patterns but not +hgetall: the rule to grant is
	// the whole read rule, pattern included, not the bare command.
	if err := standalone.Client().Do(ctx, "ACL", "SETUSER", "nohgetall", "on", ">pw", "resetkeys", "resetchannels", "-@all",
		"~"+redisstore.DefaultKeyPrefix+"*", "~"+redisstore.DefaultLegacyKeyPrefix+"*", "+ping").Err(); err != nil {
		t.Fatalf("ACL SETUSER: %v", err)
	}
	for _, tc := range []struct {
		name string
		user string
		cfg  redisstore.Config
		want string
	}{
		{"database 1 without +select", "proxy", redisstore.Config{Addr: standalone.Addr(), DB: 1}, "+select"},
		{"cluster without +cluster|slots", "proxy", redisstore.Config{Cluster: redisstore.ClusterConfig{Addrs: []string{cluster.Addr()}}}, "+cluster|slots"},
		{"without +hgetall", "nohgetall", redisstore.Config{Addr: standalone.Addr()}, "+hgetall ~" + redisstore.DefaultKeyPrefix + "*"},
	} {
		for _, legacy := range []bool{true, false} {
			t.Run(tc.name+map[bool]string{true: "", false: ", legacy disabled"}[legacy], func(t *testing.T) {
				cfg := tc.cfg
				cfg.Username, cfg.Password, cfg.DisableLegacy = tc.user, "pw", !legacy
				s := openStoreCfg(t, cfg)
				_, err := s.Lookup(ctx, "any")
				if err == nil || !strings.Contains(err.Error(), "NOPERM") {
					t.Fatalf("lookup: %v, want NOPERM", err)
				}
				if msg := err.Error(); !strings.Contains(msg, "needs "+tc.want) || tc.user == "proxy" && strings.Contains(msg, "needs +hgetall") {
					t.Fatalf("lookup: %q, want the rule to grant (needs %s), not one the user has", msg, tc.want)
				}
			})
		}
	}
}

// TestACLUserWithoutPassword: redis.username with no password logs in as
// that user, with an empty password, as a nopass ACL user (one a TLS
// client certificate stands in for) allows. go-redis sends no AUTH at all
// without a password, so every connection ran as the default user: with
// a default user that may do everything the proxy ran with its rights and
// not the ACL user's, and a user with a password, given none, was never
// refused.
func TestACLUserWithoutPassword(t *testing.T) {
	ctx := context.Background()
	for name, d := range aclDeployments(t, "~*", "&*", "+@all") {
		if name == "sentinel" {
			// go-redis runs OnConnect on the sentinels' connections too,
			// and the sentinels have no such user (see onConnect).
			continue
		}
		t.Run(name, func(t *testing.T) {
			if err := d.r.Client().Do(ctx, "ACL", "SETUSER", "np", "on", "nopass", "~*", "&*", "+@all").Err(); err != nil {
				t.Fatalf("ACL SETUSER np: %v", err)
			}
			cfg := d.cfg
			cfg.Username, cfg.Password = "np", ""
			if _, err := openStoreCfg(t, cfg).Lookup(ctx, "sbx"); !errors.Is(err, routing.ErrNotFound) {
				t.Fatalf("lookup as a nopass user: %v, want not found", err)
			}
			list, err := d.r.Client().ClientList(ctx).Result()
			if err != nil {
				t.Fatal(err)
			}
			conns := 0
			for _, l := range strings.Split(list, "\n") {
				if !strings.Contains(l, "name=cubeproxy ") {
					continue
				}
				conns++
				if !strings.Contains(l, " user=np ") {
					t.Fatalf("a store connection runs as another user: %s", l)
				}
			}
			if conns == 0 {
				t.Fatalf("no connection of the store's:\n%s", list)
			}

			cfg.Username = "proxy" // has the password "pw"
			_, err = openStoreCfg(t, cfg).Lookup(ctx, "sbx")
			if err == nil || !strings.Contains(err.Error(), "WRONGPASS") {
				t.Fatalf("lookup as a user with a password, given none: %v, want WRONGPASS", err)
			}
		})
	}
}
