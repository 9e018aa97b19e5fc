package redisstore_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
	"github.com/cube-sandbox/cubeproxy/routing"
	"github.com/cube-sandbox/cubeproxy/routing/redisstore"
)

// TestServerOfAnotherKindIsNamed: redis.addr, redis.cluster.addrs or
// redis.sentinel.addrs naming a server of another kind is an outage
// (every lookup a 503, /readyz 503), and its error, in the log and in
// /readyz's detail, must name the setting to change, as a data node in
// sentinel.addrs and a Cluster node in redis.addr already are. A sentinel
// in redis.addr answered "ERR unknown command 'hgetall'", a standalone
// Redis in cluster.addrs "ERR This instance has cluster support
// disabled", and a sentinel there "ERR unknown command 'cluster', with
// args beginning with: 'slots'": none named a setting, and the last two
// read as if the proxy had sent a wrong command.
func TestServerOfAnotherKindIsNamed(t *testing.T) {
	testenv.ParallelRedis(t)
	data := testenv.StartRedis(t)
	sentinel := testenv.StartSentinel(t, "cubemaster", data.Addr())
	for _, tc := range []struct {
		name string
		cfg  redisstore.Config
		want []string
	}{
		{"sentinel as redis.addr", redisstore.Config{Addr: sentinel.Addr()},
			[]string{"unknown command 'hgetall'", "Sentinel", "redis.sentinel.master_name", "redis.sentinel.addrs"}},
		{"sentinel as redis.addr, legacy off", redisstore.Config{Addr: sentinel.Addr(), DisableLegacy: true},
			[]string{"unknown command 'hgetall'", "Sentinel", "redis.sentinel.master_name", "redis.sentinel.addrs"}},
		{"standalone in redis.cluster.addrs", redisstore.Config{Cluster: redisstore.ClusterConfig{Addrs: []string{data.Addr()}}},
			[]string{"cluster support disabled", data.Addr(), "redis.cluster.addrs", "not a Cluster node", "redis.addr"}},
		{"sentinel in redis.cluster.addrs", redisstore.Config{Cluster: redisstore.ClusterConfig{Addrs: []string{sentinel.Addr()}}},
			[]string{"unknown command 'cluster'", sentinel.Addr(), "redis.cluster.addrs", "not a Cluster node", "redis.sentinel.master_name"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := openStoreCfg(t, tc.cfg)
			_, err := s.Lookup(context.Background(), "sbx")
			var fe *routing.FieldError
			if err == nil || errors.Is(err, routing.ErrNotFound) || errors.As(err, &fe) {
				t.Fatalf("lookup: %v, want an outage", err)
			}
			for _, want := range tc.want {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("lookup error %q does not say %q", err, want)
				}
			}
		})
	}
}

// TestWritesToServerOfAnotherKindNamed: the registry's heartbeat, its
// removal at stop and the invalidation's PUBLISH, sent to a Cluster node
// or a sentinel in redis.addr, fail with errors that name the setting to
// change, as a lookup's does (TestServerOfAnotherKindIsNamed,
// TestClusterNodeAsStandaloneAddr): the heartbeat's warning said only
// "MOVED 15489 127.0.0.1:7001" or "ERR unknown command 'hset'", with the
// lookups' errors, which named the setting, in another line. A Cluster
// node relays a PUBLISH to the whole cluster: that one works.
func TestWritesToServerOfAnotherKindNamed(t *testing.T) {
	testenv.ParallelRedis(t)
	ctx := context.Background()
	data := testenv.StartRedis(t)
	sentinel := testenv.StartSentinel(t, "cubemaster", data.Addr())
	a, b, _ := startTwoNodeCluster(t)
	// The node that does not hold the registry's hash, the heartbeat's
	// first write.
	node := a
	if onNodeA(t, a, redisstore.DefaultRegistryHash) {
		node = b
	}
	clusterHint := "(this Redis is a Cluster node: list the cluster's nodes in redis.cluster.addrs)"
	sentinelHint := "(a Redis Sentinel answers so: for a master behind sentinels set redis.sentinel.master_name and list the sentinels in redis.sentinel.addrs)"
	for _, tc := range []struct {
		name             string
		addr             string
		beat, stop, publ []string // in the heartbeat's warning, Stop's error, Publish's error (nil: none)
	}{
		{"cluster node", node.Addr(), []string{"MOVED", clusterHint}, []string{"MOVED", clusterHint}, nil},
		{"sentinel", sentinel.Addr(), []string{"unknown command 'hset'", sentinelHint},
			[]string{"unknown command 'hdel'", sentinelHint}, []string{"Only HELLO messages", sentinelHint}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := openStoreCfg(t, redisstore.Config{Addr: tc.addr, Registry: redisstore.RegistryConfig{Enabled: true, Interval: time.Hour}})
			var logs testenv.LogBuffer
			reg, err := s.StartRegistry(redisstore.Instance{ProxyID: "proxy-kind"}, slog.New(slog.NewJSONHandler(&logs, nil)))
			if err != nil {
				t.Fatal(err)
			}
			testenv.WaitFor(t, 10*time.Second, "the heartbeat's warning", func() bool { return strings.Contains(logs.String(), "heartbeat failed") })
			for _, want := range tc.beat {
				if !strings.Contains(logs.String(), want) {
					t.Errorf("heartbeat warning %s\nwant %q", logs.String(), want)
				}
			}
			err = reg.Stop(ctx)
			for _, want := range tc.stop {
				if err == nil || !strings.Contains(err.Error(), want) {
					t.Errorf("stop err = %v, want %q", err, want)
				}
			}
			err = s.Publish(ctx, "sbx")
			if tc.publ == nil && err != nil {
				t.Errorf("publish: %v", err)
			}
			for _, want := range tc.publ {
				if err == nil || !strings.Contains(err.Error(), want) {
					t.Errorf("publish err = %v, want %q", err, want)
				}
			}
		})
	}
}

// TestSentinelAsAddrSubscriptionNamed: a sentinel in redis.addr takes the
// invalidation's SUBSCRIBE and answers its PINGs, and relays nothing
// published on the data server. The subscription logged "subscribed" and
// its gauge read 1 while every lookup failed: it is logged at error level
// naming the setting, and Subscribed is false. A data server's is not.
func TestSentinelAsAddrSubscriptionNamed(t *testing.T) {
	testenv.ParallelRedis(t)
	data := testenv.StartRedis(t)
	sentinel := testenv.StartSentinel(t, "cubemaster", data.Addr())
	for _, tc := range []struct {
		name     string
		addr     string
		sentinel bool
	}{
		{"sentinel", sentinel.Addr(), true},
		{"data server", data.Addr(), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := openStoreCfg(t, redisstore.Config{Addr: tc.addr})
			var logs testenv.LogBuffer
			sub := s.Subscribe(context.Background(), make(recorder, 10), slog.New(slog.NewJSONHandler(&logs, nil)))
			t.Cleanup(func() { _ = sub.Close() })
			waitReady(t, sub) // Subscribed is set before Ready is closed
			if sub.Subscribed() == tc.sentinel {
				t.Errorf("Subscribed() = %v on %s", sub.Subscribed(), tc.name)
			}
			// Logged just after Ready is closed, one line or the other.
			testenv.WaitFor(t, 5*time.Second, "the subscription's line", func() bool {
				return strings.Contains(logs.String(), "redis invalidation subscribed") || strings.Contains(logs.String(), "subscribed on a Redis Sentinel")
			})
			named := strings.Contains(logs.String(), "Redis Sentinel") && strings.Contains(logs.String(), "redis.sentinel.master_name")
			claimed := strings.Contains(logs.String(), `"msg":"redis invalidation subscribed"`)
			if named != tc.sentinel || claimed == tc.sentinel {
				t.Errorf("log on %s:\n%s\nwant the sentinel named: %v", tc.name, logs.String(), tc.sentinel)
			}
		})
	}
}
