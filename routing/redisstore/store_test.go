package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"reflect"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
	"github.com/cube-sandbox/cubeproxy/routing"
	"github.com/cube-sandbox/cubeproxy/routing/redisstore"
)

func TestLookup(t *testing.T) {
	testenv.ParallelRedis(t)
	r := testenv.StartRedis(t)
	s := openStore(t, r)
	newKey := func(id string) string { return redisstore.DefaultKeyPrefix + id }
	oldKey := func(id string) string { return redisstore.DefaultLegacyKeyPrefix + id }

	hset(t, r, newKey("full"), controlPlaneFields("10.0.0.5")...)
	hset(t, r, oldKey("legacy"), "HostIP", "10.0.0.6", "50005", "31000")
	hset(t, r, newKey("both"), "HostIP", "10.0.0.7", "50005", "32000")
	hset(t, r, oldKey("both"), "HostIP", "10.0.0.8", "50005", "33000")
	hset(t, r, newKey("extra"), "HostIP", "10.0.0.9", "50005", "34000", "Region", "eu", "NodeName", "n1")
	hset(t, r, newKey("nohost"), "SandboxIP", "192.168.0.1", "50005", "35000")
	hset(t, r, newKey("badport"), "HostIP", "10.0.0.10", "50005", "abc")
	hset(t, r, newKey("badip"), "HostIP", "not-an-ip")
	// A broken new key is not papered over by a valid legacy key.
	hset(t, r, newKey("badnew"), "HostIP", "")
	hset(t, r, oldKey("badnew"), "HostIP", "10.0.0.11")
	if err := r.Client().Set(context.Background(), newKey("string"), "x", 0).Err(); err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		id        string
		host      string // expected HostIP
		port      uint16 // expected host port for container port 50005
		errField  string // expected FieldError.Field
		notFound  bool
		checkFull bool
		legacy    bool // read from the legacy key, which Route.Key names
	}{
		{id: "full", host: "10.0.0.5", port: 30001, checkFull: true},
		{id: "legacy", host: "10.0.0.6", port: 31000, legacy: true},
		{id: "both", host: "10.0.0.7", port: 32000},
		{id: "extra", host: "10.0.0.9", port: 34000},
		{id: "nohost", errField: "HostIP"},
		{id: "badport", errField: "50005"},
		{id: "badip", errField: "HostIP"},
		{id: "badnew", errField: "HostIP"},
		{id: "string", errField: "hash"}, // the key stays in the log, out of client answers
		{id: "Bad*Id", errField: routing.FieldSandboxID},
		{id: "missing", notFound: true},
	}
	for _, tc := range tests {
		t.Run(tc.id, func(t *testing.T) {
			route, err := s.Lookup(context.Background(), tc.id)
			switch {
			case tc.notFound:
				if !errors.Is(err, routing.ErrNotFound) {
					t.Fatalf("err = %v, want ErrNotFound", err)
				}
				return
			case tc.errField != "":
				var fe *routing.FieldError
				if !errors.As(err, &fe) || fe.Field != tc.errField {
					t.Fatalf("err = %v, want FieldError for %q", err, tc.errField)
				}
				return
			case err != nil:
				t.Fatalf("lookup: %v", err)
			}
			if route.ID != tc.id || route.HostIP != netip.MustParseAddr(tc.host) {
				t.Fatalf("route = %+v, want id %s host %s", route, tc.id, tc.host)
			}
			if p, ok := route.HostPort(50005); !ok || p != tc.port {
				t.Fatalf("host port = %d %v, want %d", p, ok, tc.port)
			}
			// The key the route came from goes into the log lines about
			// its data, so the operator fixes the hash that was read.
			if want := map[bool]string{false: newKey(tc.id), true: oldKey(tc.id)}[tc.legacy]; route.Key != want {
				t.Fatalf("route.Key = %q, want %q", route.Key, want)
			}
			if !tc.checkFull {
				return
			}
			want := &routing.Route{
				ID: "full", HostIP: netip.MustParseAddr("10.0.0.5"), SandboxIP: netip.MustParseAddr("192.168.7.9"),
				CreatedAt: 1700000000123456789, Public: false, TrafficToken: token, MaskRequestHost: "sbx-${PORT}.internal",
			}
			// Field by field: a Route holds an atomic and is not copied.
			got := &routing.Route{ID: route.ID, HostIP: route.HostIP, SandboxIP: route.SandboxIP, CreatedAt: route.CreatedAt,
				Public: route.Public, TrafficToken: route.TrafficToken, MaskRequestHost: route.MaskRequestHost}
			if !reflect.DeepEqual(got, want) || len(route.Ports) != 2 || route.Ports[49983] != 30002 {
				t.Fatalf("route = %+v, want %+v with ports 50005->30001 49983->30002", route, want)
			}
		})
	}
}

func TestLookupCustomPrefixAndNoLegacy(t *testing.T) {
	testenv.ParallelRedis(t)
	r := testenv.StartRedis(t)
	s := openStoreCfg(t, redisstore.Config{Addr: r.Addr(), KeyPrefix: "p:", DisableLegacy: true})
	hset(t, r, "p:a", "HostIP", "10.1.0.1")
	hset(t, r, redisstore.DefaultLegacyKeyPrefix+"b", "HostIP", "10.1.0.2")
	if _, err := s.Lookup(context.Background(), "a"); err != nil {
		t.Fatalf("custom prefix: %v", err)
	}
	r.ResetStats(t)
	if _, err := s.Lookup(context.Background(), "b"); !errors.Is(err, routing.ErrNotFound) {
		t.Fatalf("legacy disabled: err = %v, want ErrNotFound", err)
	}
	if n := r.CommandCount(t, "hgetall"); n != 1 {
		t.Fatalf("legacy disabled: %d HGETALLs, want 1", n)
	}
}

// TestLookupUnavailable proves a lookup never hangs: a dead server and a
// server that accepts connections but never answers both fail within the
// 1 s command budget (plus scheduling slack).
func TestLookupUnavailable(t *testing.T) {
	testenv.ParallelRedis(t)
	r := testenv.StartRedis(t)
	dead := openStore(t, r)
	hset(t, r, redisstore.DefaultKeyPrefix+"x", "HostIP", "10.0.0.1")
	if _, err := dead.Lookup(context.Background(), "x"); err != nil {
		t.Fatalf("warm-up lookup: %v", err)
	}
	r.Stop()

	silent := testenv.StartSilentServer(t) // accepts connections, never answers
	mute := openStoreCfg(t, redisstore.Config{Addr: silent.Addr})

	for name, s := range map[string]*redisstore.Store{"killed": dead, "mute": mute} {
		t.Run(name, func(t *testing.T) {
			start := time.Now()
			_, err := s.Lookup(context.Background(), "x")
			took := time.Since(start)
			var fe *routing.FieldError
			if err == nil || errors.Is(err, routing.ErrNotFound) || errors.As(err, &fe) {
				t.Fatalf("err = %v, want an availability error", err)
			}
			if !strings.Contains(err.Error(), "redis hgetall "+redisstore.DefaultKeyPrefix+"x") {
				t.Errorf("err %q lacks context", err)
			}
			if took > 1500*time.Millisecond {
				t.Fatalf("lookup took %s, want < 1.5s", took)
			}
		})
	}
}

// TestLookupRecoversAfterOutage: after enough failed dials go-redis fails
// fast and probes the server once a second in the background; lookups must
// work again within about a second of Redis returning, without a restart.
func TestLookupRecoversAfterOutage(t *testing.T) {
	testenv.ParallelRedis(t)
	r := testenv.StartRedis(t)
	s := openStoreCfg(t, redisstore.Config{Addr: r.Addr(), PoolSize: 4})
	r.Stop()
	for range 20 {
		if _, err := s.Lookup(context.Background(), "x"); err == nil {
			t.Fatal("lookup succeeded with redis down")
		}
	}
	r.Restart()
	hset(t, r, redisstore.DefaultKeyPrefix+"x", "HostIP", "10.0.0.1")
	start := time.Now()
	// Typically 150-300 ms; the bound is loose for a loaded CI machine.
	testenv.WaitFor(t, 10*time.Second, "lookup after restart", func() bool {
		_, err := s.Lookup(context.Background(), "x")
		return err == nil
	})
	t.Logf("recovered %s after restart", time.Since(start).Round(time.Millisecond))
}

// dropProxy forwards loopback connections to target after closing the first
// drops connections at once (a reset as a restarting server would cause).
func dropProxy(t *testing.T, target string, drops int) (addr string, accepted *atomic.Int64) {
	return dropOrResetProxy(t, target, drops, false)
}

// dropOrResetProxy is dropProxy that, with reset, drops each connection
// with a TCP reset once the client has spoken, as a Redis restarting or a
// load balancer does, rather than closing it before reading.
func dropOrResetProxy(t *testing.T, target string, drops int, reset bool) (addr string, accepted *atomic.Int64) {
	t.Helper()
	accepted = new(atomic.Int64)
	l := testenv.ServeTCP(t, func(c net.Conn) {
		if accepted.Add(1) <= int64(drops) {
			if reset {
				_, _ = c.Read(make([]byte, 1))
				_ = c.(*net.TCPConn).SetLinger(0)
			}
			c.Close()
			return
		}
		up, err := net.Dial("tcp", target)
		if err != nil {
			c.Close()
			return
		}
		go func() { _, _ = io.Copy(up, c); up.Close() }()
		_, _ = io.Copy(c, up)
		c.Close()
	})
	return l.Addr().String(), accepted
}

// turnProxy forwards connections to target and counts round trips: a
// chunk the client sends after the server answered (or as a connection's
// first) starts a new one. Commands pipelined together are one turn.
func turnProxy(t *testing.T, target string) (addr string, turns *atomic.Int64) {
	t.Helper()
	turns = new(atomic.Int64)
	l := testenv.ServeTCP(t, func(c net.Conn) {
		up, err := net.Dial("tcp", target)
		if err != nil {
			c.Close()
			return
		}
		var answered atomic.Bool
		answered.Store(true)
		go func() {
			buf := make([]byte, 64<<10)
			for {
				n, err := c.Read(buf)
				if n > 0 {
					if answered.Swap(false) {
						turns.Add(1)
					}
					if _, werr := up.Write(buf[:n]); werr != nil {
						break
					}
				}
				if err != nil {
					break
				}
			}
			up.Close()
		}()
		buf := make([]byte, 64<<10)
		for {
			n, err := up.Read(buf)
			if n > 0 {
				answered.Store(true)
				if _, werr := c.Write(buf[:n]); werr != nil {
					break
				}
			}
			if err != nil {
				break
			}
		}
		c.Close()
	})
	return l.Addr().String(), turns
}

// TestLookupOneRoundTrip: whichever key holds the route, or neither, a
// lookup reads the new and the legacy key in one round trip; an unknown
// id (a deleted sandbox, a random name under the wildcard domain) took
// two. The answers are those of TestLookup.
func TestLookupOneRoundTrip(t *testing.T) {
	testenv.ParallelRedis(t)
	r := testenv.StartRedis(t)
	hset(t, r, redisstore.DefaultKeyPrefix+"new", "HostIP", "10.0.0.1")
	hset(t, r, redisstore.DefaultLegacyKeyPrefix+"old", "HostIP", "10.0.0.2")
	addr, turns := turnProxy(t, r.Addr())
	s := openStoreCfg(t, redisstore.Config{Addr: addr, PoolSize: 1})
	if _, err := s.Lookup(context.Background(), "new"); err != nil {
		t.Fatalf("warm-up lookup: %v", err) // dials, with its own round trips
	}
	for _, tc := range []struct {
		id   string
		want error
	}{{"new", nil}, {"old", nil}, {"missing", routing.ErrNotFound}} {
		before := turns.Load()
		if _, err := s.Lookup(context.Background(), tc.id); !errors.Is(err, tc.want) && (err != nil || tc.want != nil) {
			t.Fatalf("lookup %s: %v, want %v", tc.id, err, tc.want)
		}
		if n := turns.Load() - before; n != 1 {
			t.Errorf("lookup %s: %d round trips to redis, want 1", tc.id, n)
		}
	}
}

// TestLookupRefusedIsNotNotFound: a Redis that refuses the proxy's
// password is an outage (503, or a stale route), never "no route" (404),
// whether or not the legacy key is read too. go-redis leaves an error met
// while connecting on neither command of a pipeline.
func TestLookupRefusedIsNotNotFound(t *testing.T) {
	testenv.ParallelRedis(t)
	r := testenv.StartRedis(t, "--requirepass", "right")
	for _, legacy := range []bool{true, false} {
		t.Run(fmt.Sprintf("legacy=%v", legacy), func(t *testing.T) {
			s := openStoreCfg(t, redisstore.Config{Addr: r.Addr(), Password: "wrong", DisableLegacy: !legacy})
			_, err := s.Lookup(context.Background(), "x")
			var fe *routing.FieldError
			if err == nil || errors.Is(err, routing.ErrNotFound) || errors.As(err, &fe) || !strings.Contains(err.Error(), "WRONGPASS") {
				t.Fatalf("lookup with a refused password: %v, want the WRONGPASS error", err)
			}
		})
	}
}

// TestLookupRetriesTransportErrors: a transport error is retried at most
// twice, each time on a new connection. A reset counts as one: once the
// reset before the server's first byte was named (plainResetError), go-redis
// no longer retried it, and a lookup through a connection reset once
// failed (seen as a flake of the close case, whose close turns into a
// reset when the client has written first).
func TestLookupRetriesTransportErrors(t *testing.T) {
	testenv.ParallelRedis(t)
	r := testenv.StartRedis(t)
	hset(t, r, redisstore.DefaultKeyPrefix+"x", "HostIP", "10.0.0.1")
	for _, tc := range []struct {
		drops int
		reset bool
		ok    bool
	}{{0, false, true}, {2, false, true}, {3, false, false}, {2, true, true}, {3, true, false}} {
		name := strconv.Itoa(tc.drops)
		if tc.reset {
			name += " reset"
		}
		t.Run(name, func(t *testing.T) {
			addr, accepted := dropOrResetProxy(t, r.Addr(), tc.drops, tc.reset)
			s := openStoreCfg(t, redisstore.Config{Addr: addr})
			_, err := s.Lookup(context.Background(), "x")
			if (err == nil) != tc.ok {
				t.Fatalf("lookup after %d dropped connections: err = %v, want ok=%v", tc.drops, err, tc.ok)
			}
			if n := accepted.Load(); n > 3 {
				t.Fatalf("%d connections for one lookup, want at most 3 (2 retries)", n)
			}
		})
	}
}

// TestLookupBoundedUnderCallersDeadline: CommandTimeout bounds a lookup
// whatever deadline its caller has, and a sooner deadline of the caller's
// ends it sooner. The route cache calls with a deadline CommandTimeout
// away, under which Lookup makes no context of its own (an allocation
// saved on every cold lookup), so the later-deadline case is the one that
// keeps its own bound honest.
func TestLookupBoundedUnderCallersDeadline(t *testing.T) {
	testenv.ParallelRedis(t)
	const bound = time.Second
	silent := testenv.StartSilentServer(t) // accepts connections, never answers
	s := openStoreCfg(t, redisstore.Config{Addr: silent.Addr, CommandTimeout: bound})
	for _, tc := range []struct {
		name     string
		deadline time.Duration // 0: none
		min, max time.Duration
	}{
		{"no deadline", 0, bound * 9 / 10, bound * 5 / 2},
		{"a later deadline", time.Minute, bound * 9 / 10, bound * 5 / 2},
		{"a sooner deadline", bound / 20, 0, bound * 4 / 5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			if tc.deadline > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, tc.deadline)
				defer cancel()
			}
			start := time.Now()
			_, err := s.Lookup(ctx, "x")
			took := time.Since(start)
			if err == nil || errors.Is(err, routing.ErrNotFound) {
				t.Fatalf("err = %v, want an availability error", err)
			}
			if took < tc.min || took > tc.max {
				t.Fatalf("lookup took %s, want %s to %s", took, tc.min, tc.max)
			}
		})
	}
}

// TestLookupUnderCallersDeadlineMakesNoContext: under a deadline of the
// caller's no later than CommandTimeout, made fresh for the call as the
// route cache makes its own, Lookup makes no context of its own: the two
// together allocate less than the deadline alone plus a Lookup under none
// (which must make one).
func TestLookupUnderCallersDeadlineMakesNoContext(t *testing.T) {
	r := testenv.StartRedis(t)
	s := openStore(t, r)
	hset(t, r, redisstore.DefaultKeyPrefix+"x", controlPlaneFields("10.0.0.5")...)
	lookup := func(ctx context.Context) {
		if _, err := s.Lookup(ctx, "x"); err != nil {
			t.Fatal(err)
		}
	}
	withDeadline := func(f func(context.Context)) func() {
		return func() {
			ctx, cancel := context.WithTimeout(context.Background(), redisstore.DefaultCommandTimeout)
			f(ctx)
			cancel()
		}
	}
	deadline := testing.AllocsPerRun(100, withDeadline(func(context.Context) {}))
	none := testing.AllocsPerRun(100, func() { lookup(context.Background()) })
	under := testing.AllocsPerRun(100, withDeadline(lookup))
	t.Logf("allocations: a deadline %.0f, a lookup under none %.0f, a lookup under a deadline %.0f", deadline, none, under)
	if under >= deadline+none {
		t.Fatalf("a lookup under a fresh deadline allocates %.0f times, the deadline alone %.0f and a lookup under none %.0f: want fewer than the sum", under, deadline, none)
	}
}

// TestLookupRefusedConnectionNamesRedisReason: a Redis that refuses a
// connection says why and closes it: at its maxclients ("ERR max number
// of clients reached"), or in protected mode to a client from another
// host ("DENIED Redis is running in protected mode ..."). The refusal is
// the reply to the connection's first command, the cosmetic CLIENT
// SETNAME, whose refusals the client otherwise ignores: taken for one,
// the lookup went on to the closed connection, and the log and /readyz
// said "write: broken pipe" instead of Redis's reason.
func TestLookupRefusedConnectionNamesRedisReason(t *testing.T) {
	testenv.ParallelRedis(t)
	for _, tc := range []struct {
		name  string
		start func(t *testing.T) (addr string)
		want  string
	}{
		{"maxclients", func(t *testing.T) string {
			r := testenv.StartRedis(t)
			// r's own client holds the one connection allowed.
			if err := r.Client().ConfigSet(context.Background(), "maxclients", "1").Err(); err != nil {
				t.Fatal(err)
			}
			return r.Addr()
		}, "ERR max number of clients reached"},
		{"maxclients through a relay", func(t *testing.T) string {
			// The refusal comes after the client's first command is
			// sent, as over a network: the reply to HELLO.
			r := testenv.StartRedis(t)
			if err := r.Client().ConfigSet(context.Background(), "maxclients", "1").Err(); err != nil {
				t.Fatal(err)
			}
			addr, _ := dropProxy(t, r.Addr(), 0)
			return addr
		}, "ERR max number of clients reached"},
		{"protected mode", func(t *testing.T) string {
			ip := nonLoopbackIPv4(t)
			r := testenv.StartRedis(t, "--bind", "127.0.0.1 "+ip, "--protected-mode", "yes")
			return net.JoinHostPort(ip, strconv.Itoa(r.Port()))
		}, "DENIED Redis is running in protected mode"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := openStoreCfg(t, redisstore.Config{Addr: tc.start(t)})
			_, err := s.Lookup(context.Background(), "x")
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("lookup refused by Redis: %v, want Redis's reason %q", err, tc.want)
			}
		})
	}
}

// nonLoopbackIPv4 returns an IPv4 address of this host other than a
// loopback one, for a Redis in protected mode to refuse; it skips the
// test on a host with none.
func nonLoopbackIPv4(t *testing.T) string {
	t.Helper()
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Skipf("interface addresses: %v", err)
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && n.IP.IsGlobalUnicast() {
			return n.IP.String()
		}
	}
	t.Skip("no non-loopback IPv4 address on this host")
	return ""
}

// Close hangs up every connection of the store's pool: a proxy that stops
// (or a test) leaves Redis no client behind, which counts against its
// maxclients and the ACL user's connection budget.
func TestCloseHangsUpItsConnections(t *testing.T) {
	testenv.ParallelRedis(t)
	r := testenv.StartRedis(t)
	ctx := context.Background()
	clients := func() int {
		t.Helper()
		list, err := r.Client().ClientList(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		return strings.Count(list, "\n")
	}
	before := clients() // the test's own client
	s, err := redisstore.Open(redisstore.Config{Addr: r.Addr()})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Lookup(ctx, "sb"); !errors.Is(err, routing.ErrNotFound) {
		t.Fatalf("lookup: %v", err)
	}
	if n := clients(); n <= before {
		t.Fatalf("%d clients after a lookup, want more than %d", n, before)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 5*time.Second, "the store's connections closed", func() bool { return clients() == before })
}
