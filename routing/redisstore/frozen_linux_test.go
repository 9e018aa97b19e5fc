package redisstore_test

import (
	"context"
	"errors"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

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

// TestSentinelsAskCanceledErrorSaysSo: a dial made with a caller's
// context (a subscription's) that ends while every sentinel's connection
// is still being made (their SYNs dropped) left go-redis only
// context.Canceled from each, which names no sentinel and is recorded for
// none, and the error read "redis sentinel: no sentinel named the
// master: ", ending there. It says the ask was given up.
func TestSentinelsAskCanceledErrorSaysSo(t *testing.T) {
	testenv.ParallelRedis(t)
	// A budget the cancel comes well within: each sentinel's dial has a
	// sixth of it.
	s := openStoreCfg(t, redisstore.Config{CommandTimeout: time.Minute, Sentinel: redisstore.SentinelConfig{MasterName: "cubemaster", Addrs: []string{frozenAddr(t), frozenAddr(t)}}})
	ctx, cancel := context.WithCancel(context.Background())
	defer time.AfterFunc(50*time.Millisecond, cancel).Stop()
	ps := s.Client().Subscribe(ctx, "ch")
	t.Cleanup(func() { _ = ps.Close() })
	_, err := ps.Receive(ctx)
	if err == nil || strings.HasSuffix(err.Error(), ": ") || !strings.Contains(err.Error(), context.Canceled.Error()) {
		t.Fatalf("subscribe through frozen sentinels, canceled: %q, want it to say %q", err, context.Canceled)
	}
	if !errors.Is(err, context.Canceled) {
		t.Errorf("error %q is no context.Canceled", err)
	}
}
