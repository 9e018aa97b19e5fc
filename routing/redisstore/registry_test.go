package redisstore_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
	"github.com/cube-sandbox/cubeproxy/routing/redisstore"
	"github.com/redis/go-redis/v9"
)

func TestRegistry(t *testing.T) {
	testenv.ParallelRedis(t)
	ctx := context.Background()
	r := testenv.StartRedis(t)
	s := openStore(t, r)
	c := r.Client()
	started := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	inst := redisstore.Instance{ProxyID: "proxy-1", AdminURL: "http://127.0.0.1:9901", NodeIP: "10.0.0.1", StartedAt: started, Version: "v1.2.3"}
	const interval = 50 * time.Millisecond
	reg, err := redisstore.StartRegistry(s.Client(), redisstore.RegistryConfig{Enabled: true, Interval: interval}, time.Second, inst, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = reg.Stop(ctx) })

	present := func() bool {
		return c.HExists(ctx, redisstore.DefaultRegistryHash, "proxy-1").Val() &&
			c.ZScore(ctx, redisstore.DefaultRegistryZSet, "proxy-1").Err() == nil
	}
	testenv.WaitFor(t, 10*time.Second, "registry entries", present)

	raw, err := c.HGet(ctx, redisstore.DefaultRegistryHash, "proxy-1").Result()
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := json.Unmarshal([]byte(raw), &got); err != nil {
		t.Fatalf("registry value %q: %v", raw, err)
	}
	want := map[string]any{"proxy_id": "proxy-1", "admin_url": "http://127.0.0.1:9901", "node_ip": "10.0.0.1",
		"started_at": float64(started.UnixMilli()), "version": "v1.2.3"}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("registry %s = %v, want %v (value %s)", k, got[k], v, raw)
		}
	}
	// As the platform's lifecycle manager reads it (its discovery
	// Endpoint): started_at in unix ms, as the platform's proxy writes it.
	// An entry that does not decode is skipped, and the proxy never found.
	var ep struct {
		ProxyID   string `json:"proxy_id"`
		AdminURL  string `json:"admin_url"`
		StartedAt int64  `json:"started_at"`
	}
	if err := json.Unmarshal([]byte(raw), &ep); err != nil || ep.StartedAt != started.UnixMilli() {
		t.Errorf("registry value %s as the lifecycle manager decodes it: %+v, %v", raw, ep, err)
	}
	score := c.ZScore(ctx, redisstore.DefaultRegistryZSet, "proxy-1").Val()
	if now := float64(time.Now().UnixMilli()); score < now-5000 || score > now+1000 {
		t.Errorf("heartbeat score %.0f is not about now (%.0f) in unix ms", score, now)
	}

	// The heartbeat repeats: entries removed by hand come back, with a newer score.
	c.HDel(ctx, redisstore.DefaultRegistryHash, "proxy-1")
	c.ZRem(ctx, redisstore.DefaultRegistryZSet, "proxy-1")
	testenv.WaitFor(t, 10*time.Second, "registry entries rewritten", present)
	if newer := c.ZScore(ctx, redisstore.DefaultRegistryZSet, "proxy-1").Val(); newer <= score {
		t.Errorf("heartbeat score %.0f not newer than %.0f", newer, score)
	}

	if err := reg.Stop(ctx); err != nil {
		t.Fatalf("stop: %v", err)
	}
	if present() || c.HExists(ctx, redisstore.DefaultRegistryHash, "proxy-1").Val() {
		t.Fatal("registry entries still present after Stop")
	}
}

func TestRegistryNeedsID(t *testing.T) {
	testenv.ParallelRedis(t)
	r := testenv.StartRedis(t)
	if _, err := redisstore.StartRegistry(r.Client(), redisstore.RegistryConfig{}, time.Second, redisstore.Instance{}, nil); err == nil {
		t.Fatal("StartRegistry with empty proxy_id succeeded")
	}
}

// TestRegistryOffByDefault: Store.StartRegistry does nothing unless enabled.
func TestRegistryOffByDefault(t *testing.T) {
	testenv.ParallelRedis(t)
	ctx := context.Background()
	r := testenv.StartRedis(t)
	inst := redisstore.Instance{ProxyID: "p"}
	reg, err := openStore(t, r).StartRegistry(inst, nil)
	if err != nil || reg != nil {
		t.Fatalf("disabled registry: %v %v, want nil, nil", reg, err)
	}
	if err := reg.Stop(ctx); err != nil {
		t.Fatalf("nil registry stop: %v", err)
	}
	on := openStoreCfg(t, redisstore.Config{Addr: r.Addr(), Registry: redisstore.RegistryConfig{Enabled: true, Hash: "h", ZSet: "z"}})
	reg, err = on.StartRegistry(inst, nil)
	if err != nil || reg == nil {
		t.Fatalf("enabled registry: %v %v", reg, err)
	}
	testenv.WaitFor(t, 10*time.Second, "custom registry keys", func() bool {
		return r.Client().HExists(ctx, "h", "p").Val() && r.Client().ZScore(ctx, "z", "p").Err() == nil
	})
	if err := reg.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if n := r.Client().Exists(ctx, redisstore.DefaultRegistryHash, redisstore.DefaultRegistryZSet, "h", "z").Val(); n != 0 {
		t.Fatalf("%d registry keys left", n)
	}
}

// Stop keeps to its context's budget when a heartbeat is in flight to a
// Redis that hangs (a shutdown took the heartbeat's command timeout, and
// twice that when a tick that fired meanwhile started another).
func TestRegistryStopCancelsHungHeartbeat(t *testing.T) {
	testenv.ParallelRedis(t)
	hung := testenv.StartSilentServer(t) // a Redis that takes connections and never answers
	// As the store configures it: command deadlines come from the context.
	client := redis.NewClient(&redis.Options{Addr: hung.Addr, MaxRetries: -1, ContextTimeoutEnabled: true})
	defer client.Close()
	r, err := redisstore.StartRegistry(client, redisstore.RegistryConfig{Interval: time.Hour}, time.Minute, redisstore.Instance{ProxyID: "hung"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	testenv.Recv(t, hung.Reached, 10*time.Second, "the registry's first heartbeat at the silent Redis") // the first heartbeat is in flight
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	if err := r.Stop(ctx); err == nil {
		t.Fatal("cleanup against a hung Redis succeeded")
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("Stop took %v with a 300ms budget: it waited for the hung heartbeat", d)
	}
}

// TestRegistryRefusedNamesTheRule: a heartbeat, or the removal at stop,
// the ACL user may not write names the rule to grant, as a refused read
// or subscription does; the warning said only Redis's "no permissions to
// run the 'zadd' command" or "to access one of the keys".
func TestRegistryRefusedNamesTheRule(t *testing.T) {
	testenv.ParallelRedis(t)
	ctx := context.Background()
	r := testenv.StartRedis(t)
	keys := "~" + redisstore.DefaultRegistryHash + " ~" + redisstore.DefaultRegistryZSet
	for _, tc := range []struct {
		name       string
		rules      []any
		beat, stop string // in the heartbeat's warning, in Stop's error; "" for none
	}{
		{"keys denied", []any{"~cube:v1:shared:sandbox:proxy:*", "+@all"}, "(the Redis ACL user needs " + keys + ")", "(the Redis ACL user needs " + keys + ")"},
		{"zadd denied", []any{"~*", "+@all", "-zadd"}, "(the Redis ACL user needs +zadd)", ""},
		{"hdel denied", []any{"~*", "+@all", "-hdel"}, "", "(the Redis ACL user needs +hdel)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			acl := append([]any{"ACL", "SETUSER", "announcer", "reset", "on", ">pw"}, tc.rules...)
			if err := r.Client().Do(ctx, acl...).Err(); err != nil {
				t.Fatal(err)
			}
			s := openStoreCfg(t, redisstore.Config{Addr: r.Addr(), Username: "announcer", Password: "pw"})
			var logs testenv.LogBuffer
			reg, err := redisstore.StartRegistry(s.Client(), redisstore.RegistryConfig{Enabled: true, Interval: time.Hour}, time.Second,
				redisstore.Instance{ProxyID: "proxy-acl"}, slog.New(slog.NewJSONHandler(&logs, nil)))
			if err != nil {
				t.Fatal(err)
			}
			if tc.beat != "" {
				testenv.WaitFor(t, 10*time.Second, "the heartbeat's warning", func() bool { return strings.Contains(logs.String(), "heartbeat failed") })
				if !strings.Contains(logs.String(), tc.beat) {
					t.Errorf("heartbeat warning %s\nwant %q", logs.String(), tc.beat)
				}
			}
			err = reg.Stop(ctx)
			if tc.stop == "" && err != nil || tc.stop != "" && (err == nil || !strings.Contains(err.Error(), tc.stop)) {
				t.Errorf("stop err = %v, want %q", err, tc.stop)
			}
		})
	}
}

// TestRegistryTopologies: the entry is written, rewritten after a
// FLUSHALL (or a failover) at the next beat, and removed at Stop, on each
// topology the store supports. In a Cluster the hash and the sorted set
// live on different slots (the beat is a plain pipeline, not MULTI); with
// Sentinel the beats follow a failover to the new master.
func TestRegistryTopologies(t *testing.T) {
	testenv.ParallelRedis(t)
	const name = "cubemaster"
	cfg := redisstore.RegistryConfig{Enabled: true, Interval: 100 * time.Millisecond}
	for _, tc := range []struct {
		name string
		// open returns the store and the server the registry writes to
		// after disrupt, which wipes or moves the entry.
		open func(t *testing.T) (s *redisstore.Store, disrupt func(t *testing.T) *testenv.Redis)
	}{
		{"standalone FLUSHALL", func(t *testing.T) (*redisstore.Store, func(*testing.T) *testenv.Redis) {
			r := testenv.StartRedis(t)
			return openStoreCfg(t, redisstore.Config{Addr: r.Addr(), Registry: cfg}), func(t *testing.T) *testenv.Redis {
				if err := r.Client().FlushAll(context.Background()).Err(); err != nil {
					t.Fatal(err)
				}
				return r
			}
		}},
		{"cluster FLUSHALL", func(t *testing.T) (*redisstore.Store, func(*testing.T) *testenv.Redis) {
			r := startOneNodeCluster(t)
			return openStoreCfg(t, redisstore.Config{Cluster: redisstore.ClusterConfig{Addrs: []string{r.Addr()}}, Registry: cfg}), func(t *testing.T) *testenv.Redis {
				if err := r.Client().FlushAll(context.Background()).Err(); err != nil {
					t.Fatal(err)
				}
				return r
			}
		}},
		{"sentinel failover", func(t *testing.T) (*redisstore.Store, func(*testing.T) *testenv.Redis) {
			ctx := context.Background()
			_, replica, sentinel, sc := startSentinelSet(t, name)
			s := openStoreCfg(t, redisstore.Config{Sentinel: redisstore.SentinelConfig{MasterName: name, Addrs: []string{sentinel.Addr()}}, Registry: cfg})
			return s, func(t *testing.T) *testenv.Redis {
				waitReplicaSeen(t, ctx, sc, name)
				if err := sc.Failover(ctx, name).Err(); err != nil {
					t.Fatalf("sentinel failover: %v", err)
				}
				waitPromoted(t, ctx, sc, name, replica, 15*time.Second)
				// The promoted replica holds the replicated entry: drop it,
				// so that only a beat on the new master writes it back.
				replica.Client().HDel(ctx, redisstore.DefaultRegistryHash, "p")
				replica.Client().ZRem(ctx, redisstore.DefaultRegistryZSet, "p")
				return replica
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			s, disrupt := tc.open(t)
			reg, err := s.StartRegistry(redisstore.Instance{ProxyID: "p", AdminURL: "http://10.0.0.1:8082"}, nil)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = reg.Stop(ctx) })
			present := func(c *redis.Client) func() bool {
				return func() bool {
					return c.HExists(ctx, redisstore.DefaultRegistryHash, "p").Val() &&
						c.ZScore(ctx, redisstore.DefaultRegistryZSet, "p").Err() == nil
				}
			}
			testenv.WaitFor(t, 10*time.Second, "the first heartbeat", func() bool { return reg.LastBeat() != 0 })
			r := disrupt(t)
			c := r.Client()
			testenv.WaitFor(t, 15*time.Second, "the entry written again", present(c))
			if err := reg.Stop(ctx); err != nil {
				t.Fatalf("stop: %v", err)
			}
			if n := c.Exists(ctx, redisstore.DefaultRegistryHash, redisstore.DefaultRegistryZSet).Val(); n != 0 {
				t.Fatalf("%d registry keys left after Stop", n)
			}
		})
	}
}

// TestRegistrySameID: two processes with one instance_id (the hostname
// default, in a reuse_port takeover) share one entry; when one stops it
// removes that entry, and the other's next beat writes it again, as README
// says (Instance registry, reuse_port): it is missing at most an interval.
func TestRegistrySameID(t *testing.T) {
	testenv.ParallelRedis(t)
	ctx := context.Background()
	r := testenv.StartRedis(t)
	c := r.Client()
	start := func(admin string) *redisstore.Registry {
		reg, err := redisstore.StartRegistry(openStore(t, r).Client(), redisstore.RegistryConfig{Enabled: true, Interval: 100 * time.Millisecond},
			time.Second, redisstore.Instance{ProxyID: "host-1", AdminURL: admin}, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = reg.Stop(ctx) })
		testenv.WaitFor(t, 10*time.Second, admin+"'s first heartbeat", func() bool { return reg.LastBeat() != 0 })
		return reg
	}
	old := start("http://10.0.0.1:8082")
	start("http://10.0.0.2:8082")
	if err := old.Stop(ctx); err != nil {
		t.Fatalf("stop: %v", err)
	}
	testenv.WaitFor(t, 10*time.Second, "the remaining process's entry", func() bool {
		v, err := c.HGet(ctx, redisstore.DefaultRegistryHash, "host-1").Result()
		return err == nil && strings.Contains(v, "10.0.0.2") && c.ZScore(ctx, redisstore.DefaultRegistryZSet, "host-1").Err() == nil
	})
}
