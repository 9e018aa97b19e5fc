package redisstore_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
	"github.com/cube-sandbox/cubeproxy/routing"
	"github.com/cube-sandbox/cubeproxy/routing/redisstore"
)

// TestCluster runs the store, the legacy fallback and invalidation against a
// one-node Redis Cluster that owns every slot.
func TestCluster(t *testing.T) {
	ctx := context.Background()
	r := testenv.StartRedis(t, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf")
	if err := r.Client().Do(ctx, "CLUSTER", "ADDSLOTSRANGE", 0, 16383).Err(); err != nil {
		t.Fatalf("cluster addslotsrange: %v", err)
	}
	testenv.WaitFor(t, 30*time.Second, "cluster_state:ok", func() bool {
		info, err := r.Client().ClusterInfo(ctx).Result()
		return err == nil && strings.Contains(info, "cluster_state:ok")
	})

	s := openStoreCfg(t, redisstore.Config{Cluster: redisstore.ClusterConfig{Addrs: []string{r.Addr()}}})
	if _, ok := s.Client().(*redis.ClusterClient); !ok {
		t.Fatalf("client is %T, want *redis.ClusterClient", s.Client())
	}
	hset(t, r, redisstore.DefaultKeyPrefix+"a", "HostIP", "10.0.0.1")
	hset(t, r, redisstore.DefaultLegacyKeyPrefix+"b", "HostIP", "10.0.0.2")
	for _, id := range []string{"a", "b"} {
		if _, err := s.Lookup(ctx, id); err != nil {
			t.Fatalf("lookup %s: %v", id, err)
		}
	}
	if _, err := s.Lookup(ctx, "c"); err != routing.ErrNotFound {
		t.Fatalf("lookup c: %v, want ErrNotFound", err)
	}

	rec := make(recorder, 4)
	sub := s.Subscribe(ctx, rec, nil)
	t.Cleanup(func() { _ = sub.Close() })
	waitReady(t, sub)
	expectID(t, rec, "*") // the cache is dropped on subscribing
	if err := s.Publish(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	expectID(t, rec, "a")
}
