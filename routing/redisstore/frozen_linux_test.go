package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
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
//
// The cancel comes once the kernel shows a connect to each sentinel under
// way (SYN-SENT), not after a fixed delay: a delay that ran out before the
// asks began (a slow machine) tested asks given up before any connect was
// made, not connects cut short. The subscription's own dial is the one
// canceled and its error the one read (Subscribe on the PubSub), and it
// must be the sentinels' error.
func TestSentinelsAskCanceledErrorSaysSo(t *testing.T) {
	testenv.ParallelRedis(t)
	// A budget the cancel comes well within: each sentinel's dial has a
	// sixth of it.
	a, b := frozenAddr(t), frozenAddr(t)
	s := openStoreCfg(t, redisstore.Config{CommandTimeout: time.Minute, Sentinel: redisstore.SentinelConfig{MasterName: "cubemaster", Addrs: []string{a, b}}})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ps := s.Client().Subscribe(ctx) // no channel: nothing dialed yet
	t.Cleanup(func() { _ = ps.Close() })
	subscribed := make(chan error, 1)
	go func() { subscribed <- ps.Subscribe(ctx, "ch") }()
	testenv.WaitFor(t, 30*time.Second, "a connect to each sentinel under way", func() bool {
		return synSent(t, a) && synSent(t, b)
	})
	cancel()
	err := testenv.Recv(t, subscribed, 30*time.Second, "the subscription's dial to end once canceled")
	const want = "redis sentinel: no sentinel named the master: "
	if err == nil || !strings.HasPrefix(err.Error(), want) || err.Error() == want || !strings.Contains(err.Error(), context.Canceled.Error()) {
		t.Fatalf("subscribe through frozen sentinels, canceled: %q, want %q and why, saying %q", err, want, context.Canceled)
	}
	if !errors.Is(err, context.Canceled) {
		t.Errorf("error %q is no context.Canceled", err)
	}
}

// synSent reports whether a socket of this host is connecting to addr (an
// IPv4 address) and waits for its SYN to be answered: /proc/net/tcp's
// state 02, SYN-SENT.
func synSent(t *testing.T, addr string) bool {
	t.Helper()
	ap, err := netip.ParseAddrPort(addr)
	if err != nil || !ap.Addr().Is4() {
		t.Fatalf("synSent(%q): an IPv4 address and port, %v", addr, err)
	}
	ip := ap.Addr().As4()
	// The address as the kernel prints it: the 32-bit word in host
	// (little-endian) order, then the port.
	want := fmt.Sprintf("%02X%02X%02X%02X:%04X", ip[3], ip[2], ip[1], ip[0], ap.Port())
	table, err := os.ReadFile("/proc/net/tcp")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(table), "\n")[1:] {
		f := strings.Fields(line)
		if len(f) > 3 && f[2] == want && f[3] == "02" {
			return true
		}
	}
	return false
}
