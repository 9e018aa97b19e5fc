package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
	"github.com/cube-sandbox/cubeproxy/routing"
	"github.com/cube-sandbox/cubeproxy/routing/redisstore"
	"github.com/redis/go-redis/v9"
)

// recorder is an Invalidator that reports every id it is asked to drop;
// expiring everything is reported as "*".
type recorder chan string

func (r recorder) Invalidate(id string) int {
	r <- id
	return 1
}

func (r recorder) ExpireAll() int {
	r <- "*"
	return 0
}

func waitReady(t testing.TB, sub *redisstore.Subscriber) {
	t.Helper()
	select {
	case <-sub.Ready():
	case <-time.After(5 * time.Second):
		t.Fatal("subscriber not ready after 5s")
	}
}

func expectID(t testing.TB, rec recorder, want string) {
	t.Helper()
	select {
	case got := <-rec:
		if got != want {
			t.Fatalf("invalidated %q, want %q", got, want)
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("no invalidation of %q within 5s", want)
	}
}

// TestInvalidationAcrossInstances: two proxy instances share one Redis; a
// publish through instance A makes both drop the entry, so B re-reads Redis.
func TestInvalidationAcrossInstances(t *testing.T) {
	testenv.ParallelRedis(t)
	r := testenv.StartRedis(t)
	key := redisstore.DefaultKeyPrefix + "sbx"
	hset(t, r, key, "HostIP", "10.0.0.1", "50005", "30001")

	type instance struct {
		store *redisstore.Store
		cache *routing.Cache
		sub   *redisstore.Subscriber
	}
	var inst [2]instance
	for i := range inst {
		s := openStore(t, r)
		c := newCache(t, s, routing.CacheConfig{})
		sub := s.Subscribe(context.Background(), c, nil)
		t.Cleanup(func() { _ = sub.Close() })
		waitReady(t, sub)
		if _, _, err := c.Get(context.Background(), []byte("sbx")); err != nil {
			t.Fatal(err)
		}
		inst[i] = instance{s, c, sub}
	}

	// The control plane moves the sandbox; both instances still serve the cached route.
	hset(t, r, key, "HostIP", "10.0.0.2")
	for i, in := range inst {
		route, res, _ := in.cache.Get(context.Background(), []byte("sbx"))
		if res != routing.CacheHit || route.HostIP != netip.MustParseAddr("10.0.0.1") {
			t.Fatalf("instance %d before invalidation: %v %v", i, res, route)
		}
	}

	if err := inst[0].store.Publish(context.Background(), "sbx"); err != nil {
		t.Fatal(err)
	}
	for i, in := range inst {
		testenv.WaitFor(t, 5*time.Second, "invalidation applied", func() bool { return in.sub.Applied() >= 1 })
		route, res, err := in.cache.Get(context.Background(), []byte("sbx"))
		if err != nil || res != routing.CacheMiss || route.HostIP != netip.MustParseAddr("10.0.0.2") {
			t.Fatalf("instance %d after invalidation: %v %v %v, want a fresh read of 10.0.0.2", i, res, route, err)
		}
	}
}

// TestInvalidationSurvivesRestart: after redis-server restarts, the
// subscriber resubscribes by itself and applies messages again.
func TestInvalidationSurvivesRestart(t *testing.T) {
	testenv.ParallelRedis(t)
	r := testenv.StartRedis(t)
	s := openStore(t, r)
	rec := make(recorder, 16)
	sub := s.Subscribe(context.Background(), rec, nil)
	t.Cleanup(func() { _ = sub.Close() })
	waitReady(t, sub)
	expectID(t, rec, "*") // the cache is dropped on subscribing
	if err := r.Client().Publish(context.Background(), redisstore.DefaultInvalidateChannel, "before").Err(); err != nil {
		t.Fatal(err)
	}
	expectID(t, rec, "before")

	r.Restart()
	testenv.WaitFor(t, 10*time.Second, "resubscription", func() bool { return sub.Subscriptions() >= 2 })
	expectID(t, rec, "*") // and again on resubscribing: messages may have been lost
	// Published by another client, like another proxy instance would.
	if err := r.Client().Publish(context.Background(), redisstore.DefaultInvalidateChannel, " AFTER\n").Err(); err != nil {
		t.Fatal(err)
	}
	expectID(t, rec, "after") // trimmed and lower-cased
}

// TestSubscriberStops: cancelling the context unsubscribes and ends the loop;
// bad payloads are ignored without reaching the cache.
func TestSubscriberStops(t *testing.T) {
	testenv.ParallelRedis(t)
	r := testenv.StartRedis(t)
	s := openStore(t, r)
	rec := make(recorder, 16)
	ctx, cancel := context.WithCancel(context.Background())
	sub := s.Subscribe(ctx, rec, nil)
	waitReady(t, sub)
	expectID(t, rec, "*")

	for _, bad := range []string{"", "bad id", "x*"} {
		if err := s.Publish(context.Background(), bad); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Publish(context.Background(), "good"); err != nil {
		t.Fatal(err)
	}
	expectID(t, rec, "good") // messages are ordered: the bad ones were skipped

	cancel()
	testenv.WaitFor(t, 5*time.Second, "unsubscribe", func() bool {
		n, err := r.Client().PubSubNumSub(context.Background(), redisstore.DefaultInvalidateChannel).Result()
		return err == nil && n[redisstore.DefaultInvalidateChannel] == 0
	})
	_ = sub.Close() // waits for the loop; must not block after ctx cancel
	if sub.Applied() != 1 {
		t.Fatalf("applied %d messages, want 1", sub.Applied())
	}
}

// TestReconnectDropsCache: an invalidation published while the subscriber
// was disconnected is lost, and it may have made a sandbox private; the
// resubscription expires the cache, so the next request reads Redis again.
func TestReconnectDropsCache(t *testing.T) {
	testenv.ParallelRedis(t)
	r := testenv.StartRedis(t)
	key := redisstore.DefaultKeyPrefix + "flip"
	hset(t, r, key, "HostIP", "10.0.0.1", "50005", "30001")
	s := openStore(t, r)
	c := newCache(t, s, routing.CacheConfig{})
	sub := s.Subscribe(context.Background(), c, nil)
	t.Cleanup(func() { _ = sub.Close() })
	waitReady(t, sub)
	ctx := context.Background()
	if rt, _, err := c.Get(ctx, []byte("flip")); err != nil || !rt.Public {
		t.Fatalf("before: %v %v", rt, err)
	}
	// In one transaction: cut the subscriber's connection, make the sandbox
	// private, and publish its invalidation, which nobody receives.
	_, err := r.Client().TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.Do(ctx, "CLIENT", "KILL", "TYPE", "pubsub")
		p.HSet(ctx, key, "AllowPublicTraffic", "false", "TrafficAccessToken", token)
		p.Publish(ctx, redisstore.DefaultInvalidateChannel, "flip")
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 10*time.Second, "resubscription", func() bool { return sub.Subscriptions() >= 2 })
	rt, res, err := c.Get(ctx, []byte("flip"))
	if err != nil || rt.Public || res != routing.CacheMiss {
		t.Fatalf("after the reconnect: %v public=%v, %v; want a fresh read of the private route", res, rt != nil && rt.Public, err)
	}
}

// TestFailedReconnectIsLoggedWithItsCause: the subscription's connection
// is dropped and every new one fails (the server's certificate is of a CA
// the proxy does not trust, or expired; Redis is down). The subscriber
// gives the PubSub up after its PING got no reply, as it does a
// connection that hangs, and logged only "no reply to PING": the reason
// every connection failed was said nowhere, while invalidations were lost.
// The line must say the failed connection's error instead.
func TestFailedReconnectIsLoggedWithItsCause(t *testing.T) {
	for _, tc := range []struct {
		name  string
		fail  func(t *testing.T, f mtlsFiles, r *testenv.Redis) // makes every new connection fail
		cause string
	}{
		{"server certificate of an unknown CA", func(t *testing.T, f mtlsFiles, r *testenv.Redis) {
			other := testenv.NewCA(t, "a CA the proxy does not trust")
			cert, key := filepath.Join(f.dir, "other.pem"), filepath.Join(f.dir, "other.key")
			other.WritePair(t, cert, key, "127.0.0.1")
			serveCertificate(t, r, cert, key)
		}, "certificate signed by unknown authority"},
		{"expired server certificate", func(t *testing.T, f mtlsFiles, r *testenv.Redis) {
			certPEM, keyPEM := f.authority.IssueValid(t, time.Now().Add(-2*time.Hour), time.Now().Add(-time.Hour), "127.0.0.1")
			serveCertificate(t, r, f.write(t, "expired.pem", certPEM), f.write(t, "expired.key", keyPEM))
		}, "certificate has expired"},
		{"Redis stopped", func(_ *testing.T, _ mtlsFiles, r *testenv.Redis) { r.Stop() }, "connection refused"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newMTLSFiles(t)
			r := testenv.StartRedis(t, append(f.serverArgs(), "--tls-auth-clients", "no")...)
			s := openStoreCfg(t, redisstore.Config{Addr: r.OtherAddr(), TLS: true, CAFile: f.ca, CommandTimeout: 200 * time.Millisecond})
			var logs testenv.LogBuffer
			sub := s.Subscribe(context.Background(), make(recorder, 16), slog.New(slog.NewJSONHandler(&logs, nil)))
			t.Cleanup(func() { _ = sub.Close() })
			waitReady(t, sub)

			tc.fail(t, f, r)
			testenv.Eventually(t, 5*time.Second, func() error {
				if testenv.CountLines(logs.String(), `"level":"WARN"`, tc.cause) == 0 {
					return fmt.Errorf("no warning says %q:\n%s", tc.cause, logs.String())
				}
				return nil
			})
			if strings.Contains(logs.String(), "no reply to PING") {
				t.Errorf("the failed reconnection is logged as a PING without reply:\n%s", logs.String())
			}
		})
	}
}

// serveCertificate makes r present the pair certFile, keyFile to new TLS
// connections, and drops its clients' connections, which then connect again.
func serveCertificate(t *testing.T, r *testenv.Redis, certFile, keyFile string) {
	t.Helper()
	ctx := context.Background()
	if err := r.Client().Do(ctx, "CONFIG", "SET", "tls-cert-file", certFile, "tls-key-file", keyFile).Err(); err != nil {
		t.Fatalf("config set tls-cert-file and tls-key-file: %v", err)
	}
	if err := r.Client().Do(ctx, "CLIENT", "KILL", "TYPE", "pubsub").Err(); err != nil {
		t.Fatalf("client kill: %v", err)
	}
}

// TestSubscribeDeniedIsLogged: an ACL user without access to the
// invalidation channel (Redis 7 gives new users none by default) reads
// routes fine but never subscribes; that must not go unnoticed, since
// other instances' invalidations are then never applied here.
func TestSubscribeDeniedIsLogged(t *testing.T) {
	testenv.ParallelRedis(t)
	r := testenv.StartRedis(t)
	if err := r.Client().Do(context.Background(), "ACL", "SETUSER", "reader", "on", ">pw", "~*", "+@all", "resetchannels").Err(); err != nil {
		t.Fatal(err)
	}
	s := openStoreCfg(t, redisstore.Config{Addr: r.Addr(), Username: "reader", Password: "pw", CommandTimeout: 100 * time.Millisecond})
	var logs testenv.LogBuffer
	sub := s.Subscribe(context.Background(), make(recorder, 16), slog.New(slog.NewJSONHandler(&logs, nil)))
	t.Cleanup(func() { _ = sub.Close() })
	testenv.WaitFor(t, 5*time.Second, "an error log saying invalidations are not received", func() bool {
		return strings.Contains(logs.String(), `"level":"ERROR"`) && strings.Contains(logs.String(), "not subscribed")
	})
	if sub.Subscriptions() != 0 {
		t.Fatalf("subscribed %d times without channel permission", sub.Subscriptions())
	}
}

// TestRestartWhileLoadingServesCached: a Redis restarted with its data
// accepts SUBSCRIBE while it still answers every read with LOADING. The
// resubscription must make cached routes be read again, not forget them:
// while Redis loads, they are served from the cache (stale), as any
// expired route is while the store fails, instead of every sandbox
// answering 503 for as long as the dataset takes to load.
func TestRestartWhileLoadingServesCached(t *testing.T) {
	testenv.ParallelRedis(t)
	// 4000 keys at 500 µs each: about 2 s of LOADING, answered every 1 KiB.
	r := testenv.StartRedis(t, "--key-load-delay", "500", "--loading-process-events-interval-bytes", "1024")
	ctx := context.Background()
	for i := range 40 {
		kv := make([]any, 0, 200)
		for j := range 100 {
			kv = append(kv, fmt.Sprintf("filler:%d:%d", i, j), "x")
		}
		if err := r.Client().MSet(ctx, kv...).Err(); err != nil {
			t.Fatal(err)
		}
	}
	hset(t, r, redisstore.DefaultKeyPrefix+"kept", "HostIP", "10.0.0.1", "50005", "30001")
	if err := r.Client().Save(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	s := openStore(t, r)
	c := newCache(t, s, routing.CacheConfig{})
	sub := s.Subscribe(ctx, c, nil)
	t.Cleanup(func() { _ = sub.Close() })
	waitReady(t, sub)
	if _, _, err := c.Get(ctx, []byte("kept")); err != nil {
		t.Fatal(err)
	}

	restarted := make(chan struct{})
	go func() {
		defer close(restarted)
		r.Restart() // returns once Redis answers PING, i.e. has loaded
	}()
	testenv.WaitFor(t, 10*time.Second, "resubscription", func() bool { return sub.Subscriptions() >= 2 })
	loading := false
	if err := s.Client().HGetAll(ctx, "probe").Err(); err != nil && strings.HasPrefix(err.Error(), "LOADING") {
		loading = true
	}
	rt, res, err := c.Get(ctx, []byte("kept"))
	if err != nil || rt.HostIP.String() != "10.0.0.1" {
		t.Fatalf("cached route after a resubscription, Redis loading=%v: %v %v %v; want the cached route", loading, rt, res, err)
	}
	if !loading {
		t.Log("Redis had finished loading before the check; the test proved less than it should")
	}
	<-restarted
	if _, res, err := c.Get(ctx, []byte("kept")); err != nil {
		t.Fatalf("after loading: %v %v", res, err)
	}
}

// TestRestartWithoutDataForgetsRoutes: a Redis that comes back without its
// data (no persistence) answers every lookup "not found". The
// resubscription expires the cache, so the proxy answers 404 for every
// sandbox until the control plane writes the routes again, rather than
// serving copies Redis no longer confirms (one may have been made private
// or deleted meanwhile). The README tells operators to persist the data.
func TestRestartWithoutDataForgetsRoutes(t *testing.T) {
	testenv.ParallelRedis(t)
	r := testenv.StartRedis(t)
	ctx := context.Background()
	hset(t, r, redisstore.DefaultKeyPrefix+"gone", "HostIP", "10.0.0.1", "50005", "30001")
	s := openStore(t, r)
	c := newCache(t, s, routing.CacheConfig{})
	sub := s.Subscribe(ctx, c, nil)
	t.Cleanup(func() { _ = sub.Close() })
	waitReady(t, sub)
	if _, _, err := c.Get(ctx, []byte("gone")); err != nil {
		t.Fatal(err)
	}

	r.Restart() // no persistence: the data is gone
	testenv.WaitFor(t, 10*time.Second, "resubscription", func() bool { return sub.Subscriptions() >= 2 })
	if rt, res, err := c.Get(ctx, []byte("gone")); !errors.Is(err, routing.ErrNotFound) {
		t.Fatalf("route after Redis came back empty: %v %v %v, want not found", rt, res, err)
	}
}

// TestSubscriberPausesWhenConnectingIsRefused: a Redis that refuses the
// subscriber's connection as it opens (a wrong or rotated password, "max
// number of clients reached") answers with an error reply, as a live
// connection would, but go-redis has dropped the connection and dials
// again on the next Receive. The subscriber must pause between attempts as
// it does while Redis is down: it dialled about 1,600 times a second.
func TestSubscriberPausesWhenConnectingIsRefused(t *testing.T) {
	testenv.ParallelRedis(t)
	r := testenv.StartRedis(t)
	if err := r.Client().Do(context.Background(), "ACL", "SETUSER", "reader", "on", ">pw", "~*", "+@all", "allchannels").Err(); err != nil {
		t.Fatal(err)
	}
	s := openStoreCfg(t, redisstore.Config{Addr: r.Addr(), Username: "reader", Password: "rotated", CommandTimeout: 100 * time.Millisecond})
	before := connectionsReceived(t, r)
	sub := s.Subscribe(context.Background(), make(recorder, 16), nil)
	t.Cleanup(func() { _ = sub.Close() })
	testenv.WaitFor(t, 5*time.Second, "the subscriber's first connection", func() bool {
		return connectionsReceived(t, r) > before+1
	})
	// A measuring window, not a wait for an event: 100 ms pauses allow
	// about ten attempts in it, plus a replaced PubSub's.
	const window = time.Second
	start := connectionsReceived(t, r)
	time.Sleep(window)
	if n := connectionsReceived(t, r) - start; n > 30 {
		t.Fatalf("%d connections in %v to a Redis that refuses the password; want a pause between attempts", n, window)
	}
}

// connectionsReceived is INFO's total_connections_received.
func connectionsReceived(t testing.TB, r *testenv.Redis) int {
	t.Helper()
	info, err := r.Client().Info(context.Background(), "stats").Result()
	if err != nil {
		t.Fatalf("info stats: %v", err)
	}
	for line := range strings.SplitSeq(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "total_connections_received:"); ok {
			n, err := strconv.Atoi(v)
			if err != nil {
				t.Fatalf("info stats: %q: %v", line, err)
			}
			return n
		}
	}
	t.Fatal("info stats: no total_connections_received")
	return 0
}

// TestRefusedSubscriptionIsRetried: Redis refuses SUBSCRIBE to an ACL user
// without the channel, from the start (Redis 7's default for new users) or
// once an ACL change cut the subscribed connection. go-redis sends the
// SUBSCRIBE once per connection and keeps the refused connection, which
// still answers PINGs: the subscriber stayed unsubscribed until a restart,
// and after an ACL change said nothing at all. The refusal must be logged
// with Redis's reason, and the subscription taken once the ACL allows it.
func TestRefusedSubscriptionIsRetried(t *testing.T) {
	testenv.ParallelRedis(t)
	for _, tc := range []struct {
		name     string
		channels string // the user's channel rule when the subscriber starts
	}{
		{"denied from the start", "resetchannels"},
		{"denied by an ACL change", "allchannels"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := testenv.StartRedis(t)
			ctx := context.Background()
			acl := func(rule string) {
				t.Helper()
				if err := r.Client().Do(ctx, "ACL", "SETUSER", "reader", "on", ">pw", "~*", "+@all", rule).Err(); err != nil {
					t.Fatal(err)
				}
			}
			acl(tc.channels)
			s := openStoreCfg(t, redisstore.Config{Addr: r.Addr(), Username: "reader", Password: "pw", CommandTimeout: 100 * time.Millisecond})
			var logs testenv.LogBuffer
			rec := make(recorder, 16)
			sub := s.Subscribe(ctx, rec, slog.New(slog.NewJSONHandler(&logs, nil)))
			t.Cleanup(func() { _ = sub.Close() })
			subscribed := int64(0)
			if tc.channels == "allchannels" {
				waitReady(t, sub)
				expectID(t, rec, "*")
				subscribed = 1
				acl("resetchannels") // Redis cuts the subscribed connection
			}
			testenv.WaitFor(t, 10*time.Second, "an error log naming the refusal", func() bool {
				l := logs.String()
				return strings.Contains(l, `"level":"ERROR","msg":"redis invalidation: subscription refused`) && strings.Contains(l, "NOPERM")
			})

			acl("allchannels")
			testenv.WaitFor(t, 10*time.Second, "the subscription once the ACL allows it", func() bool {
				return sub.Subscriptions() > subscribed
			})
			expectID(t, rec, "*")
			if err := s.Publish(ctx, "sb1"); err != nil {
				t.Fatal(err)
			}
			expectID(t, rec, "sb1")
		})
	}
}

// TestRefusedSubscriptionNamesTheRule: a refused subscription's log line
// names the ACL rule the user lacks. A redis.db other than 0 makes the
// subscriber's connection run SELECT first; refused, it is +select that
// the user needs, and a hint at the channel sent the operator to fix what
// was not broken.
func TestRefusedSubscriptionNamesTheRule(t *testing.T) {
	testenv.ParallelRedis(t)
	r := testenv.StartRedis(t)
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		rule []any // the user's rules beside ~* +@all
		db   int
		want string
	}{
		{"channel denied", []any{"resetchannels"}, 0, `"needs":"+subscribe &` + redisstore.DefaultInvalidateChannel + `"`},
		{"select denied", []any{"allchannels", "-select"}, 1, `"needs":"+select"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			acl := append([]any{"ACL", "SETUSER", "reader", "reset", "on", ">pw", "~*", "+@all"}, tc.rule...)
			if err := r.Client().Do(ctx, acl...).Err(); err != nil {
				t.Fatal(err)
			}
			s := openStoreCfg(t, redisstore.Config{Addr: r.Addr(), DB: tc.db, Username: "reader", Password: "pw", CommandTimeout: 100 * time.Millisecond})
			var logs testenv.LogBuffer
			sub := s.Subscribe(ctx, make(recorder, 16), slog.New(slog.NewJSONHandler(&logs, nil)))
			t.Cleanup(func() { _ = sub.Close() })
			testenv.WaitFor(t, 10*time.Second, "an error log naming the refusal", func() bool {
				return strings.Contains(logs.String(), "subscription refused")
			})
			if l := logs.String(); !strings.Contains(l, tc.want) {
				t.Fatalf("log %s\nwant %s", l, tc.want)
			}
		})
	}
}

// TestRefusedPublishNamesTheRule: a PUBLISH the ACL user may not send
// (the command, or the channel) fails with the rule to grant, as a
// refused read or subscription does; it said only Redis's "no
// permissions to run the 'publish' command" or "to access one of the
// channels used as arguments", in the admin API's 503 and the log.
func TestRefusedPublishNamesTheRule(t *testing.T) {
	testenv.ParallelRedis(t)
	r := testenv.StartRedis(t)
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		rule []any // the user's rules beside ~* +@all
		db   int
		want string
	}{
		{"command denied", []any{"allchannels", "-publish"}, 0, "(the Redis ACL user needs +publish &" + redisstore.DefaultInvalidateChannel + ")"},
		{"channel denied", []any{"resetchannels"}, 0, "(the Redis ACL user needs +publish &" + redisstore.DefaultInvalidateChannel + ")"},
		{"select denied", []any{"allchannels", "-select"}, 1, "(the Redis ACL user needs +select)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			acl := append([]any{"ACL", "SETUSER", "writer", "reset", "on", ">pw", "~*", "+@all"}, tc.rule...)
			if err := r.Client().Do(ctx, acl...).Err(); err != nil {
				t.Fatal(err)
			}
			s := openStoreCfg(t, redisstore.Config{Addr: r.Addr(), DB: tc.db, Username: "writer", Password: "pw"})
			err := s.Publish(ctx, "sbx")
			if err == nil || !strings.Contains(err.Error(), "NOPERM") || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("publish err = %v, want NOPERM and %q", err, tc.want)
			}
		})
	}
}

// TestBadIDFloodLogsOnce: anyone who may PUBLISH on the channel (every
// proxy's ACL user, the control plane) can send payloads that are no
// sandbox id as fast as Redis relays them. Each was logged at warn level:
// 200,000 bad messages made 200,000 lines (31 MB), and the process log,
// which drops lines its output cannot take in time, lost others among
// them. One line stands for a burst; the valid ids around it still apply.
func TestBadIDFloodLogsOnce(t *testing.T) {
	testenv.ParallelRedis(t)
	r := testenv.StartRedis(t)
	s := openStore(t, r)
	rec := make(recorder, 16)
	var logs testenv.LogBuffer
	sub := s.Subscribe(context.Background(), rec, slog.New(slog.NewJSONHandler(&logs, nil)))
	t.Cleanup(func() { _ = sub.Close() })
	waitReady(t, sub)
	expectID(t, rec, "*")

	ctx := context.Background()
	_, err := r.Client().Pipelined(ctx, func(p redis.Pipeliner) error {
		for i := range 2000 {
			p.Publish(ctx, redisstore.DefaultInvalidateChannel, fmt.Sprintf("bad id %d", i))
		}
		p.Publish(ctx, redisstore.DefaultInvalidateChannel, "good")
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	expectID(t, rec, "good") // messages are ordered: every bad one was handled
	if n := testenv.CountLines(logs.String(), "ignored bad id"); n != 1 {
		t.Fatalf("%d log lines for a burst of 2000 bad ids, want 1", n)
	}
	// Counted just after the cache call the recorder saw.
	testenv.WaitFor(t, 5*time.Second, "the good id counted applied", func() bool { return sub.Applied() >= 1 })
	if n := sub.Applied(); n != 1 {
		t.Fatalf("applied %d messages, want 1", n)
	}
}

// Subscribed feeds cubeproxy_route_invalidation_subscribed, which operators
// alert on: 1 once a subscription is confirmed, 0 as soon as its connection
// fails (invalidations published meanwhile are lost), not only once the
// quiet connection's PING gives up on it, and 1 again once a subscription
// is confirmed anew.
func TestSubscribedFollowsTheConnection(t *testing.T) {
	testenv.ParallelRedis(t)
	r := testenv.StartRedis(t)
	// A long command timeout: the PING that would replace the lost
	// connection comes 30 s after it; the gauge must not wait for it.
	s := openStoreCfg(t, redisstore.Config{Addr: r.Addr(), CommandTimeout: 5 * time.Second})
	c := newCache(t, s, routing.CacheConfig{})
	sub := s.Subscribe(context.Background(), c, nil)
	t.Cleanup(func() { _ = sub.Close() })
	waitReady(t, sub)
	if !sub.Subscribed() {
		t.Fatal("Subscribed is false with the subscription confirmed")
	}
	r.Stop()
	testenv.WaitFor(t, 5*time.Second, "Subscribed false with Redis gone", func() bool { return !sub.Subscribed() })
	r.Restart()
	testenv.WaitFor(t, 10*time.Second, "Subscribed again once resubscribed", func() bool {
		return sub.Subscriptions() >= 2 && sub.Subscribed()
	})
}

// A subscription whose server stops answering (a hung host, a partition)
// is replaced, and that is said at warn level, where operators look: every
// cached route is read again after it, and invalidations sent meanwhile
// were lost.
func TestHungSubscriptionIsReplacedAtWarnLevel(t *testing.T) {
	testenv.ParallelRedis(t)
	r := testenv.StartRedis(t)
	s := openStoreCfg(t, redisstore.Config{Addr: r.Addr(), CommandTimeout: 100 * time.Millisecond})
	var logs testenv.LogBuffer
	c := newCache(t, s, routing.CacheConfig{})
	sub := s.Subscribe(context.Background(), c, slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn})))
	t.Cleanup(func() { _ = sub.Close() })
	waitReady(t, sub)
	r.Pause()
	t.Cleanup(r.Resume)
	testenv.WaitFor(t, 10*time.Second, "a warning that the silent connection is replaced", func() bool {
		return strings.Contains(logs.String(), `"level":"WARN","msg":"redis invalidation: no reply to PING; replacing the connection"`)
	})
}

// A refused subscription is asked for again every pingIdle command
// timeouts, and the refusal is logged at error level once, not at each
// retry: an ACL user without the channel would otherwise fill the log
// with the same line three times every second.
func TestRefusedSubscriptionIsLoggedOnce(t *testing.T) {
	testenv.ParallelRedis(t)
	r := testenv.StartRedis(t)
	ctx := context.Background()
	if err := r.Client().Do(ctx, "ACL", "SETUSER", "reader", "on", ">pw", "~*", "+@all", "resetchannels").Err(); err != nil {
		t.Fatal(err)
	}
	s := openStoreCfg(t, redisstore.Config{Addr: r.Addr(), Username: "reader", Password: "pw", CommandTimeout: 100 * time.Millisecond})
	var logs testenv.LogBuffer
	sub := s.Subscribe(ctx, make(recorder, 16), slog.New(slog.NewJSONHandler(&logs, nil)))
	t.Cleanup(func() { _ = sub.Close() })
	testenv.WaitFor(t, 10*time.Second, "three refused subscriptions", func() bool {
		entries, err := r.Client().ACLLog(ctx, 10).Result()
		if err != nil {
			return false
		}
		var n int64
		for _, e := range entries {
			if e.Username == "reader" && e.Reason == "channel" {
				n += e.Count
			}
		}
		return n >= 3
	})
	if n := strings.Count(logs.String(), `"msg":"redis invalidation: subscription refused`); n != 1 {
		t.Fatalf("the refusal logged %d times over three retries, want once:\n%s", n, logs.String())
	}
}

// A subscription that is merely quiet (no sandbox changed) is PINGed and
// kept: replaced instead, every instance would expire its whole cache and
// warn of a reconnect every two pingIdle command timeouts.
func TestQuietSubscriptionIsPingedNotReplaced(t *testing.T) {
	testenv.ParallelRedis(t)
	r := testenv.StartRedis(t)
	ctx := context.Background()
	s := openStoreCfg(t, redisstore.Config{Addr: r.Addr(), CommandTimeout: 100 * time.Millisecond})
	c := newCache(t, s, routing.CacheConfig{})
	sub := s.Subscribe(ctx, c, nil)
	t.Cleanup(func() { _ = sub.Close() })
	waitReady(t, sub)
	pinged := func() bool {
		list, err := r.Client().ClientList(ctx).Result()
		if err != nil {
			return false
		}
		for line := range strings.SplitSeq(list, "\n") {
			if strings.Contains(line, " sub=1 ") && strings.Contains(line, " cmd=ping ") {
				return true
			}
		}
		return false
	}
	testenv.WaitFor(t, 10*time.Second, "a PING on the quiet subscription", pinged)
	if n := sub.Subscriptions(); n != 1 {
		t.Fatalf("%d subscriptions by the first PING, want 1: the quiet one was replaced", n)
	}
}
