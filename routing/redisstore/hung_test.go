package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
	"github.com/cube-sandbox/cubeproxy/routing"
	"github.com/cube-sandbox/cubeproxy/routing/redisstore"
)

// TestHungRedisErrorNamesServer: a Redis that accepts connections and
// never answers (a stopped or stalled process, whose kernel still
// completes the handshake; a load balancer whose backend is gone) failed
// each lookup with a bare "redis hgetall KEY: context deadline exceeded"
// (standalone, the master the sentinels named) or "i/o timeout" (a
// Cluster's only seed): /readyz and the log named no server. The error
// names it, still tells the deadline by errors.Is, and comes within the
// lookup's budget.
func TestHungRedisErrorNamesServer(t *testing.T) {
	testenv.ParallelRedis(t)
	hung := testenv.StartSilentServer(t).Addr
	for _, tc := range []struct {
		name string
		cfg  func(t *testing.T) redisstore.Config
	}{
		{"addr", func(t *testing.T) redisstore.Config { return redisstore.Config{Addr: hung} }},
		{"sentinel master", func(t *testing.T) redisstore.Config {
			sentinel := testenv.StartSentinel(t, "cubemaster", hung)
			return redisstore.Config{Sentinel: redisstore.SentinelConfig{MasterName: "cubemaster", Addrs: []string{sentinel.Addr()}}}
		}},
		{"cluster seed", func(t *testing.T) redisstore.Config {
			return redisstore.Config{Cluster: redisstore.ClusterConfig{Addrs: []string{hung}}}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := openStoreCfg(t, tc.cfg(t))
			for range 2 {
				err := failingLookup(t, s)
				if !strings.Contains(err.Error(), hung) {
					t.Errorf("lookup error %q does not name the server %s", err, hung)
				}
				var timeout interface{ Timeout() bool }
				if !errors.Is(err, context.DeadlineExceeded) && !(errors.As(err, &timeout) && timeout.Timeout()) {
					t.Errorf("lookup error %q is no timeout", err)
				}
			}
		})
	}
}

// failingLookup looks route "x" up in s, a store whose servers cannot
// answer, and wants the lookup to fail within twice its budget: a hang
// takes far longer, and under -race with the suite's parallel tests a
// lookup bounded by its budget can return a few hundred ms late.
func failingLookup(t *testing.T, s *redisstore.Store) error {
	t.Helper()
	start := time.Now()
	_, err := s.Lookup(context.Background(), "x")
	if err == nil {
		t.Fatal("lookup succeeded")
	}
	if d, budget := time.Since(start), s.Config().CommandTimeout; d > 2*budget {
		t.Errorf("lookup took %v, past its budget of %v", d, budget)
	}
	return err
}

// TestHungRedisErrorNamesServerThroughCache: the proxy looks routes up
// through the route cache, whose own wait for a lookup (LookupTimeout) is
// the store's command_timeout, as serve wires them. Its timer starts
// before the store's deadline (the call runs on another goroutine), so a
// stopped Redis (SIGSTOP) was logged as "lookup ID: route store lookup
// timed out", naming no server, where the README promises "no answer
// from ADDR in time". The cache gives a store that keeps its deadline the
// time to say so.
func TestHungRedisErrorNamesServerThroughCache(t *testing.T) {
	testenv.ParallelRedis(t)
	hung := testenv.StartSilentServer(t).Addr
	s := openStoreCfg(t, redisstore.Config{Addr: hung, CommandTimeout: 300 * time.Millisecond})
	c := newCache(t, s, routing.CacheConfig{LookupTimeout: s.Config().CommandTimeout})
	for i := range 5 {
		id := fmt.Sprintf("hung%d", i)
		start := time.Now()
		_, _, err := c.Get(context.Background(), []byte(id))
		if err == nil {
			t.Fatalf("get %s succeeded", id)
		}
		if !strings.Contains(err.Error(), hung) {
			t.Errorf("get %s: error %q does not name the server %s", id, err, hung)
		}
		if d := time.Since(start); d > 2*s.Config().CommandTimeout {
			t.Errorf("get %s took %v, past twice its budget", id, d)
		}
	}
}
