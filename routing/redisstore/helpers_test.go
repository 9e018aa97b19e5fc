package redisstore_test

import (
	"context"
	"testing"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
	"github.com/cube-sandbox/cubeproxy/routing/redisstore"
)

// token is a valid 64-hex traffic token.
const token = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

// controlPlaneFields is a route exactly as the control plane writes it: all strings.
func controlPlaneFields(hostIP string) []any {
	return []any{
		"HostIP", hostIP,
		"SandboxIP", "192.168.7.9",
		"CreatedAt", "1700000000123456789",
		"AllowPublicTraffic", "false",
		"TrafficAccessToken", token,
		"MaskRequestHost", "sbx-${PORT}.internal",
		"50005", "30001",
		"49983", "30002",
	}
}

// hset writes one hash in a single HSET, like the control plane.
func hset(t testing.TB, r *testenv.Redis, key string, fields ...any) {
	t.Helper()
	if err := r.Client().HSet(context.Background(), key, fields...).Err(); err != nil {
		t.Fatalf("hset %s: %v", key, err)
	}
}

// openStore returns a store on r with default key layout, closed at cleanup.
func openStore(t testing.TB, r *testenv.Redis) *redisstore.Store {
	t.Helper()
	return openStoreCfg(t, redisstore.Config{Addr: r.Addr()})
}

func openStoreCfg(t testing.TB, cfg redisstore.Config) *redisstore.Store {
	t.Helper()
	s, err := redisstore.Open(cfg)
	if err != nil {
		t.Fatalf("open store: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}
