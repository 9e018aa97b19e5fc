package redisstore_test

import (
	"context"
	"errors"
	"net/netip"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
	"github.com/cube-sandbox/cubeproxy/routing"
	"github.com/cube-sandbox/cubeproxy/routing/redisstore"
)

// heldStore is a Store whose Lookup, once armed, reads Redis and then
// waits before answering: the read is done, its answer not yet cached,
// while the test changes the route and announces it.
type heldStore struct {
	inner *redisstore.Store
	read  chan struct{} // closed once the held lookup has read Redis
	hold  chan struct{} // closed to let it answer
}

func (s *heldStore) Lookup(ctx context.Context, id string) (*routing.Route, error) {
	r, err := s.inner.Lookup(ctx, id)
	if s.read != nil {
		close(s.read)
		<-s.hold
		s.read = nil
	}
	return r, err
}

// An announcement applied by the subscriber while a lookup for the same
// sandbox is in flight, its read of Redis already made, does not let that
// read be cached: the next request reads Redis again, whether the change
// was a new backend, a delete (a kill), a sandbox created after a 404, or
// a change whose message was lost while the subscription was cut (the
// resubscription expires the cache). The in-flight lookup's own callers
// get what it read (they asked before the change).
func TestAnnouncementDuringLookupIsNotCachedOver(t *testing.T) {
	tests := []struct {
		name      string
		id        string
		before    []any // the route when the held lookup reads it; nil: none
		change    func(ctx context.Context, p redis.Pipeliner, key string)
		published bool // the change's id is published; else the pubsub connection is cut
		want      func(*routing.Route, error) bool
	}{
		{"new backend", "inflight-moved", []any{"HostIP", "10.0.0.1", "50005", "30001"}, func(ctx context.Context, p redis.Pipeliner, key string) {
			p.HSet(ctx, key, "HostIP", "10.0.0.2")
		}, true, func(r *routing.Route, err error) bool {
			return err == nil && r.HostIP == netip.MustParseAddr("10.0.0.2")
		}},
		{"killed", "inflight-killed", []any{"HostIP", "10.0.0.1", "50005", "30001"}, func(ctx context.Context, p redis.Pipeliner, key string) {
			p.Del(ctx, key)
		}, true, func(_ *routing.Route, err error) bool { return errors.Is(err, routing.ErrNotFound) }},
		{"created after a 404", "inflight-created", nil, func(ctx context.Context, p redis.Pipeliner, key string) {
			p.HSet(ctx, key, "HostIP", "10.0.0.3", "50005", "30001")
		}, true, func(r *routing.Route, err error) bool {
			return err == nil && r.HostIP == netip.MustParseAddr("10.0.0.3")
		}},
		{"message lost, resubscribed", "inflight-lost", []any{"HostIP", "10.0.0.1", "50005", "30001"}, func(ctx context.Context, p redis.Pipeliner, key string) {
			p.Do(ctx, "CLIENT", "KILL", "TYPE", "pubsub")
			p.HSet(ctx, key, "AllowPublicTraffic", "false", "TrafficAccessToken", token)
		}, false, func(r *routing.Route, err error) bool { return err == nil && !r.Public }},
	}
	testenv.ParallelRedis(t)
	r := testenv.StartRedis(t)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			id := tc.id
			key := redisstore.DefaultKeyPrefix + id
			if err := r.Client().Del(ctx, key).Err(); err != nil {
				t.Fatal(err)
			}
			if tc.before != nil {
				hset(t, r, key, tc.before...)
			}
			store := openStore(t, r)
			held := &heldStore{inner: store, read: make(chan struct{}), hold: make(chan struct{})}
			c := newCache(t, held, routing.CacheConfig{LookupTimeout: 5 * time.Second})
			t.Cleanup(c.Close)
			sub := store.Subscribe(ctx, c, nil)
			t.Cleanup(func() { _ = sub.Close() })
			waitReady(t, sub)

			type answer struct {
				r   *routing.Route
				err error
			}
			first := make(chan answer, 1)
			go func() {
				rt, _, err := c.Get(ctx, []byte(id))
				first <- answer{rt, err}
			}()
			<-held.read
			applied, subs := sub.Applied(), sub.Subscriptions()
			_, err := r.Client().TxPipelined(ctx, func(p redis.Pipeliner) error {
				tc.change(ctx, p, key)
				if tc.published {
					p.Publish(ctx, redisstore.DefaultInvalidateChannel, id)
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			if tc.published {
				testenv.WaitFor(t, 5*time.Second, "invalidation applied", func() bool { return sub.Applied() > applied })
			} else {
				testenv.WaitFor(t, 10*time.Second, "resubscription", func() bool { return sub.Subscriptions() > subs })
			}
			close(held.hold)
			if a := <-first; tc.want(a.r, a.err) {
				t.Fatalf("the in-flight lookup's caller got the new state (%v, %v): the lookup read after the change", a.r, a.err)
			}
			rt, res, err := c.Get(ctx, []byte(id))
			if res != routing.CacheMiss || !tc.want(rt, err) {
				t.Fatalf("Get after the announcement = %v, %v, %v; want a fresh read of the new state", rt, res, err)
			}
		})
	}
}
