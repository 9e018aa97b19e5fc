package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
	"github.com/cube-sandbox/cubeproxy/routing/redisstore"
)

// The Redis names other programs use, spelled out rather than through the
// Default* constants, so that renaming one fails here: the control plane
// writes the route hashes, every proxy instance (and the platform's proxy
// during a migration) shares the invalidation channel, and operators' tools
// read the registry.
func TestWireNames(t *testing.T) {
	testenv.ParallelRedis(t)
	ctx := context.Background()
	r := testenv.StartRedis(t)
	c := r.Client()
	s := openStore(t, r)

	hset(t, r, "cube:v1:shared:sandbox:proxy:newkey", "HostIP", "10.0.0.1")
	hset(t, r, "bypass_host_proxy:oldkey", "HostIP", "10.0.0.2")
	for id, want := range map[string]string{"newkey": "10.0.0.1", "oldkey": "10.0.0.2"} {
		route, err := s.Lookup(ctx, id)
		if err != nil || route.HostIP.String() != want {
			t.Errorf("lookup %s: %v %v, want HostIP %s", id, route, err, want)
		}
	}

	rec := make(recorder, 4)
	sub := s.Subscribe(ctx, rec, nil)
	t.Cleanup(func() { _ = sub.Close() })
	waitReady(t, sub)
	expectID(t, rec, "*")
	if err := c.Publish(ctx, "cube:v1:shared:cube_proxy:invalidate", "newkey").Err(); err != nil {
		t.Fatal(err)
	}
	expectID(t, rec, "newkey")

	reg, err := redisstore.StartRegistry(s.Client(), redisstore.RegistryConfig{Enabled: true, Interval: time.Hour}, time.Second, redisstore.Instance{ProxyID: "wire"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = reg.Stop(ctx) })
	testenv.WaitFor(t, 10*time.Second, "registry entries under their names", func() bool {
		return c.HExists(ctx, "cube:v1:shared:cube_proxy:registry", "wire").Val() &&
			c.ZScore(ctx, "cube:v1:shared:cube_proxy:heartbeat", "wire").Err() == nil
	})
}
