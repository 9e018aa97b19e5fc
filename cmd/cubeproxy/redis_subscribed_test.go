package main

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
	"github.com/cube-sandbox/cubeproxy/routing/redisstore"
)

// An instance whose invalidation subscription is down applies none of
// the others' invalidations: a route changed through another instance (a
// token rotated, a sandbox made private) is served as it was for up to its
// 500–700 s TTL. Measured with three binaries on one Redis, one of them
// with an ACL user that may not SUBSCRIBE: /readyz said ready, /metrics
// had no series that differed from its peers', and only an error line in
// its log told. The scrape now says whether the subscription stands
// (cubeproxy_route_invalidation_subscribed), how often one was confirmed,
// each expiring the whole cache (..._subscriptions_total: a rise is a
// resync after messages may have been lost), and the ids applied.
func TestRedisSubscriptionInMetrics(t *testing.T) {
	// Parallel: its redis-servers are its own, it waits on them and on
	// timers, and it asserts no latency a busy machine could exceed.
	testenv.ParallelRedis(t)
	ctx := context.Background()
	r := testenv.StartRedis(t)
	// Every right but the invalidation channel: Redis 7's default for a
	// new user (resetchannels).
	if err := r.Client().Do(ctx, "ACL", "SETUSER", "nochan", "on", ">pw", "~*", "+@all", "resetchannels").Err(); err != nil {
		t.Fatal(err)
	}
	p := startRedisProxy(t, r.Addr(), "--redis-username", "nochan", "--redis-password", "pw", "--redis-command-timeout", "200ms")
	testenv.WaitFor(t, 5*time.Second, "readyz 200", func() bool { return p.adminGet(t, "/readyz").status == 200 })

	const (
		subscribed    = "cubeproxy_route_invalidation_subscribed{}"
		subscriptions = "cubeproxy_route_invalidation_subscriptions_total{}"
		messages      = "cubeproxy_route_invalidation_messages_total{}"
	)
	want := func(what string, w map[string]float64) {
		t.Helper()
		var got map[string]float64
		ok := func() bool {
			got = series(scrapeFamilies(t, p.admin))
			for k, v := range w {
				if g, present := got[k]; !present || g != v {
					return false
				}
			}
			return true
		}
		deadline := time.Now().Add(10 * time.Second)
		for !ok() {
			if time.Now().After(deadline) {
				t.Fatalf("%s: want %v, scrape has %s=%v %s=%v %s=%v\n%s", what, w,
					subscribed, fmt.Sprint(got[subscribed]), subscriptions, got[subscriptions], messages, got[messages], p.logs)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	want("subscription refused", map[string]float64{subscribed: 0, subscriptions: 0, messages: 0})

	// Granted: taken at the next retry, without a restart.
	if err := r.Client().Do(ctx, "ACL", "SETUSER", "nochan", "allchannels").Err(); err != nil {
		t.Fatal(err)
	}
	want("subscription granted", map[string]float64{subscribed: 1, subscriptions: 1})
	if err := r.Client().Publish(ctx, redisstore.DefaultInvalidateChannel, "box1").Err(); err != nil {
		t.Fatal(err)
	}
	want("an id published", map[string]float64{subscribed: 1, messages: 1})

	// Cut on the server (CLIENT KILL TYPE pubsub, as an operator or a
	// client-output-buffer limit does): resubscribed, and counted.
	if err := r.Client().ClientKillByFilter(ctx, "TYPE", "pubsub").Err(); err != nil {
		t.Fatal(err)
	}
	want("resubscribed after CLIENT KILL", map[string]float64{subscribed: 1, subscriptions: 2})

	// Redis gone: nothing can be subscribed.
	r.Stop()
	want("Redis stopped", map[string]float64{subscribed: 0, subscriptions: 2})
}
