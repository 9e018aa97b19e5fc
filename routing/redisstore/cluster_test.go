package redisstore_test

import (
	"context"
	"errors"
	"net"
	"slices"
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

// startOneNodeCluster starts a Redis Cluster of one node that owns every
// slot, and waits until it serves; extra args are redis-server's.
func startOneNodeCluster(t *testing.T, args ...string) *testenv.Redis {
	t.Helper()
	ctx := context.Background()
	r := testenv.StartRedis(t, append([]string{"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"}, args...)...)
	if err := r.Client().Do(ctx, "CLUSTER", "ADDSLOTSRANGE", 0, 16383).Err(); err != nil {
		t.Fatalf("cluster addslotsrange: %v", err)
	}
	testenv.WaitFor(t, 30*time.Second, "cluster_state:ok", func() bool {
		info, err := r.Client().ClusterInfo(ctx).Result()
		return err == nil && strings.Contains(info, "cluster_state:ok")
	})
	return r
}

// TestCluster runs the store, the legacy fallback and invalidation against a
// one-node Redis Cluster that owns every slot.
func TestCluster(t *testing.T) {
	testenv.ParallelRedis(t)
	ctx := context.Background()
	r := startOneNodeCluster(t)

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

// TestClusterSkipsEmptySlotMap: a node removed from the cluster and reset
// (redis-cli's del-node) keeps running and answers CLUSTER SLOTS with an
// empty map. go-redis reads the map from a node it picks at random among
// those it knows (a removed node for a minute or more, a seed for good)
// and took an empty answer for the whole map: until the next read every
// command went to a random node (a MOVED, or CLUSTERDOWN from the removed
// one), and a subscription go-redis connected again meanwhile could land on
// the removed node while the membership check asked another, and stayed
// there, every invalidation lost (how
// TestClusterInvalidationAfterFailedOverNodeRemoval failed, 2 of 35 runs).
// The map of a node that knows no slot must be skipped for another's.
func TestClusterSkipsEmptySlotMap(t *testing.T) {
	testenv.ParallelRedis(t)
	ctx := context.Background()
	a := startOneNodeCluster(t)
	removed := testenv.StartRedis(t, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf")
	hset(t, a, redisstore.DefaultKeyPrefix+"sbx", "HostIP", "10.0.0.1")
	s := openStoreCfg(t, redisstore.Config{Cluster: redisstore.ClusterConfig{Addrs: []string{removed.Addr(), a.Addr()}}, DisableLegacy: true})
	cc := s.Client().(*redis.ClusterClient)
	for i := range 20 {
		// Each read asks one of the two seeds, at random (as the
		// subscriber's membership check reads it).
		var nodes atomic.Int64
		if err := cc.ForEachShard(ctx, func(context.Context, *redis.Client) error { nodes.Add(1); return nil }); err != nil {
			t.Fatalf("read %d of the slot map: %v", i, err)
		}
		if _, err := s.Lookup(ctx, "sbx"); err != nil || nodes.Load() != 1 {
			t.Fatalf("read %d of the slot map: %d nodes, lookup %v; want a alone, and its route", i, nodes.Load(), err)
		}
	}
	if errs, err := removed.Client().Info(ctx, "errorstats").Result(); err != nil || strings.Contains(errs, "errorstat_") {
		t.Fatalf("the node outside the cluster answered errors (lookups sent to it): %q %v", errs, err)
	}
}

// TestClusterWithoutSlots: every seed of redis.cluster.addrs knows no
// slot, the nodes of a cluster not yet created (started with
// cluster-enabled, met or not, no CLUSTER ADDSLOTS yet). No route can be
// read: every lookup is an outage (a 503, never a 404), and its error
// must say why: it named one node, another on each lookup, "knows no
// slot (removed from the cluster, or not yet joined)", as if that node
// alone were wrong. Once the slots are assigned the store serves, with
// no restart.
func TestClusterWithoutSlots(t *testing.T) {
	t.Parallel() // each case takes its own slot (see TestClusterFollowsFailover)
	for _, tc := range []struct {
		name string
		meet bool
	}{{"nodes apart", false}, {"nodes met", true}} {
		t.Run(tc.name, func(t *testing.T) {
			testenv.ParallelRedis(t)
			ctx := context.Background()
			var nodes []*testenv.Redis
			var addrs []string
			for range 3 {
				n := testenv.StartRedis(t, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf")
				nodes, addrs = append(nodes, n), append(addrs, n.Addr())
			}
			if tc.meet {
				for _, n := range nodes[1:] {
					if err := nodes[0].Client().ClusterMeet(ctx, "127.0.0.1", strconv.Itoa(n.Port())).Err(); err != nil {
						t.Fatal(err)
					}
				}
				testenv.WaitFor(t, 10*time.Second, "the nodes to know each other", func() bool {
					info, err := nodes[2].Client().ClusterInfo(ctx).Result()
					return err == nil && strings.Contains(info, "cluster_known_nodes:3")
				})
			}
			s := openStoreCfg(t, redisstore.Config{Cluster: redisstore.ClusterConfig{Addrs: addrs}})
			for i := range 10 {
				_, err := s.Lookup(ctx, "sbx")
				var fe *routing.FieldError
				if err == nil || errors.Is(err, routing.ErrNotFound) || errors.As(err, &fe) {
					t.Fatalf("lookup %d with no slot assigned: %v, want an outage", i, err)
				}
				for _, want := range append([]string{"no node gave a slot map", "CLUSTER ADDSLOTS"}, addrs...) {
					if !strings.Contains(err.Error(), want) {
						t.Fatalf("lookup %d: error %q does not say %q", i, err, want)
					}
				}
			}

			if err := nodes[0].Client().Do(ctx, "CLUSTER", "ADDSLOTSRANGE", 0, 16383).Err(); err != nil {
				t.Fatal(err)
			}
			testenv.WaitFor(t, 10*time.Second, "lookups once the slots are assigned", func() bool {
				_, err := s.Lookup(ctx, "sbx")
				return errors.Is(err, routing.ErrNotFound)
			})
		})
	}
}

// TestClusterLookupNeedsNoCommandInfo: go-redis's Cluster client asked
// a node for COMMAND's whole table before each command, to learn its key
// step, until it got the table once. An ACL user with the rules README
// grants (no +command) was refused it every time: two more round trips
// per lookup, one at a time across all lookups under go-redis's lock
// (1800 cold lookups/s on the binary where 4200 with +command). The
// store's commands must go without it, whether the user may run it or
// not.
func TestClusterLookupNeedsNoCommandInfo(t *testing.T) {
	t.Parallel() // each case takes its own slot (see TestClusterFollowsFailover)
	ctx := context.Background()
	for _, tc := range []struct {
		name  string
		rules []any
	}{
		{"README's rules", readmeACLRules(t)},
		{"with +command", append(readmeACLRules(t), "+command")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			testenv.ParallelRedis(t)
			r := startOneNodeCluster(t)
			acl := append([]any{"ACL", "SETUSER", "proxy", "on", ">pw", "resetkeys", "resetchannels", "-@all"}, tc.rules...)
			if err := r.Client().Do(ctx, acl...).Err(); err != nil {
				t.Fatalf("ACL SETUSER: %v", err)
			}
			hset(t, r, redisstore.DefaultKeyPrefix+"sbx", "HostIP", "10.0.0.1")
			s := openStoreCfg(t, redisstore.Config{Username: "proxy", Password: "pw", Cluster: redisstore.ClusterConfig{Addrs: []string{r.Addr()}}})
			r.ResetStats(t)
			for i := range 10 {
				if _, err := s.Lookup(ctx, "sbx"); err != nil {
					t.Fatalf("lookup %d: %v", i, err)
				}
				if _, err := s.Lookup(ctx, "unknown"); !errors.Is(err, routing.ErrNotFound) {
					t.Fatalf("lookup %d of an unknown id: %v", i, err)
				}
			}
			stats, err := r.Client().Info(ctx, "commandstats").Result()
			if err != nil {
				t.Fatal(err)
			}
			for line := range strings.SplitSeq(stats, "\n") {
				if strings.HasPrefix(line, "cmdstat_command") {
					t.Fatalf("20 lookups sent COMMAND: %s", strings.TrimSpace(line))
				}
			}
		})
	}
}

// TestClusterSlotMapACLRules: go-redis (v9.24 on) reads the slot map
// with CLUSTER SHARDS, and with CLUSTER SLOTS when that fails. A user
// granted either one serves, +cluster|slots alone (earlier READMEs' rule)
// included; README's rules (both) get no slot map read refused, which
// +cluster|slots alone gets at each read (an ACL LOG entry); a user with
// neither is told to grant README's two.
func TestClusterSlotMapACLRules(t *testing.T) {
	testenv.ParallelRedis(t)
	ctx := context.Background()
	without := func(rule string) []any {
		return slices.DeleteFunc(readmeACLRules(t), func(r any) bool { return r == rule })
	}
	for _, tc := range []struct {
		name    string
		rules   []any
		refused string // the slot map read refused at each read ("": none)
		fails   bool
	}{
		{"README's rules", readmeACLRules(t), "", false},
		{"without +cluster|shards", without("+cluster|shards"), "cluster|shards", false},
		{"without +cluster|slots", without("+cluster|slots"), "", false},
		{"without either", slices.DeleteFunc(without("+cluster|slots"), func(r any) bool { return r == "+cluster|shards" }), "cluster|shards", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := startOneNodeCluster(t)
			acl := append([]any{"ACL", "SETUSER", "proxy", "on", ">pw", "resetkeys", "resetchannels", "-@all"}, tc.rules...)
			if err := r.Client().Do(ctx, acl...).Err(); err != nil {
				t.Fatalf("ACL SETUSER: %v", err)
			}
			s := openStoreCfg(t, redisstore.Config{Username: "proxy", Password: "pw", Cluster: redisstore.ClusterConfig{Addrs: []string{r.Addr()}}})
			_, err := s.Lookup(ctx, "unknown")
			switch {
			case tc.fails && (err == nil || !strings.Contains(err.Error(), "needs +cluster|slots +cluster|shards)")):
				t.Fatalf("lookup: %v, want NOPERM naming README's two rules", err)
			case !tc.fails && !errors.Is(err, routing.ErrNotFound):
				t.Fatalf("lookup: %v, want not found", err)
			}
			log, err := r.Client().ACLLog(ctx, 128).Result()
			if err != nil {
				t.Fatal(err)
			}
			var refused []string
			for _, e := range log {
				if strings.HasPrefix(e.Object, "cluster|") {
					refused = append(refused, e.Object)
				}
			}
			if tc.refused == "" && len(refused) > 0 || tc.refused != "" && !slices.Contains(refused, tc.refused) {
				t.Errorf("slot map reads refused: %v, want %q", refused, tc.refused)
			}
		})
	}
}

// startTwoNodeCluster starts a Redis Cluster of two masters, a with the
// slots below 8192 and b with the others, and returns them with ids
// (box<n>) whose new and legacy keys live on different nodes.
func startTwoNodeCluster(t *testing.T) (a, b *testenv.Redis, split []string) {
	t.Helper()
	ctx := context.Background()
	clusterArgs := []string{"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"}
	a, b = testenv.StartRedis(t, clusterArgs...), testenv.StartRedis(t, clusterArgs...)
	if err := a.Client().Do(ctx, "CLUSTER", "ADDSLOTSRANGE", 0, 8191).Err(); err != nil {
		t.Fatalf("cluster addslotsrange: %v", err)
	}
	if err := b.Client().Do(ctx, "CLUSTER", "ADDSLOTSRANGE", 8192, 16383).Err(); err != nil {
		t.Fatalf("cluster addslotsrange: %v", err)
	}
	if err := a.Client().ClusterMeet(ctx, "127.0.0.1", strconv.Itoa(b.Port())).Err(); err != nil {
		t.Fatalf("cluster meet: %v", err)
	}
	for _, n := range []*testenv.Redis{a, b} {
		testenv.WaitFor(t, 30*time.Second, "cluster_state:ok on both nodes", func() bool {
			info, err := n.Client().ClusterInfo(ctx).Result()
			return err == nil && strings.Contains(info, "cluster_state:ok") && strings.Contains(info, "cluster_known_nodes:2")
		})
	}
	for i := 0; len(split) < 8 && i < 1000; i++ {
		id := "box" + strconv.Itoa(i)
		if onNodeA(t, a, redisstore.DefaultKeyPrefix+id) != onNodeA(t, a, redisstore.DefaultLegacyKeyPrefix+id) {
			split = append(split, id)
		}
	}
	if len(split) < 8 {
		t.Fatalf("found only %d ids with keys on both nodes", len(split))
	}
	return a, b, split
}

// onNodeA says whether key lives on startTwoNodeCluster's node a, the one
// with the slots below 8192.
func onNodeA(t *testing.T, a *testenv.Redis, key string) bool {
	t.Helper()
	slot, err := a.Client().ClusterKeySlot(context.Background(), key).Result()
	if err != nil {
		t.Fatalf("cluster keyslot %s: %v", key, err)
	}
	return slot < 8192
}

// TestClusterKeysOnTwoNodes runs lookups on a two-node Cluster for ids
// whose new and legacy keys live on different nodes: Lookup reads both in
// one pipeline, which go-redis splits by node, and the answer must be what
// the two reads in turn would give.
func TestClusterKeysOnTwoNodes(t *testing.T) {
	testenv.ParallelRedis(t)
	ctx := context.Background()
	a, _, split := startTwoNodeCluster(t)
	writer := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{a.Addr()}})
	t.Cleanup(func() { _ = writer.Close() })
	put := func(key, ip string) {
		if err := writer.HSet(ctx, key, "HostIP", ip, "SandboxIP", "192.168.0.2", "80", "20080").Err(); err != nil {
			t.Fatalf("hset %s: %v", key, err)
		}
	}
	newOnly, legacyOnly, both, none := split[0], split[1], split[2], split[3]
	put(redisstore.DefaultKeyPrefix+newOnly, "10.0.0.1")
	put(redisstore.DefaultLegacyKeyPrefix+legacyOnly, "10.0.0.2")
	put(redisstore.DefaultKeyPrefix+both, "10.0.0.3")
	put(redisstore.DefaultLegacyKeyPrefix+both, "10.0.0.4")

	s := openStoreCfg(t, redisstore.Config{Cluster: redisstore.ClusterConfig{Addrs: []string{a.Addr()}}})
	for _, tc := range []struct {
		id, wantHost string // "" : ErrNotFound
	}{
		{newOnly, "10.0.0.1"},
		{legacyOnly, "10.0.0.2"},
		{both, "10.0.0.3"}, // the new key wins
		{none, ""},
	} {
		r, err := s.Lookup(ctx, tc.id)
		switch {
		case tc.wantHost == "" && err != routing.ErrNotFound:
			t.Errorf("lookup %s: %v %v, want ErrNotFound", tc.id, r, err)
		case tc.wantHost != "" && (err != nil || r.HostIP.String() != tc.wantHost):
			t.Errorf("lookup %s: %v %v, want HostIP %s", tc.id, r, err, tc.wantHost)
		}
	}
}

// TestClusterLegacyKeyOnHungNode: a master that hangs (a frozen host, a
// partition that drops packets) until the cluster fails it over holds the
// legacy keys of ids whose routes live on healthy masters. Their new key
// wins, so its answer must not wait for the legacy read: Lookup read both
// in one pipeline, which returns when the last node answers, and every
// cold lookup of such an id (2/9 of the ids with three masters, beside the
// 1/3 whose route is on the hung master) waited out the 1 s budget and was
// a 503 store_unavailable until the failover.
func TestClusterLegacyKeyOnHungNode(t *testing.T) {
	testenv.ParallelRedis(t)
	ctx := context.Background()
	a, b, split := startTwoNodeCluster(t)
	var newOnA []string // new key on a, legacy key on b
	for _, id := range split {
		if onNodeA(t, a, redisstore.DefaultKeyPrefix+id) {
			newOnA = append(newOnA, id)
		}
	}
	if len(newOnA) < 2 {
		t.Fatalf("found only %d ids with the new key on a", len(newOnA))
	}
	routed, unknown := newOnA[0], newOnA[1]
	hset(t, a, redisstore.DefaultKeyPrefix+routed, "HostIP", "10.0.0.1", "80", "20080")

	const budget = time.Second
	s := openStoreCfg(t, redisstore.Config{Cluster: redisstore.ClusterConfig{Addrs: []string{a.Addr()}}, CommandTimeout: budget})
	c := newCache(t, s, routing.CacheConfig{LookupTimeout: budget})
	if _, err := s.Lookup(ctx, routed); err != nil { // both nodes' connections pooled
		t.Fatalf("lookup %s before the hang: %v", routed, err)
	}

	b.Pause()
	t.Cleanup(b.Resume)
	start := time.Now()
	r, _, err := c.Get(ctx, []byte(routed))
	if took := time.Since(start); err != nil || r.HostIP.String() != "10.0.0.1" || took > budget/2 {
		t.Fatalf("get %s with its legacy key's node hung: %v %v after %v, want its route at once", routed, r, err, took)
	}
	// Without an answer for the legacy key an empty new key proves nothing.
	if _, _, err := c.Get(ctx, []byte(unknown)); err == nil || errors.Is(err, routing.ErrNotFound) {
		t.Fatalf("get %s with its legacy key's node hung: %v, want an outage", unknown, err)
	}
}

// TestClusterPublishWithHungMaster: a PUBLISH, a keyless command, goes to
// the masters in turn, and any node relays it to the whole cluster; so
// while one master hangs until the cluster fails it over, an invalidation
// must go out through another. Sent with the whole budget, every
// publish that fell on the hung master (one in two here, one in three
// with three masters) waited it out and answered the admin call 503
// invalidation_not_published. As README's ACL user (no +command) every
// publish failed so, whichever master it went to: go-redis asked a node
// at random for COMMAND's table before it, under a lock, the hung one
// among them, and the refusal left the table to be asked for again.
func TestClusterPublishWithHungMaster(t *testing.T) {
	t.Parallel() // each case takes its own slot (see TestClusterFollowsFailover)
	for _, tc := range []struct {
		name string
		acl  bool
	}{{"default user", false}, {"README's ACL user", true}} {
		t.Run(tc.name, func(t *testing.T) {
			testenv.ParallelRedis(t)
			ctx := context.Background()
			a, b, _ := startTwoNodeCluster(t)
			const budget = time.Second
			cfg := redisstore.Config{Cluster: redisstore.ClusterConfig{Addrs: []string{a.Addr()}}, CommandTimeout: budget}
			if tc.acl {
				for _, r := range []*testenv.Redis{a, b} {
					acl := append([]any{"ACL", "SETUSER", "proxy", "on", ">pw", "resetkeys", "resetchannels", "-@all"}, readmeACLRules(t)...)
					if err := r.Client().Do(ctx, acl...).Err(); err != nil {
						t.Fatalf("ACL SETUSER: %v", err)
					}
				}
				cfg.Username, cfg.Password = "proxy", "pw"
			}
			s := openStoreCfg(t, cfg)
			ps := a.Client().Subscribe(ctx, redisstore.DefaultInvalidateChannel)
			t.Cleanup(func() { _ = ps.Close() })
			if _, err := ps.Receive(ctx); err != nil {
				t.Fatalf("subscribe on a: %v", err)
			}
			receive := func(n int) {
				t.Helper()
				for got := 0; got < n; {
					msg, err := ps.ReceiveTimeout(ctx, 5*time.Second)
					if err != nil {
						t.Fatalf("received %d of %d messages on a: %v", got, n, err)
					}
					if _, ok := msg.(*redis.Message); ok {
						got++
					}
				}
			}
			for i := range 2 { // both masters' connections pooled
				if err := s.Publish(ctx, "warm"+strconv.Itoa(i)); err != nil {
					t.Fatalf("publish before the hang: %v", err)
				}
			}
			receive(2) // b relayed its own before it hangs

			b.Pause()
			t.Cleanup(b.Resume)
			for i := range 4 {
				id := "box" + strconv.Itoa(i)
				start := time.Now()
				if err := s.Publish(ctx, id); err != nil {
					t.Fatalf("publish %s with a master hung: %v after %v", id, err, time.Since(start))
				}
			}
			receive(4)
		})
	}
}

// TestClusterReshardWithLeastPrivilegeACLUser: while a slot moves between
// nodes (adding a node, rebalancing), a key already moved is answered
// with an ASK redirect, which go-redis follows with ASKING before the
// command. The README's ACL for the proxy user must allow it: without it
// every lookup of such a key failed NOPERM (a 503) until the move ended.
func TestClusterReshardWithLeastPrivilegeACLUser(t *testing.T) {
	testenv.ParallelRedis(t)
	ctx := context.Background()
	c := startACLCluster(t, readmeACLRules(t))
	a, b, do := c.a, c.b, c.do

	tests := []struct {
		name string
		id   string // its new key's slot is A's (slots below 8192), and differs from the others'
		cfg  redisstore.Config
	}{
		{"new and legacy key in one pipeline", "moved-0", redisstore.Config{}},
		{"new key alone", "moved-1", redisstore.Config{DisableLegacy: true}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			key := redisstore.DefaultKeyPrefix + tc.id
			slot, err := a.Client().ClusterKeySlot(ctx, key).Result()
			if err != nil || slot >= 8192 {
				t.Fatalf("slot of %s: %d %v, want one of A's", key, slot, err)
			}
			hset(t, a, key, "HostIP", "10.0.0.1")
			// Move the key, and only the key: its slot stays A's, migrating to B.
			do(b, "CLUSTER", "SETSLOT", slot, "IMPORTING", c.aID)
			do(a, "CLUSTER", "SETSLOT", slot, "MIGRATING", c.bID)
			do(a, "MIGRATE", "127.0.0.1", b.Port(), key, 0, 5000)

			tc.cfg.Username, tc.cfg.Password = "proxy", "pw"
			tc.cfg.Cluster = redisstore.ClusterConfig{Addrs: []string{a.Addr()}}
			s := openStoreCfg(t, tc.cfg)
			r, err := s.Lookup(ctx, tc.id)
			if err != nil || r.HostIP.String() != "10.0.0.1" {
				t.Fatalf("lookup of a key moved to another node as the least-privileged user: %v %v", r, err)
			}
		})
	}
}

// TestClusterLegacyKeyMovedWithoutAsking: a route only a legacy key holds,
// whose slot migrates to another node (nodes added, a rebalance) and which
// has moved already, is read through an ASK redirect, which a user without
// +asking (the rules of earlier READMEs) is refused: NOPERM, naming the
// command. The store took every NOPERM of the legacy read for a legacy key
// the user may not read, "no legacy key": the sandbox answered 404, cached
// negatively, its cached route dropped rather than served stale, and the
// log asked for the key pattern the user had. Only a refused key is "no
// legacy key"; a refused command is an outage, as on the new key.
func TestClusterLegacyKeyMovedWithoutAsking(t *testing.T) {
	testenv.ParallelRedis(t)
	ctx := context.Background()
	c := startACLCluster(t, slices.DeleteFunc(readmeACLRules(t), func(r any) bool { return r == "+asking" }))
	a, b, do := c.a, c.b, c.do
	var err error
	// An id whose legacy key's slot is A's.
	var id, key string
	var slot int64
	for i := 0; ; i++ {
		id = "legacy-" + strconv.Itoa(i)
		key = redisstore.DefaultLegacyKeyPrefix + id
		if slot, err = a.Client().ClusterKeySlot(ctx, key).Result(); err != nil {
			t.Fatal(err)
		}
		if slot < 8192 {
			break
		}
	}
	hset(t, a, key, "HostIP", "10.0.0.1")

	s := openStoreCfg(t, redisstore.Config{Username: "proxy", Password: "pw",
		Cluster: redisstore.ClusterConfig{Addrs: []string{a.Addr()}}})
	cache := newCache(t, s, routing.CacheConfig{})
	if r, _, err := cache.Get(ctx, []byte(id)); err != nil || r.HostIP.String() != "10.0.0.1" {
		t.Fatalf("legacy route before the migration: %v %v", r, err)
	}

	// Move the key, and only the key: its slot stays A's, migrating to B.
	do(b, "CLUSTER", "SETSLOT", slot, "IMPORTING", c.aID)
	do(a, "CLUSTER", "SETSLOT", slot, "MIGRATING", c.bID)
	do(a, "MIGRATE", "127.0.0.1", b.Port(), key, 0, 5000)

	_, err = s.Lookup(ctx, id)
	var fe *routing.FieldError
	if err == nil || errors.Is(err, routing.ErrNotFound) || errors.As(err, &fe) {
		t.Fatalf("lookup of a legacy key behind an ASK the user may not follow: %v, want an outage", err)
	}
	if !strings.Contains(err.Error(), "+asking") {
		t.Errorf("the error does not name the rule to grant (+asking): %v", err)
	}
	// The route's re-read (after a resubscription, say) cannot be made:
	// the cached route is served, as through any outage.
	cache.ExpireAll()
	if r, res, err := cache.Get(ctx, []byte(id)); err != nil || res != routing.CacheStale || r.HostIP.String() != "10.0.0.1" {
		t.Errorf("cached legacy route during the migration: %v %v %v, want it served stale", r, res, err)
	}
}

// aclCluster is startTwoNodeCluster's cluster with the ACL user "proxy"
// (password "pw") given rules on both nodes.
type aclCluster struct {
	a, b     *testenv.Redis
	aID, bID string
	do       func(r *testenv.Redis, args ...any) // a command on r that must succeed
}

func startACLCluster(t *testing.T, rules []any) aclCluster {
	t.Helper()
	ctx := context.Background()
	var c aclCluster
	c.a, c.b, _ = startTwoNodeCluster(t)
	c.do = func(r *testenv.Redis, args ...any) {
		t.Helper()
		if err := r.Client().Do(ctx, args...).Err(); err != nil {
			t.Fatalf("%v on %s: %v", args, r.Addr(), err)
		}
	}
	for _, n := range []*testenv.Redis{c.a, c.b} {
		c.do(n, append([]any{"ACL", "SETUSER", "proxy", "on", ">pw", "resetkeys", "resetchannels", "-@all"}, rules...)...)
	}
	var err error
	if c.aID, err = c.a.Client().ClusterMyID(ctx).Result(); err != nil {
		t.Fatal(err)
	}
	if c.bID, err = c.b.Client().ClusterMyID(ctx).Result(); err != nil {
		t.Fatal(err)
	}
	return c
}

// startFailoverCluster starts a Redis Cluster of three masters, each
// owning a third of the slots, and a replica of the first, which owns
// the invalidation channel's slot (3183). A master that stops answering
// for the cluster's node timeout (1 s here) is failed over to its replica.
// The replica's first sync starts at once: Redis's default 5 s wait for
// more replicas to share a diskless transfer (repl-diskless-sync-delay)
// took more time than any of these tests' own steps.
func startFailoverCluster(t *testing.T) (masters []*testenv.Redis, replica *testenv.Redis) {
	t.Helper()
	ctx := context.Background()
	args := []string{"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "1000", "--repl-diskless-sync-delay", "0"}
	for range 3 {
		masters = append(masters, testenv.StartRedis(t, args...))
	}
	replica = testenv.StartRedis(t, args...)
	do := func(r *testenv.Redis, args ...any) {
		t.Helper()
		if err := r.Client().Do(ctx, args...).Err(); err != nil {
			t.Fatalf("%v on %s: %v", args, r.Addr(), err)
		}
	}
	do(masters[0], "CLUSTER", "ADDSLOTSRANGE", 0, 5460)
	do(masters[1], "CLUSTER", "ADDSLOTSRANGE", 5461, 10922)
	do(masters[2], "CLUSTER", "ADDSLOTSRANGE", 10923, 16383)
	for _, n := range append(masters[1:], replica) {
		do(masters[0], "CLUSTER", "MEET", "127.0.0.1", n.Port())
	}
	all := append(slices.Clone(masters), replica)
	for _, n := range all {
		testenv.WaitFor(t, 30*time.Second, "cluster_state:ok on every node", func() bool {
			info, err := n.Client().ClusterInfo(ctx).Result()
			return err == nil && strings.Contains(info, "cluster_state:ok") && strings.Contains(info, "cluster_known_nodes:4")
		})
	}
	id, err := masters[0].Client().ClusterMyID(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	do(replica, "CLUSTER", "REPLICATE", id)
	testenv.WaitFor(t, 30*time.Second, "the replica's link to its master", func() bool {
		info, err := replica.Client().Info(ctx, "replication").Result()
		return err == nil && strings.Contains(info, "master_link_status:up")
	})
	waitReplicaKnown(t, replica, masters)
	return masters, replica
}

// TestClusterFollowsFailover: a Cluster master dies or hangs, and the
// cluster promotes its replica within a second or two of its node
// timeout. go-redis re-reads the slot map only on a MOVED, or every
// ClusterStateReloadInterval (60 s): a master that no longer answers
// sends no MOVED, so lookups of its keys kept going to it, and failed
// (503), for up to a minute after the cluster had failed over, and the
// invalidation subscription (on the master of the channel's slot) stayed
// with it as long: a revoked token was accepted 45 s after its rotation
// in a measured run. Lookups must work again, and invalidations arrive,
// within seconds of the promotion.
func TestClusterFollowsFailover(t *testing.T) {
	// Each case takes a slot of its own (ParallelRedis) and the two run
	// at once: each waits seconds on the cluster's failover. The parent
	// holds none, or the cases could wait for slots parents hold.
	t.Parallel()
	for _, tc := range []struct {
		name string
		fail func(*testing.T, *testenv.Redis)
	}{
		{"master killed", func(_ *testing.T, r *testenv.Redis) { r.Stop() }},
		{"master hung", func(t *testing.T, r *testenv.Redis) { r.Pause(); t.Cleanup(r.Resume) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			testenv.ParallelRedis(t)
			ctx := context.Background()
			masters, replica := startFailoverCluster(t)
			// An id whose route key is in the first master's slots.
			s, id := storeWithRouteOnFirstMaster(t, masters)
			rec := subscribed(t, s)

			tc.fail(t, masters[0])
			testenv.WaitFor(t, 30*time.Second, "the replica promoted", func() bool {
				role, err := replica.Client().Do(ctx, "ROLE").Slice()
				info, ierr := masters[1].Client().ClusterInfo(ctx).Result()
				return err == nil && role[0] == "master" && ierr == nil && strings.Contains(info, "cluster_state:ok")
			})
			promoted := time.Now()

			// The subscription first: no lookup fails meanwhile to
			// make the client re-read the slot map.
			publishUntilReceived(t, replica.Client(), rec, promoted, 5*time.Second, "published on the promoted replica", "its promotion")
			var err error
			for _, err = s.Lookup(ctx, id); err != nil; _, err = s.Lookup(ctx, id) {
				if time.Since(promoted) > 5*time.Second {
					t.Fatalf("lookups still fail %v after the replica was promoted: %v", time.Since(promoted).Round(time.Millisecond), err)
				}
			}
		})
	}
}

// TestClusterLookupRetries: a master accepts connections and drops
// them (its port taken over by a listener that does only that), and a
// lookup of a key it holds is retried by the Cluster client (the same
// master again, then the one the slot map names), each try on a new
// connection. Each of those tries was retried twice more by the node's
// own client: 12 to 14 connections for one lookup, which took 200 to
// 250 ms to fail (a 503 that waited that long for every cold lookup of
// a master that went down, 240 ms on average under load on the binary),
// where the standalone and Sentinel clients make at most 3.
func TestClusterLookupRetries(t *testing.T) {
	masters, _ := startFailoverCluster(t)
	s, id := storeWithRouteOnFirstMaster(t, masters)
	masters[0].Stop()
	l, err := net.Listen("tcp", masters[0].Addr())
	if err != nil {
		t.Fatalf("take over the stopped master's port: %v", err)
	}
	var accepted atomic.Int64
	testenv.Serve(t, l, func(c net.Conn) {
		accepted.Add(1)
		c.Close()
	})
	for range 5 {
		before := accepted.Load()
		if _, err := s.Lookup(context.Background(), id); err == nil {
			t.Fatal("lookup on a master that drops every connection succeeded")
		}
		// 4 tries, and the slot map read again, which may ask this master.
		if n := accepted.Load() - before; n > 6 {
			t.Fatalf("%d connections for one lookup, want at most 6", n)
		}
	}
}

// TestClusterFollowsNodeRemoval: a master is failed over by hand
// (CLUSTER FAILOVER on its replica) and then removed from the cluster
// (redis-cli --cluster del-node: the others forget it, it is reset and
// keeps running, empty). A node cut off from the cluster's majority looks
// the same to a client that still reaches it: until the client reads the
// slot map again, lookups of its old slots go to it and it answers
// CLUSTERDOWN, a reply, on which go-redis does not re-read the map: they
// failed (503) until its periodic reload, up to a minute (25 s measured
// with three proxies). They must work again within seconds.
func TestClusterFollowsNodeRemoval(t *testing.T) {
	testenv.ParallelRedis(t)
	ctx := context.Background()
	masters, replica := startFailoverCluster(t)
	s, id := storeWithRouteOnFirstMaster(t, masters)

	removeAfterFailover(t, masters, replica)
	removed := time.Now()
	var err error
	for _, err = s.Lookup(ctx, id); err != nil; _, err = s.Lookup(ctx, id) {
		if time.Since(removed) > 5*time.Second {
			t.Fatalf("lookups still fail %v after the old master was removed: %v", time.Since(removed).Round(time.Millisecond), err)
		}
	}
}

// removeAfterFailover fails startFailoverCluster's first master over to
// its replica by hand and removes it from the cluster as redis-cli's
// del-node does: the others forget it, and it is reset, still running.
func removeAfterFailover(t *testing.T, masters []*testenv.Redis, replica *testenv.Redis) {
	t.Helper()
	failOverAndRemove(t, masters[0], replica, masters[1:])
}

// failOverAndRemove fails the master leaving over to its replica taking
// (CLUSTER FAILOVER on it) and removes leaving from the cluster as
// redis-cli's del-node does: taking and the others forget it, and it is
// reset, still running.
func failOverAndRemove(t *testing.T, leaving, taking *testenv.Redis, others []*testenv.Redis) {
	t.Helper()
	ctx := context.Background()
	do := func(r *testenv.Redis, args ...any) {
		t.Helper()
		if err := r.Client().Do(ctx, args...).Err(); err != nil {
			t.Fatalf("%v on %s: %v", args, r.Addr(), err)
		}
	}
	// A manual failover needs the master and the voting masters to know
	// taking as its replica: right after another failover they may not yet.
	waitReplicaKnown(t, taking, append(slices.Clone(others), leaving))
	do(taking, "CLUSTER", "FAILOVER")
	testenv.WaitFor(t, 10*time.Second, "the replica promoted", func() bool {
		role, err := leaving.Client().Do(ctx, "ROLE").Slice()
		return err == nil && role[0] == "slave"
	})
	gone, err := leaving.Client().ClusterMyID(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range append(slices.Clone(others), taking) {
		do(r, "CLUSTER", "FORGET", gone)
	}
	do(leaving, "CLUSTER", "RESET", "SOFT")
}

// waitReplicaKnown waits until every one of nodes knows replica as a
// replica: a failover, manual or not, needs the votes of the masters, and
// they learn a new role by gossip, within a second or so.
func waitReplicaKnown(t *testing.T, replica *testenv.Redis, nodes []*testenv.Redis) {
	t.Helper()
	ctx := context.Background()
	id, err := replica.Client().ClusterMyID(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 10*time.Second, "every node to know the replica", func() bool {
		for _, r := range nodes {
			known, err := r.Client().ClusterNodes(ctx).Result()
			if err != nil || !strings.Contains(known, id+" 127.0.0.1:"+strconv.Itoa(replica.Port())+"@") {
				return false
			}
			for line := range strings.SplitSeq(known, "\n") {
				if strings.HasPrefix(line, id+" ") && !strings.Contains(line, " slave ") {
					return false
				}
			}
		}
		return true
	})
}

// TestClusterInvalidationAfterNodeRemoval: the node the subscription is
// on (the channel slot's master, failed over by hand) is removed from the
// cluster, or cut off from its majority. It keeps running and answers
// PINGs, but no message published elsewhere reaches it any more: every
// instance lost every invalidation for as long as it ran, with
// cubeproxy_route_invalidation_subscribed at 1 (measured with three
// proxies: 6 of 8 announced changes not applied after 3 s). The
// subscription must move to a node of the cluster within seconds.
func TestClusterInvalidationAfterNodeRemoval(t *testing.T) {
	testenv.ParallelRedis(t)
	masters, replica := startFailoverCluster(t)
	rec := subscribedToCluster(t, masters)

	removeAfterFailover(t, masters, replica)
	removed := time.Now()
	publishUntilReceived(t, masters[1].Client(), rec, removed, 10*time.Second, "published on a node of the cluster", "the subscribed node was removed")
}

// TestClusterInvalidationAfterFailedOverNodeRemoval: the channel slot's
// master, which the subscription is on, is failed over to its replica
// (CLUSTER FAILOVER), and the subscription's connection is then dropped:
// go-redis connects it again to the slot's master of the moment, the
// promoted replica (as it does after a master is killed, when the
// promotion comes before the subscription leaves the dead node). The old
// master takes its slots back, and the node the subscription is on is
// removed from the cluster. The subscription must leave it, as when it
// never moved (TestClusterInvalidationAfterNodeRemoval): the membership
// check asked the node of the first subscription, the old master, which
// answers cluster_state:ok, so the subscription stayed on the removed
// node for as long as it ran (measured on the binary over TLS: 0 of 300
// changes applied in 25 s, 769 stale answers, the gauge at 1).
func TestClusterInvalidationAfterFailedOverNodeRemoval(t *testing.T) {
	testenv.ParallelRedis(t)
	ctx := context.Background()
	masters, replica := startFailoverCluster(t)
	rec := subscribedToCluster(t, masters)

	if err := replica.Client().Do(ctx, "CLUSTER", "FAILOVER").Err(); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 10*time.Second, "the replica promoted", func() bool {
		role, err := masters[0].Client().Do(ctx, "ROLE").Slice()
		return err == nil && role[0] == "slave"
	})
	// The first reconnection may still read the old slot map (the drop
	// makes the client read it again, in the background); the next reads
	// the new one.
	testenv.WaitFor(t, 10*time.Second, "the subscription reconnected to the promoted replica", func() bool {
		if subscribedHere(t, replica) {
			return true
		}
		if subscribedHere(t, masters[0]) {
			if err := masters[0].Client().Do(ctx, "CLIENT", "KILL", "TYPE", "pubsub").Err(); err != nil {
				t.Fatal(err)
			}
		}
		return false
	})
	publishUntilReceived(t, masters[1].Client(), rec, time.Now(), 5*time.Second, "published on a node of the cluster", "the subscription moved to the promoted replica")

	testenv.WaitFor(t, 30*time.Second, "the old master's link to the promoted replica", func() bool {
		info, err := masters[0].Client().Info(ctx, "replication").Result()
		return err == nil && strings.Contains(info, "master_link_status:up")
	})
	failOverAndRemove(t, replica, masters[0], masters[1:])
	removed := time.Now()
	publishUntilReceived(t, masters[1].Client(), rec, removed, 10*time.Second, "published on a node of the cluster", "the subscribed node was removed")
}

// subscribedHere reports whether a client of r is subscribed to a channel.
func subscribedHere(t *testing.T, r *testenv.Redis) bool {
	t.Helper()
	list, err := r.Client().ClientList(context.Background()).Result()
	if err != nil {
		t.Fatalf("client list on %s: %v", r.Addr(), err)
	}
	return strings.Contains(list, " sub=1 ")
}

// TestClusterInvalidationWithoutChannelSlotOwner: the master that owns
// the invalidation channel's slot dies with no replica to take over, in
// a cluster that keeps serving its other slots
// (cluster-require-full-coverage no). Pub/sub messages reach every node
// of a cluster, and the control plane's PUBLISH, answered by any node,
// succeeds; but go-redis subscribes only on the channel slot's master,
// so every instance lost every invalidation for as long as that node
// was down, while the routes of the other nodes' sandboxes, revoked
// tokens included, were served from the cache (measured: a rotated token
// still accepted after 20 s, and until the route's TTL).
func TestClusterInvalidationWithoutChannelSlotOwner(t *testing.T) {
	testenv.ParallelRedis(t)
	ctx := context.Background()
	masters, replica := startFailoverCluster(t)
	for _, n := range append(slices.Clone(masters), replica) {
		if err := n.Client().ConfigSet(ctx, "cluster-require-full-coverage", "no").Err(); err != nil {
			t.Fatal(err)
		}
	}
	rec := subscribedToCluster(t, masters)

	replica.Stop()
	masters[0].Stop()
	down := time.Now()
	publishUntilReceived(t, masters[1].Client(), rec, down, 10*time.Second, "published on a live node", "the channel slot's master died")
}

// TestClusterInvalidationFromKilledNode: the node the subscription is on
// is killed, and no replica takes its place soon (here none: the default
// cluster-node-timeout of 15 s and an election are as long). go-redis
// dials it again every 100 ms, each dial refused, and the subscription
// was left only by the PING, 6 command timeouts after the last reply (6 s
// by default), every invalidation published meanwhile lost. It must move
// to a live node within a second or two.
func TestClusterInvalidationFromKilledNode(t *testing.T) {
	testenv.ParallelRedis(t)
	ctx := context.Background()
	masters, replica := startFailoverCluster(t)
	for _, n := range append(slices.Clone(masters), replica) {
		if err := n.Client().ConfigSet(ctx, "cluster-require-full-coverage", "no").Err(); err != nil {
			t.Fatal(err)
		}
	}
	addrs := []string{masters[0].Addr(), masters[1].Addr(), masters[2].Addr()}
	rec := subscribed(t, openStoreCfg(t, redisstore.Config{Cluster: redisstore.ClusterConfig{Addrs: addrs}, CommandTimeout: time.Second}))

	replica.Stop()
	masters[0].Stop() // the channel slot's master, where the subscription is
	killed := time.Now()
	publishUntilReceived(t, masters[1].Client(), rec, killed, 3*time.Second, "published on a live node", "the subscribed node was killed")
}

// publishUntilReceived publishes an invalidation through c every 100 ms
// until rec receives it, and fails the test when none has arrived within
// of since (the event named by after). The id is since's own: one
// published by an earlier call may still arrive after that call returned.
func publishUntilReceived(t *testing.T, c *redis.Client, rec recorder, since time.Time, within time.Duration, on, after string) {
	t.Helper()
	id := "after-" + strconv.FormatInt(since.UnixNano(), 36)
	deadline := time.After(within - time.Since(since))
	for {
		if err := c.Publish(context.Background(), redisstore.DefaultInvalidateChannel, id).Err(); err != nil {
			t.Fatal(err)
		}
		select {
		case got := <-rec:
			if got == id {
				return
			}
		case <-time.After(100 * time.Millisecond):
		case <-deadline:
			t.Fatalf("no invalidation %s arrived %v after %s", on, time.Since(since).Round(time.Millisecond), after)
		}
	}
}

// TestClusterInvalidationWhileClusterDown: a master with no replica dies
// in a cluster that requires full coverage (Redis's default), and every
// node says cluster_state:fail while it is down, the subscribed one too;
// a failover says the same for the second or two before the promotion.
// PUBLISH still works there, and a message published on any node still
// reaches every other: the subscribed node is in the cluster, and
// nothing is gained by leaving it. Left every sub.idle for the next node
// (the dead master among them, where nothing arrives until the PING
// fails), the subscription missed invalidations published meanwhile.
func TestClusterInvalidationWhileClusterDown(t *testing.T) {
	testenv.ParallelRedis(t)
	ctx := context.Background()
	masters, replica := startFailoverCluster(t)
	rec := subscribedToCluster(t, masters)

	masters[2].Stop() // no replica: its slots are uncovered
	testenv.WaitFor(t, 30*time.Second, "cluster_state:fail on the live nodes", func() bool {
		for _, n := range []*testenv.Redis{masters[0], masters[1], replica} {
			info, err := n.Client().ClusterInfo(ctx).Result()
			if err != nil || !strings.Contains(info, "cluster_state:fail") {
				return false
			}
		}
		return true
	})
	// Each published id must arrive: 40 over 3 s, the membership checks
	// of three idle periods (900 ms each with the 300 ms command timeout).
	const n = 40
	for i := range n {
		if err := masters[1].Client().Publish(ctx, redisstore.DefaultInvalidateChannel, "down"+strconv.Itoa(i)).Err(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(75 * time.Millisecond) // the pace of the control plane's changes, not a wait for an acknowledgement
	}
	got := map[string]bool{}
	deadline := time.After(3 * time.Second)
	for len(got) < n {
		select {
		case id := <-rec:
			if strings.HasPrefix(id, "down") {
				got[id] = true
			}
		case <-deadline:
			t.Fatalf("%d of %d invalidations published while the cluster was down arrived", len(got), n)
		}
	}
}

// storeWithRouteOnFirstMaster writes a route whose key is in the first
// master's slots (startFailoverCluster's 0-5460), waits for its replica
// to have it, and opens a store on the three masters (300 ms command
// timeout) that has looked it up once. It returns the store and the id.
func storeWithRouteOnFirstMaster(t *testing.T, masters []*testenv.Redis) (*redisstore.Store, string) {
	t.Helper()
	ctx := context.Background()
	var id string
	for i := 0; id == ""; i++ {
		slot, err := masters[0].Client().ClusterKeySlot(ctx, redisstore.DefaultKeyPrefix+"box"+strconv.Itoa(i)).Result()
		if err != nil {
			t.Fatal(err)
		}
		if slot <= 5460 {
			id = "box" + strconv.Itoa(i)
		}
	}
	hset(t, masters[0], redisstore.DefaultKeyPrefix+id, "HostIP", "10.0.0.1")
	testenv.WaitReplicated(t, masters[0])
	addrs := []string{masters[0].Addr(), masters[1].Addr(), masters[2].Addr()}
	s := openStoreCfg(t, redisstore.Config{Cluster: redisstore.ClusterConfig{Addrs: addrs}, CommandTimeout: 300 * time.Millisecond})
	if _, err := s.Lookup(ctx, id); err != nil {
		t.Fatalf("lookup before the failover: %v", err)
	}
	return s, id
}

// subscribedToCluster opens a store on the three masters of a failover
// cluster (a 300 ms command timeout) and returns the recorder of its
// invalidations, once the subscription is confirmed.
func subscribedToCluster(t *testing.T, masters []*testenv.Redis) recorder {
	t.Helper()
	addrs := []string{masters[0].Addr(), masters[1].Addr(), masters[2].Addr()}
	return subscribed(t, openStoreCfg(t, redisstore.Config{Cluster: redisstore.ClusterConfig{Addrs: addrs}, CommandTimeout: 300 * time.Millisecond}))
}

// subscribed subscribes s to a new recorder, closed with the test, and
// returns it once the subscription is confirmed.
func subscribed(t *testing.T, s *redisstore.Store) recorder {
	t.Helper()
	rec := make(recorder, 1024)
	sub := s.Subscribe(context.Background(), rec, nil)
	t.Cleanup(func() { _ = sub.Close() })
	waitReady(t, sub)
	return rec
}

// TestClusterNodeAsStandaloneAddr: redis.addr set to one node of a
// Cluster (redis.cluster.addrs was meant) reads the routes that node
// holds and answers MOVED for the others, a 503 whose log line and
// /readyz detail said only "MOVED 15495 127.0.0.1:7001": some sandboxes
// worked and others did not, with nothing naming the setting. The error
// names it.
func TestClusterNodeAsStandaloneAddr(t *testing.T) {
	testenv.ParallelRedis(t)
	a, _, _ := startTwoNodeCluster(t)
	s := openStoreCfg(t, redisstore.Config{Addr: a.Addr()})
	for _, legacy := range []bool{false, true} {
		// An id whose new key (or, read when that is empty, legacy key)
		// lives on the other node.
		id := ""
		for i := 0; id == "" && i < 1000; i++ {
			c := "moved" + strconv.Itoa(i)
			onA := onNodeA(t, a, redisstore.DefaultKeyPrefix+c)
			if legacy {
				onA = !onA || onNodeA(t, a, redisstore.DefaultLegacyKeyPrefix+c)
			}
			if !onA {
				id = c
			}
		}
		_, err := s.Lookup(context.Background(), id)
		if err == nil || !strings.Contains(err.Error(), "MOVED") || !strings.Contains(err.Error(), "redis.cluster.addrs") {
			t.Errorf("lookup of %s (legacy key on the other node: %v) through one node of a Cluster: %v, want MOVED and redis.cluster.addrs named", id, legacy, err)
		}
	}
}

// TestClusterFrozenNodeErrorNamesNode: a master that freezes after the
// proxy started (SIGSTOP here; a frozen host, a stalled process: its
// kernel still takes the connection) failed each lookup of a key it holds
// with a bare "redis hgetall KEY: context deadline exceeded", where the
// standalone and Sentinel clients name the server
// (TestHungRedisErrorNamesServer): the Cluster client retries the node's
// timeout and ends on its own deadline, naming no node. The error names
// the node that holds the key, the new key's or, when the new key is
// empty on a healthy master, the legacy key's, and still tells the
// deadline by errors.Is.
func TestClusterFrozenNodeErrorNamesNode(t *testing.T) {
	testenv.ParallelRedis(t)
	a, b, split := startTwoNodeCluster(t)
	var newOnB, legacyOnB string
	for _, id := range split {
		if onNodeA(t, a, redisstore.DefaultKeyPrefix+id) {
			legacyOnB = id
		} else {
			newOnB = id
		}
	}
	s := openStoreCfg(t, redisstore.Config{Cluster: redisstore.ClusterConfig{Addrs: []string{a.Addr()}}})
	for _, id := range []string{newOnB, legacyOnB} { // both nodes' connections pooled
		if _, err := s.Lookup(context.Background(), id); !errors.Is(err, routing.ErrNotFound) {
			t.Fatalf("lookup %s before the freeze: %v, want not found", id, err)
		}
	}
	b.Pause()
	t.Cleanup(b.Resume)
	// go-redis names a loopback node ":port" (see emptySlotMap).
	node := ":" + strconv.Itoa(b.Port())
	for _, tc := range []struct{ name, id string }{{"new key", newOnB}, {"legacy key", legacyOnB}} {
		t.Run(tc.name, func(t *testing.T) {
			for range 2 {
				start := time.Now()
				_, err := s.Lookup(context.Background(), tc.id)
				if d := time.Since(start); d > 2*s.Config().CommandTimeout {
					t.Errorf("lookup took %v, past twice its budget", d)
				}
				if err == nil || !strings.Contains(err.Error(), "no answer from") || !strings.Contains(err.Error(), node) {
					t.Errorf("lookup %s with its node frozen: %v, want it to name the node %s", tc.id, err, node)
				}
				if !errors.Is(err, context.DeadlineExceeded) {
					t.Errorf("lookup error %q is no deadline", err)
				}
			}
		})
	}
}
