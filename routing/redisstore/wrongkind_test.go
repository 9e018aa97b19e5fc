package redisstore_test

import (
	"context"
	"errors"
	"strings"
	"testing"

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
