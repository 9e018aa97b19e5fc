package redisstore_test

import (
	"context"
	"errors"
	"net"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
	"github.com/cube-sandbox/cubeproxy/routing"
	"github.com/cube-sandbox/cubeproxy/routing/redisstore"
)

// TestSentinelFailover: the store follows a Sentinel failover; routes keep
// resolving and writes (registry, control plane) land on the new master.
func TestSentinelFailover(t *testing.T) {
	testenv.ParallelRedis(t)
	const name = "cubemaster"
	ctx := context.Background()
	master, replica, sentinel, sc := startSentinelSet(t, name)

	// Written before the failover and replicated, as the control plane's data would be.
	hset(t, master, redisstore.DefaultKeyPrefix+"sbx", "HostIP", "10.0.0.1", "50005", "30001")
	testenv.WaitReplicated(t, master)

	s := openStoreCfg(t, redisstore.Config{Sentinel: redisstore.SentinelConfig{MasterName: name, Addrs: []string{sentinel.Addr()}}})
	if _, err := s.Lookup(ctx, "sbx"); err != nil {
		t.Fatalf("lookup before failover: %v", err)
	}

	// SENTINEL FAILOVER needs a replica the sentinel has already discovered.
	waitReplicaSeen(t, ctx, sc, name)
	if err := sc.Failover(ctx, name).Err(); err != nil {
		t.Fatalf("sentinel failover: %v", err)
	}
	waitPromoted(t, ctx, sc, name, replica, 15*time.Second)
	// The store's client must move to the new master by itself (go-redis
	// follows +switch-master); the old one is still running, so ask the
	// connected server which port it listens on.
	testenv.WaitFor(t, 15*time.Second, "store client on the new master", func() bool {
		port, err := s.Client().ConfigGet(ctx, "port").Result()
		return err == nil && port["port"] == strconv.Itoa(replica.Port())
	})

	if _, err := s.Lookup(ctx, "sbx"); err != nil {
		t.Fatalf("lookup after failover: %v", err)
	}
	if err := s.Client().HSet(ctx, redisstore.DefaultKeyPrefix+"new", "HostIP", "10.0.0.2").Err(); err != nil {
		t.Fatalf("write after failover: %v", err)
	}
	if v, err := replica.Client().HGet(ctx, redisstore.DefaultKeyPrefix+"new", "HostIP").Result(); err != nil || v != "10.0.0.2" {
		t.Fatalf("write did not land on the new master: %q %v", v, err)
	}
	if _, err := s.Lookup(ctx, "new"); err != nil {
		t.Fatalf("lookup of a route written after failover: %v", err)
	}
}

// TestInvalidationFollowsFailoverFromHungMaster: the master hangs (a frozen
// host, a network path that drops packets silently: no reset, no EOF) and
// Sentinel promotes the replica. The subscription must move to the new
// master, where the control plane now publishes; a connection that only
// takes writes would otherwise lose every invalidation until the kernel
// gives up on it, many minutes later.
func TestInvalidationFollowsFailoverFromHungMaster(t *testing.T) {
	testenv.ParallelRedis(t)
	const name = "cubemaster"
	ctx := context.Background()
	master, replica, sentinel, sc := startSentinelSet(t, name)
	waitReplicaSeen(t, ctx, sc, name)

	s := openStoreCfg(t, redisstore.Config{
		Sentinel:       redisstore.SentinelConfig{MasterName: name, Addrs: []string{sentinel.Addr()}},
		CommandTimeout: 300 * time.Millisecond,
	})
	rec := make(recorder, 64)
	sub := s.Subscribe(ctx, rec, nil)
	t.Cleanup(func() { _ = sub.Close() })
	waitReady(t, sub)
	expectID(t, rec, "*")

	master.Pause()
	t.Cleanup(master.Resume)
	waitPromoted(t, ctx, sc, name, replica, 30*time.Second)
	testenv.WaitFor(t, 15*time.Second, "subscription on the new master", func() bool {
		n, err := replica.Client().PubSubNumSub(ctx, redisstore.DefaultInvalidateChannel).Result()
		return sub.Subscriptions() >= 2 && err == nil && n[redisstore.DefaultInvalidateChannel] == 1
	})
	// Invalidations published meanwhile were lost: the cache was expired.
	for got := ""; got != "*"; {
		select {
		case got = <-rec:
		default:
			t.Fatal("the resubscription did not expire the cache")
		}
	}
	if err := replica.Client().Publish(ctx, redisstore.DefaultInvalidateChannel, "after").Err(); err != nil {
		t.Fatal(err)
	}
	expectID(t, rec, "after")
}

// TestInvalidationFollowsCleanFailover: a failover from a master that stays
// up (SENTINEL FAILOVER, a maintenance switch) leaves the subscription on
// the old master until the subscriber's check finds the sentinels name
// another (TestInvalidationLeavesMasterTheSentinelsLeft) or the sentinel
// turns it into a replica, which kills its pub/sub clients. The
// subscription then moves to the new master and expires the cache, since
// invalidations published meanwhile were lost; later ones arrive.
func TestInvalidationFollowsCleanFailover(t *testing.T) {
	testenv.ParallelRedis(t)
	const name = "cubemaster"
	ctx := context.Background()
	_, replica, sentinel, sc := startSentinelSet(t, name)
	// The sentinel turns the old master into a replica only once it has
	// reported the master role for 4 publish periods since its last
	// INFO, read every info period once the failover ended: 10 s with
	// Redis's 2 s and 10 s, the whole of this test's time. Sentinel has
	// no setting for them; SENTINEL DEBUG (Redis 7) sets both, and the
	// sentinel still converts the old master by itself, after
	// +switch-master, as in production: 1 s or so.
	if err := sentinel.Client().Do(ctx, "SENTINEL", "DEBUG", "info-period", 200, "publish-period", 250).Err(); err != nil {
		t.Fatalf("sentinel debug: %v", err)
	}
	waitReplicaSeen(t, ctx, sc, name)
	s := openStoreCfg(t, redisstore.Config{Sentinel: redisstore.SentinelConfig{MasterName: name, Addrs: []string{sentinel.Addr()}}})
	rec := make(recorder, 64)
	sub := s.Subscribe(ctx, rec, nil)
	t.Cleanup(func() { _ = sub.Close() })
	waitReady(t, sub)
	expectID(t, rec, "*")

	if err := sc.Failover(ctx, name).Err(); err != nil {
		t.Fatalf("sentinel failover: %v", err)
	}
	waitPromoted(t, ctx, sc, name, replica, 15*time.Second)
	testenv.WaitFor(t, 30*time.Second, "subscription on the new master", func() bool {
		n, err := replica.Client().PubSubNumSub(ctx, redisstore.DefaultInvalidateChannel).Result()
		return sub.Subscriptions() >= 2 && err == nil && n[redisstore.DefaultInvalidateChannel] == 1
	})
	expectID(t, rec, "*") // the resubscription expired the cache
	if err := replica.Client().Publish(ctx, redisstore.DefaultInvalidateChannel, "after").Err(); err != nil {
		t.Fatal(err)
	}
	expectID(t, rec, "after")
}

// TestInvalidationLeavesMasterTheSentinelsLeft: the sentinels fail over
// from a master they can no longer reach, or no longer reconfigure (a
// partition between them that leaves it reachable from the proxies, its
// sentinel credentials changed), and it keeps running as a master,
// answering PINGs. go-redis moves the lookups to the new master
// (+switch-master), where the control plane now publishes, but not the
// subscription: it stayed on the old master, every invalidation lost,
// the cache never expired, for as long as that master ran unconverted.
// Here the old master refuses SLAVEOF, so the sentinel cannot convert
// it. The subscription must move to the master the sentinels name, and
// expire the cache.
func TestInvalidationLeavesMasterTheSentinelsLeft(t *testing.T) {
	testenv.ParallelRedis(t)
	const name = "cubemaster"
	ctx := context.Background()
	master := testenv.StartRedis(t, "--rename-command", "SLAVEOF", "slaveof-disabled", "--rename-command", "REPLICAOF", "replicaof-disabled")
	replica := testenv.StartReplica(t, master)
	sentinel := testenv.StartSentinel(t, name, master.Addr())
	sc := redis.NewSentinelClient(&redis.Options{Addr: sentinel.Addr(), Protocol: 2, DisableIdentity: true})
	t.Cleanup(func() { _ = sc.Close() })
	waitReplicaSeen(t, ctx, sc, name)
	s := openStoreCfg(t, redisstore.Config{
		Sentinel:       redisstore.SentinelConfig{MasterName: name, Addrs: []string{sentinel.Addr()}},
		CommandTimeout: 300 * time.Millisecond,
	})
	rec := make(recorder, 64)
	sub := s.Subscribe(ctx, rec, nil)
	t.Cleanup(func() { _ = sub.Close() })
	waitReady(t, sub)
	expectID(t, rec, "*")

	if err := sc.Failover(ctx, name).Err(); err != nil {
		t.Fatalf("sentinel failover: %v", err)
	}
	waitPromoted(t, ctx, sc, name, replica, 15*time.Second)
	if role, err := master.Client().Do(ctx, "ROLE").Slice(); err != nil || role[0] != "master" {
		t.Fatalf("the old master's role: %v %v, want it still a master", role, err)
	}
	testenv.WaitFor(t, 15*time.Second, "lookups on the new master", func() bool {
		port, err := s.Client().ConfigGet(ctx, "port").Result()
		return err == nil && port["port"] == strconv.Itoa(replica.Port())
	})
	// Well past the check's period (3 command timeouts): the subscription
	// left the old master and expired the cache.
	testenv.WaitFor(t, 10*time.Second, "subscription on the new master", func() bool {
		n, err := replica.Client().PubSubNumSub(ctx, redisstore.DefaultInvalidateChannel).Result()
		return err == nil && n[redisstore.DefaultInvalidateChannel] == 1
	})
	expectID(t, rec, "*")
	if role, err := master.Client().Do(ctx, "ROLE").Slice(); err != nil || role[0] != "master" {
		t.Fatalf("the old master's role: %v %v, want it still a master (the subscription left it by itself)", role, err)
	}
	if err := replica.Client().Publish(ctx, redisstore.DefaultInvalidateChannel, "after").Err(); err != nil {
		t.Fatal(err)
	}
	expectID(t, rec, "after")
}

// startSentinelSet starts a master, its replica and a Sentinel watching
// them as name, and a client of that Sentinel (closed at the test's end).
func startSentinelSet(t *testing.T, name string) (master, replica, sentinel *testenv.Redis, sc *redis.SentinelClient) {
	t.Helper()
	master = testenv.StartRedis(t)
	replica = testenv.StartReplica(t, master)
	sentinel = testenv.StartSentinel(t, name, master.Addr())
	sc = redis.NewSentinelClient(&redis.Options{Addr: sentinel.Addr(), Protocol: 2, DisableIdentity: true})
	t.Cleanup(func() { _ = sc.Close() })
	return master, replica, sentinel, sc
}

// waitReplicaSeen waits until the sentinel lists the replica of name as
// linked to its master: SENTINEL FAILOVER needs one it has discovered.
func waitReplicaSeen(t *testing.T, ctx context.Context, sc *redis.SentinelClient, name string) {
	t.Helper()
	testenv.WaitFor(t, 15*time.Second, "sentinel to see the replica", func() bool {
		reps, err := sc.Replicas(ctx, name).Result()
		return err == nil && len(reps) == 1 && reps[0]["flags"] == "slave" && reps[0]["master-link-status"] == "ok"
	})
}

// waitPromoted waits until the sentinel names replica as master name's
// address and replica itself reports the master role.
func waitPromoted(t *testing.T, ctx context.Context, sc *redis.SentinelClient, name string, replica *testenv.Redis, timeout time.Duration) {
	t.Helper()
	testenv.WaitFor(t, timeout, "replica promoted", func() bool {
		addr, err := sc.GetMasterAddrByName(ctx, name).Result()
		if err != nil || net.JoinHostPort(addr[0], addr[1]) != replica.Addr() {
			return false
		}
		role, err := replica.Client().Do(ctx, "ROLE").Slice()
		return err == nil && role[0] == "master"
	})
}

// TestHungSentinelIsReplaced: of two sentinels, the one the store asks
// for the master stops answering (a frozen host, a path that drops
// packets) while the master and the other sentinel are healthy. Every new
// connection to the master asks that sentinel first; go-redis dropped it
// for another only when it failed before the dial's budget was used up,
// and a silent one used it all: once the pooled connections were gone,
// every lookup failed for as long as the sentinel hung. Lookups must work
// again within a few, each within about its budget, over TLS too, where
// a new connection to the hung sentinel hangs in its handshake: it held
// the whole dial budget (tls.DialWithDialer ignores the context), and 3
// to 40 of 40 lookups failed, against 2 without TLS.
func TestHungSentinelIsReplaced(t *testing.T) {
	testenv.ParallelRedis(t)
	const name = "cubemaster"
	caFile, certFile, keyFile := writeTLSFiles(t)
	for _, tc := range []struct {
		name string
		tls  bool
	}{{"plain", false}, {"tls", true}} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			var args []string
			if tc.tls {
				args = []string{"--tls-port", testenv.AnotherPort, "--tls-cert-file", certFile, "--tls-key-file", keyFile,
					"--tls-ca-cert-file", caFile, "--tls-auth-clients", "no"}
			}
			master := testenv.StartRedis(t, args...)
			addr := func(r *testenv.Redis) string {
				if tc.tls {
					return r.OtherAddr()
				}
				return r.Addr()
			}
			if tc.tls {
				args = append(args, "--tls-replication", "yes")
			}
			sentinels := []*testenv.Redis{testenv.StartSentinel(t, name, addr(master), args...), testenv.StartSentinel(t, name, addr(master), args...)}
			hset(t, master, redisstore.DefaultKeyPrefix+"sbx", "HostIP", "10.0.0.1", "50005", "30001")
			// A budget of 4 s, not the default 1 s: each sentinel's answer
			// gets an eighth of it (a dial's half), and 125 ms did not
			// cover a healthy sentinel's TLS handshake under -race on a
			// loaded machine (the lookup before the hang failed so, and 3 of
			// 20 after it). The hung sentinel still costs a lookup a whole
			// dial if it is not replaced, the same share of its budget.
			const budget = 4 * time.Second
			cfg := redisstore.Config{CommandTimeout: budget, Sentinel: redisstore.SentinelConfig{MasterName: name, Addrs: []string{addr(sentinels[0]), addr(sentinels[1])}}}
			if tc.tls {
				cfg.TLS, cfg.CAFile = true, caFile
			}
			s := openStoreCfg(t, cfg)
			if _, err := s.Lookup(ctx, "sbx"); err != nil {
				t.Fatalf("lookup before: %v", err)
			}

			// The sentinel the store chose holds its +switch-master subscription.
			var chosen *testenv.Redis
			for _, sn := range sentinels {
				if holdsSubscription(ctx, sn) {
					chosen = sn
				}
			}
			if chosen == nil {
				t.Fatal("no sentinel holds the store's subscription")
			}
			chosen.Pause()
			t.Cleanup(chosen.Resume)

			// Before each lookup the pooled connections go (a master
			// restart, an idle timeout, a reset): each lookup dials, and
			// each dial asks a sentinel.
			if failed := dialedLookups(t, ctx, s, master, 20, budget); len(failed) > 2 {
				t.Fatalf("%d of 20 lookups failed after a sentinel hung, with the master and another sentinel healthy, want a lookup or two: %v", len(failed), failed)
			}
		})
	}
}

// TestSentinelUnknownMasterName: sentinels that answer but monitor no
// master of redis.sentinel.master_name (a typo, a name another
// deployment uses) answer nil, and go-redis said "all sentinels specified
// in configuration are unreachable: redis: nil", in the log and in
// /readyz's detail, which sent the operator to the network. The error
// names the setting and the name instead, and still says what the
// sentinels that did not answer met.
func TestSentinelUnknownMasterName(t *testing.T) {
	testenv.ParallelRedis(t)
	master := testenv.StartRedis(t)
	sentinel := testenv.StartSentinel(t, "cubemaster", master.Addr())
	refusing := testenv.RefusingAddr(t)
	for _, tc := range []struct {
		name  string
		addrs []string
		want  []string
	}{
		{"one sentinel", []string{sentinel.Addr()}, nil},
		{"and one down", []string{refusing, sentinel.Addr()}, []string{refusing, "connection refused"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := openStoreCfg(t, redisstore.Config{Sentinel: redisstore.SentinelConfig{MasterName: "cubemastr", Addrs: tc.addrs}})
			_, err := s.Lookup(context.Background(), "x")
			if err == nil {
				t.Fatal("lookup through sentinels that know no such master succeeded")
			}
			for _, want := range append([]string{`"cubemastr"`, "redis.sentinel.master_name"}, tc.want...) {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("lookup error %q does not say %q", err, want)
				}
			}
			if strings.Contains(err.Error(), "redis: nil") || strings.Contains(err.Error(), "all sentinels specified in configuration are unreachable") {
				t.Errorf("lookup error %q says the sentinels are unreachable", err)
			}
		})
	}
}

// TestSentinelsDownErrorIsStable: with every sentinel unreachable, go-redis
// joins their errors in the order their dials failed, one per line, so
// that the same outage read differently from one lookup to the next (5
// texts in 30 lookups of three refused sentinels), and the readiness
// watch, which logs each new reason at error level, logged one about
// every second instead of once. The text is the same every time, on one
// line, and still tells a dial error (retried) by errors.As.
//
// A sentinel that is slow to fail rather than refused (one that accepts
// and never answers, one whose SYNs are dropped) named none: go-redis
// dials in the background and a lookup whose budget ran out first got a
// bare "context deadline exceeded", and the sentinels' joined errors held
// "context deadline exceeded" and "i/o timeout" without an address
// (TestSentinelsDownErrorIsStable/hung). Each sentinel is named with the
// last error it gave, in every lookup's error.
func TestSentinelsDownErrorIsStable(t *testing.T) {
	for _, tc := range []struct {
		name    string
		addrs   func(t *testing.T) []string
		timeout time.Duration
		lookups int
	}{
		{"refused", func(t *testing.T) []string {
			return []string{testenv.RefusingAddr(t), testenv.RefusingAddr(t), testenv.RefusingAddr(t)}
		}, 0, 30},
		{"hung", func(t *testing.T) []string {
			return []string{testenv.RefusingAddr(t), testenv.StartSilentServer(t).Addr, testenv.StartSilentServer(t).Addr}
		}, 0, 5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			testenv.ParallelRedis(t)
			checkSentinelsDownError(t, tc.addrs(t), tc.timeout, tc.lookups)
		})
	}
}

// TestSentinelsDownErrorUnderLoad: on a loaded machine (here: busy
// goroutines, four per core, and a 15 ms budget) go-redis's dials in the
// background ended after the lookups that waited for them, which failed
// with a bare "context deadline exceeded", or with the sentinels' error
// holding only that, naming no sentinel. Every error names each sentinel;
// the text may change once their dials end, and no lookup's time is
// asserted, the machine being held busy.
//
// Not parallel: the busy goroutines would slow the package's other tests.
func TestSentinelsDownErrorUnderLoad(t *testing.T) {
	addrs := []string{testenv.RefusingAddr(t), testenv.RefusingAddr(t), testenv.RefusingAddr(t)}
	var stop atomic.Bool
	defer stop.Store(true)
	for range 4 * runtime.GOMAXPROCS(0) {
		go func() {
			for !stop.Load() {
			}
		}()
	}
	s := openStoreCfg(t, redisstore.Config{CommandTimeout: 15 * time.Millisecond, Sentinel: redisstore.SentinelConfig{MasterName: "cubemaster", Addrs: addrs}})
	for range 20 {
		_, err := s.Lookup(context.Background(), "x")
		if err == nil {
			t.Fatal("lookup with every sentinel down succeeded")
		}
		for _, a := range addrs {
			if !strings.Contains(err.Error(), a) {
				t.Errorf("error %q does not name sentinel %s", err, a)
			}
		}
	}
}

// checkSentinelsDownError looks a route up lookups times through sentinels
// addrs, all unreachable, and wants one error text, on one line, naming
// each sentinel, and each lookup within its budget.
func checkSentinelsDownError(t *testing.T, addrs []string, timeout time.Duration, lookups int) {
	s := openStoreCfg(t, redisstore.Config{CommandTimeout: timeout, Sentinel: redisstore.SentinelConfig{MasterName: "cubemaster", Addrs: addrs}})
	seen := map[string]bool{}
	for range lookups {
		err := failingLookup(t, s)
		var op *net.OpError
		if !errors.As(err, &op) {
			t.Errorf("lookup error %q wraps no *net.OpError", err)
		}
		seen[err.Error()] = true
	}
	if len(seen) != 1 {
		t.Errorf("%d lookups with the same sentinels down gave %d error texts, want 1: %v", lookups, len(seen), seen)
	}
	for msg := range seen {
		for _, a := range addrs {
			if !strings.Contains(msg, a) {
				t.Errorf("error %q does not name sentinel %s", msg, a)
			}
		}
		if strings.Contains(msg, "\n") {
			t.Errorf("error %q spans lines", msg)
		}
	}
}

// TestSentinelAddrsNotSentinels: redis.sentinel.addrs naming a data node
// (its port, 6379, where a sentinel's, 26379, was meant) got the answer
// "ERR unknown command 'sentinel'", reported as "all sentinels specified
// in configuration are unreachable: ERR unknown command ...". The error
// says the server is no sentinel and which setting lists it.
func TestSentinelAddrsNotSentinels(t *testing.T) {
	testenv.ParallelRedis(t)
	data := testenv.StartRedis(t)
	s := openStoreCfg(t, redisstore.Config{Sentinel: redisstore.SentinelConfig{MasterName: "cubemaster", Addrs: []string{data.Addr()}}})
	_, err := s.Lookup(context.Background(), "x")
	if err == nil || !strings.Contains(err.Error(), "not a sentinel") || !strings.Contains(err.Error(), "redis.sentinel.addrs") {
		t.Fatalf("lookup through a data node listed as a sentinel: %v, want it named no sentinel, with redis.sentinel.addrs", err)
	}
	if strings.Contains(err.Error(), "unreachable") {
		t.Errorf("lookup error %q says the sentinels are unreachable", err)
	}
}

// TestSentinelPasswordRefusalNamesTheSetting: sentinels that ask for a
// password the proxy does not send (redis.sentinel.password unset: it
// does not fall back to redis.password, as the platform's proxy's did)
// or refuse the one it sends answered "redis sentinel: no sentinel named
// the master: NOAUTH Authentication required.", in the log and /readyz's
// detail, with two passwords in the configuration and nothing saying
// which one. The error names redis.sentinel.password; a password the
// master refuses is still Redis's bare answer, the data nodes'.
func TestSentinelPasswordRefusalNamesTheSetting(t *testing.T) {
	testenv.ParallelRedis(t)
	ctx := context.Background()
	const name = "cubemaster"
	master := testenv.StartRedis(t, "--requirepass", "datapw")
	sentinel := testenv.StartSentinel(t, name, master.Addr())
	if err := sentinel.Client().Do(ctx, "SENTINEL", "SET", name, "auth-pass", "datapw").Err(); err != nil {
		t.Fatal(err)
	}
	// The sentinel's own password, set last: the client above is not
	// authenticated, and is not used again.
	if err := sentinel.Client().Do(ctx, "ACL", "SETUSER", "default", "resetpass", ">sentinelpw").Err(); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, password string
		want           []string
	}{
		{"unset", "", []string{"NOAUTH", "redis.sentinel.password", "redis.password"}},
		{"wrong", "datapw", []string{"WRONGPASS", "redis.sentinel.password"}},
		{"right", "sentinelpw", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := openStoreCfg(t, redisstore.Config{Password: "datapw",
				Sentinel: redisstore.SentinelConfig{MasterName: name, Addrs: []string{sentinel.Addr()}, Password: tc.password}})
			_, err := s.Lookup(ctx, "x")
			if tc.want == nil {
				if !errors.Is(err, routing.ErrNotFound) {
					t.Fatalf("lookup with the sentinels' password: %v, want not found", err)
				}
				return
			}
			if err == nil {
				t.Fatal("lookup through sentinels that refuse the proxy succeeded")
			}
			for _, want := range tc.want {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("lookup error %q does not say %q", err, want)
				}
			}
		})
	}
}

// TestHungDiscoveredSentinelIsReplaced: go-redis asks every sentinel it
// knows when the one it uses fails, those the listed ones named
// (SENTINEL SENTINELS) too, and it may keep one of those. Such a
// sentinel's answers were left the dial's whole budget, so when it hung
// the question failed with the dial's own deadline and go-redis, which
// drops a sentinel only for an error that comes before that, kept it:
// every new connection, so every lookup not answered by a pooled one,
// failed for as long as it hung. That happened with every sentinel listed
// too, when listed by host name: go-redis learns each again by IP, and
// kept the IP form in 1 of 3 runs (20 of 20 lookups failed). Here one
// sentinel is listed and the other only discovered: once the discovered
// one is in use and hangs, lookups must work again within a lookup or two.
func TestHungDiscoveredSentinelIsReplaced(t *testing.T) {
	testenv.ParallelRedis(t)
	const name = "cubemaster"
	ctx := context.Background()
	master := testenv.StartRedis(t)
	listed := testenv.StartSentinel(t, name, master.Addr())
	discovered := testenv.StartSentinel(t, name, master.Addr())
	hset(t, master, redisstore.DefaultKeyPrefix+"sbx", "HostIP", "10.0.0.1", "50005", "30001")
	testenv.WaitFor(t, 15*time.Second, "the sentinels to know each other", func() bool {
		others, err := listed.Client().Do(ctx, "SENTINEL", "SENTINELS", name).Slice()
		return err == nil && len(others) == 1
	})
	s := openStoreCfg(t, redisstore.Config{Sentinel: redisstore.SentinelConfig{MasterName: name, Addrs: []string{listed.Addr()}}})
	if _, err := s.Lookup(ctx, "sbx"); err != nil {
		t.Fatalf("lookup before: %v", err)
	}
	// The listed sentinel hangs: go-redis turns to the one it discovered
	// through it, and keeps it.
	listed.Pause()
	testenv.WaitFor(t, 10*time.Second, "the store on the discovered sentinel", func() bool {
		dropConns(t, ctx, master)
		_, err := s.Lookup(ctx, "sbx")
		return err == nil && holdsSubscription(ctx, discovered)
	})
	listed.Resume()
	discovered.Pause()
	t.Cleanup(discovered.Resume)

	if failed := dialedLookups(t, ctx, s, master, 20, redisstore.DefaultCommandTimeout); len(failed) > 2 {
		t.Fatalf("%d of 20 lookups failed after the discovered sentinel in use hung, with the master and the listed sentinel healthy, want a lookup or two: %v", len(failed), failed)
	}
}

// TestSentinelMasterKeepsReadBudget: the reads of a connection to the
// master get the whole command timeout, as they always did, though the
// dialer caps those of every sentinel's, discovered ones' too, at a
// sixth of it (TestHungDiscoveredSentinelIsReplaced): a master that
// answers in half a second (CLIENT PAUSE here; a fork, a slow script in
// production) still answers the lookup.
func TestSentinelMasterKeepsReadBudget(t *testing.T) {
	testenv.ParallelRedis(t)
	const name = "cubemaster"
	ctx := context.Background()
	master := testenv.StartRedis(t)
	sentinel := testenv.StartSentinel(t, name, master.Addr())
	hset(t, master, redisstore.DefaultKeyPrefix+"sbx", "HostIP", "10.0.0.1", "50005", "30001")
	s := openStoreCfg(t, redisstore.Config{Sentinel: redisstore.SentinelConfig{MasterName: name, Addrs: []string{sentinel.Addr()}}})
	for _, fresh := range []bool{false, true} {
		if _, err := s.Lookup(ctx, "sbx"); err != nil {
			t.Fatalf("lookup before: %v", err)
		}
		if fresh {
			// The pooled connections go: the lookup dials.
			if err := master.Client().Do(ctx, "CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes").Err(); err != nil {
				t.Fatal(err)
			}
		}
		if err := master.Client().Do(ctx, "CLIENT", "PAUSE", 500, "ALL").Err(); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		_, err := s.Lookup(ctx, "sbx")
		took := time.Since(start)
		if err != nil {
			t.Fatalf("lookup (new connection: %v) of a master that answers after %v: %v, want its route", fresh, took, err)
		}
		if took < 300*time.Millisecond {
			t.Fatalf("lookup answered in %v: the master was not paused", took)
		}
	}
}

// dropConns closes the master's client connections but the caller's
// (a master restart, an idle timeout, a reset do): the store's next
// lookup dials, and its dial asks a sentinel for the master.
func dropConns(t *testing.T, ctx context.Context, master *testenv.Redis) {
	t.Helper()
	if err := master.Client().Do(ctx, "CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes").Err(); err != nil {
		t.Fatal(err)
	}
}

// holdsSubscription reports whether the sentinel sn holds the store's
// +switch-master subscription: the sentinel go-redis chose.
func holdsSubscription(ctx context.Context, sn *testenv.Redis) bool {
	clients, err := sn.Client().ClientList(ctx).Result()
	return err == nil && strings.Contains(clients, "name=cubeproxy") && strings.Contains(clients, "cmd=subscribe")
}

// dialedLookups makes n lookups of "sbx", each on a new connection
// (dropConns), fails the test if one takes over 1.5 times the store's
// budget (its CommandTimeout and some slack), and returns the lookups'
// errors.
func dialedLookups(t *testing.T, ctx context.Context, s *redisstore.Store, master *testenv.Redis, n int, budget time.Duration) []error {
	t.Helper()
	var failed []error
	for range n {
		dropConns(t, ctx, master)
		start := time.Now()
		_, err := s.Lookup(ctx, "sbx")
		if took := time.Since(start); took > budget*3/2 {
			t.Fatalf("lookup took %v, want about the %v budget", took, budget)
		}
		if err != nil {
			failed = append(failed, err)
		}
	}
	return failed
}
