package redisstore_test

import (
	"net"
	"strconv"
	"strings"
	"testing"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
	"github.com/cube-sandbox/cubeproxy/routing/redisstore"
)

// TestFrozenRedisErrorNamesServer: a Redis whose SYNs are dropped (a
// frozen host, a firewall that drops, a wrong IP in a filtered network)
// outlasts each dial's budget, and go-redis, which dials in the
// background, failed every lookup with a bare "redis hgetall KEY: context
// deadline exceeded": /readyz and the log named no server, whether
// redis.addr named it or the sentinels did. The lookup's error is the
// dial's, which names the server, within the lookup's budget. Linux only,
// as testenv.FrozenListener.
func TestFrozenRedisErrorNamesServer(t *testing.T) {
	testenv.ParallelRedis(t)
	frozen := frozenAddr(t)
	for _, tc := range []struct {
		name string
		cfg  func(t *testing.T) redisstore.Config
	}{
		{"addr", func(t *testing.T) redisstore.Config { return redisstore.Config{Addr: frozen} }},
		{"sentinel master", func(t *testing.T) redisstore.Config {
			sentinel := testenv.StartSentinel(t, "cubemaster", frozen)
			return redisstore.Config{Sentinel: redisstore.SentinelConfig{MasterName: "cubemaster", Addrs: []string{sentinel.Addr()}}}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := openStoreCfg(t, tc.cfg(t))
			for range 3 {
				err := failingLookup(t, s)
				if !strings.Contains(err.Error(), frozen) {
					t.Errorf("lookup error %q does not name the server %s", err, frozen)
				}
			}
		})
	}
}

// TestSentinelsDownErrorNamesFrozen: a sentinel whose SYNs are dropped (a
// frozen host, a full backlog) outlasts the dial's budget, and go-redis,
// which dials in the background, failed every lookup with a bare
// "redis hgetall KEY: context deadline exceeded" before the sentinels'
// error was known: /readyz and the log named no sentinel.
func TestSentinelsDownErrorNamesFrozen(t *testing.T) {
	testenv.ParallelRedis(t)
	checkSentinelsDownError(t, []string{testenv.RefusingAddr(t), frozenAddr(t), testenv.StartSilentServer(t).Addr}, 0, 4)
}

// frozenAddr is the address of a testenv.FrozenListener: a port whose
// SYNs go unanswered.
func frozenAddr(t *testing.T) string {
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(int(testenv.FrozenListener(t))))
}
