package redisstore

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cube-sandbox/cubeproxy/routing"
)

// Invalidator drops cached routes; *routing.Cache satisfies it.
type Invalidator interface {
	// Invalidate drops the entries of one sandbox.
	Invalidate(id string) int
	// ExpireAll makes every cached route due for a re-read.
	ExpireAll() int
}

// Publish announces on InvalidateChannel that every instance must drop id.
// The publishing instance receives its own message too; dropping twice is harmless.
func (s *Store) Publish(ctx context.Context, id string) error {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.CommandTimeout)
	defer cancel()
	if err := s.client.Publish(ctx, s.cfg.InvalidateChannel, id).Err(); err != nil {
		return fmt.Errorf("redis publish %s: %w", s.cfg.InvalidateChannel, err)
	}
	return nil
}

// Subscriber applies the ids published on InvalidateChannel to a cache.
//
// go-redis reconnects and resubscribes by itself after Redis restarts (it
// also pings the connection every few seconds to notice a dead peer).
// Messages published while the connection was down are lost, and one of
// them may have made a sandbox private: so every confirmed subscription
// expires the whole cache, and routes are read from Redis again (one lookup
// per sandbox, shared by its concurrent requests; the old route is served
// while Redis cannot answer, as for any expired route). A resubscription is
// logged at warn level so operators can correlate.
type Subscriber struct {
	ps        *redis.PubSub
	cache     Invalidator
	logger    *slog.Logger
	ready     chan struct{}
	done      chan struct{}
	closeOnce sync.Once
	subs      atomic.Int64
	applied   atomic.Int64
}

// Subscribe starts applying invalidation messages to cache until ctx ends or
// Close is called. It never fails: while Redis is unreachable it keeps retrying.
func (s *Store) Subscribe(ctx context.Context, cache Invalidator, logger *slog.Logger) *Subscriber {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	sub := &Subscriber{
		ps:     s.client.Subscribe(ctx, s.cfg.InvalidateChannel),
		cache:  cache,
		logger: logger.With("channel", s.cfg.InvalidateChannel),
		ready:  make(chan struct{}),
		done:   make(chan struct{}),
	}
	ch := sub.ps.ChannelWithSubscriptions(
		redis.WithChannelSize(1024),
		redis.WithChannelPingTimeout(s.cfg.CommandTimeout),
	)
	go sub.run(ch)
	go func() {
		select {
		case <-ctx.Done():
			_ = sub.Close()
		case <-sub.done:
		}
	}()
	go sub.warnUnsubscribed(subscribeGrace * s.cfg.CommandTimeout)
	return sub
}

// subscribeGrace is how many command timeouts the first subscription may
// take before its absence is logged.
const subscribeGrace = 5

// warnUnsubscribed logs once when no subscription was confirmed within d.
// go-redis swallows a refused SUBSCRIBE (an ACL user without access to the
// channel, the default for new users since Redis 7) and does not retry it:
// routes still resolve, but invalidations from other instances are never
// applied here, and nothing else would say so.
func (sub *Subscriber) warnUnsubscribed(d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-sub.ready:
	case <-sub.done:
	case <-t.C:
		sub.logger.Error("redis invalidation: not subscribed; invalidations published by other instances are not applied (Redis unreachable, or the ACL user may not SUBSCRIBE to the channel)", "waited", d.String())
	}
}

func (sub *Subscriber) run(ch <-chan any) {
	defer close(sub.done)
	for msg := range ch {
		switch m := msg.(type) {
		case *redis.Subscription:
			if m.Kind != "subscribe" {
				continue
			}
			// Messages may have been published before this subscription
			// (the first one included: routes may be cached already). The
			// routes are re-read, not forgotten: a Redis restarted with its
			// data takes SUBSCRIBE while it still answers reads with
			// LOADING, and meanwhile the old routes are served stale.
			n := sub.cache.ExpireAll()
			if sub.subs.Add(1) == 1 {
				close(sub.ready)
				sub.logger.Info("redis invalidation subscribed", "routes_expired", n)
			} else {
				sub.logger.Warn("redis invalidation resubscribed after reconnect; every cached route will be read again, since invalidations published meanwhile were lost", "routes_expired", n)
			}
		case *redis.Message:
			id := strings.ToLower(strings.TrimSpace(m.Payload))
			if !routing.ValidID(id) {
				sub.logger.Warn("redis invalidation: ignored bad id", "len", len(m.Payload))
				continue
			}
			n := sub.cache.Invalidate(id)
			sub.applied.Add(1)
			sub.logger.Debug("redis invalidation", "sandbox_id", id, "deleted", n)
		}
	}
}

// Ready is closed once the first SUBSCRIBE is confirmed by Redis.
func (sub *Subscriber) Ready() <-chan struct{} { return sub.ready }

// Subscriptions counts confirmed SUBSCRIBEs: 1 after start, +1 per reconnect.
func (sub *Subscriber) Subscriptions() int64 { return sub.subs.Load() }

// Applied counts invalidation messages applied to the cache.
func (sub *Subscriber) Applied() int64 { return sub.applied.Load() }

// Close unsubscribes and waits until no more messages are applied.
func (sub *Subscriber) Close() error {
	var err error
	sub.closeOnce.Do(func() { err = sub.ps.Close() })
	<-sub.done
	return err
}
