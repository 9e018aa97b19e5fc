package redisstore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cube-sandbox/cubeproxy/internal/loglimit"
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
	if err := s.publish(ctx, id); err != nil {
		if redis.HasErrorPrefix(err, "NOPERM") {
			// As a refused read or subscription: Redis names the command
			// or "one of the channels", never the rule to grant.
			needs := "+publish &" + s.cfg.InvalidateChannel
			if cmd := refusedCommand(err); cmd != "" && !strings.EqualFold(cmd, "publish") {
				needs = commandRule(cmd)
			}
			return fmt.Errorf("redis publish %s: %w (the Redis ACL user needs %s)", s.cfg.InvalidateChannel, err, needs)
		}
		// A sentinel in redis.addr takes no PUBLISH but its own.
		return fmt.Errorf("redis publish %s: %w%s", s.cfg.InvalidateChannel, err, otherKindHint(err, s.cluster, s.cfg.Sentinel.MasterName != ""))
	}
	return nil
}

// publishTries is how many nodes a Cluster publish tries, each within its
// share of the command timeout.
const publishTries = 3

// publish sends id on the channel. A Cluster client sends a keyless
// command such as PUBLISH to the masters in turn, and any node relays it
// to the whole cluster: so a publish that gets no answer within its share
// of the budget is sent again, which goes to the next master. With the
// whole budget on one try, each publish that fell on a master that hung
// until the cluster failed it over (one in three with three masters)
// waited it out and the admin call answered 503
// (TestClusterPublishWithHungMaster). A publish that timed out may still
// be relayed when that master wakes: dropping an id twice is harmless.
func (s *Store) publish(ctx context.Context, id string) error {
	if !s.cluster {
		return s.client.Publish(ctx, s.cfg.InvalidateChannel, id).Err()
	}
	var err error
	for range publishTries {
		try, cancel := context.WithTimeout(ctx, s.cfg.CommandTimeout/publishTries)
		err = s.client.Publish(try, s.cfg.InvalidateChannel, id).Err()
		cancel()
		var rerr redis.Error
		if err == nil || errors.As(err, &rerr) || ctx.Err() != nil {
			return err // an answer (NOPERM) is the same on every node
		}
	}
	return err
}

// Subscriber applies the ids published on InvalidateChannel to a cache.
//
// go-redis reconnects and resubscribes by itself when the connection
// breaks (Redis restarted, a reset). A connection that merely stops
// answering (a hung host, a Sentinel failover away from a master that is
// cut off, a NAT or load balancer that forgot the flow) breaks nothing:
// writes still succeed into the kernel's buffer and go-redis's own health
// check only writes its PING. So the subscriber PINGs a connection that
// was quiet for pingIdle command timeouts itself, and replaces it when
// nothing at all comes back within as long again: longer than a lookup
// may take, since a replacement expires every cached route, and a Redis
// that stalls for a moment (a fork, a slow script) should not make every
// instance re-read everything from it at once.
//
// Messages published while the connection was down are lost, and one of
// them may have made a sandbox private: so every confirmed subscription
// expires the whole cache, and routes are read from Redis again (one lookup
// per sandbox, shared by its concurrent requests; the old route is served
// while Redis cannot answer, as for any expired route). A resubscription is
// logged at warn level so operators can correlate. A subscription Redis
// refuses (an ACL user without the channel) is logged at error level and
// asked for again every pingIdle command timeouts.
type Subscriber struct {
	client  redis.UniversalClient
	open    func(ctx context.Context, n int) (*redis.PubSub, func() *redis.Client) // the n-th subscription, from 0, and where its Cluster node is
	channel string
	cache   Invalidator
	logger  *slog.Logger
	idle    time.Duration // quiet time before a PING
	timeout time.Duration // wait for any reply after the PING

	ready     chan struct{}
	stop      chan struct{}
	done      chan struct{}
	closeOnce sync.Once
	closeErr  error  // of the last PubSub, set before done is closed
	refusal   string // the reason last logged by logRefused; run's goroutine only
	lost      bool   // a node left for its failures was logged since the last subscription; run's goroutine only
	broken    error  // the last error of a connection or a dial since the last reply; run's goroutine only
	// standalone says redis.addr (or redis.url) names the one server,
	// which may be a sentinel (onSentinel); sentinel says the current
	// connection's confirmed subscription is on one, run's goroutine only.
	standalone bool
	sentinel   bool
	// badLogged holds back logBadID's repeated lines.
	badLogged loglimit.Limit
	subs      atomic.Int64
	applied   atomic.Int64
	// live says a subscription is confirmed on the current connection
	// and no error came since: the scrape's gauge (Subscribed).
	live atomic.Bool
	// With Sentinel: where the subscription's connection went (base
	// carries it to the dial), and the sentinels that say whether that
	// is still the master (see sentinelwatch.go); nil otherwise.
	base      context.Context
	dialed    dialedAddr
	sentinels *sentinelMasters
}

// pingIdle is how many command timeouts a subscription may stay quiet
// before it is PINGed (3 s by default, as go-redis's own health check).
const pingIdle = 3

// leaveAfterFailures is how many transport errors in a row (the dropped
// connection, then go-redis's dials of a new one, 100 ms apart) make a
// Cluster subscription leave its node for the next one.
const leaveAfterFailures = 3

// Subscribe starts applying invalidation messages to cache until ctx ends or
// Close is called. It never fails: while Redis is unreachable it keeps retrying.
func (s *Store) Subscribe(ctx context.Context, cache Invalidator, logger *slog.Logger) *Subscriber {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	sub := &Subscriber{
		client:  s.client,
		open:    opener(s.client, s.cfg.InvalidateChannel, s.cfg.CommandTimeout),
		channel: s.cfg.InvalidateChannel,
		cache:   cache,
		logger:  logger.With("channel", s.cfg.InvalidateChannel),
		idle:    pingIdle * s.cfg.CommandTimeout,
		timeout: pingIdle * s.cfg.CommandTimeout,
		ready:   make(chan struct{}),
		stop:    make(chan struct{}),
		done:    make(chan struct{}),
		base:    context.Background(),

		standalone: !s.cluster && s.cfg.Sentinel.MasterName == "",
	}
	if _, cluster := s.client.(*redis.ClusterClient); !cluster && s.cfg.Sentinel.MasterName != "" {
		m, err := newSentinelMasters(s.cfg)
		if err != nil {
			sub.logger.Warn("redis invalidation: cannot ask the sentinels for the master; the subscription moves only when its server stops answering", "err", err.Error())
		} else {
			sub.sentinels = m
			sub.base = context.WithValue(sub.base, dialedKey{}, &sub.dialed)
			ctx = context.WithValue(ctx, dialedKey{}, &sub.dialed)
		}
	}
	ps, node := sub.open(ctx, 0)
	go sub.run(ctx, ps, node)
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
// Routes resolve without one, but invalidations from other instances are
// not applied here, and nothing else would say so while Redis cannot be
// reached (a refused SUBSCRIBE is logged by watch as well, with Redis's
// reason).
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

// opener returns how a Subscriber on client opens its n-th subscription
// to channel. A standalone or Sentinel client has one server to ask. A
// Cluster client subscribes on the master of the channel's slot, and so
// does go-redis each time it reconnects a subscription; but a message
// published on any node reaches every node, and that master may be gone
// with no replica to take over, in a cluster that serves its other slots
// (cluster-require-full-coverage no): every instance then lost every
// invalidation for as long as it was down, while the PUBLISH of the
// control plane, answered by another node, succeeded
// (TestClusterInvalidationWithoutChannelSlotOwner). So the first
// subscription goes to that master, and each replacement to the next
// node of the cluster, in address order, masters and replicas alike.
// With a Cluster it also returns how to find the subscription's node
// (nil otherwise), whose membership watch checks.
func opener(client redis.UniversalClient, channel string, wait time.Duration) func(ctx context.Context, n int) (*redis.PubSub, func() *redis.Client) {
	cc, ok := client.(*redis.ClusterClient)
	if !ok {
		return func(ctx context.Context, _ int) (*redis.PubSub, func() *redis.Client) {
			return client.Subscribe(ctx, channel), nil
		}
	}
	return func(ctx context.Context, n int) (*redis.PubSub, func() *redis.Client) {
		if n > 0 {
			if nodes := clusterNodes(ctx, cc, wait); len(nodes) > 0 {
				node := nodes[n%len(nodes)]
				return node.Subscribe(ctx, channel), func() *redis.Client { return node }
			}
		}
		return cc.Subscribe(ctx, channel), channelMaster(cc, channel, wait)
	}
}

// channelMaster returns how to find the node of a subscription go-redis
// routes: the channel slot's master in the slot map as it is when asked
// (nil when the map cannot be read within wait). go-redis connects such
// a subscription, and connects it again after a failure, to the master
// of that moment, so watch asks each time a connection's subscription is
// confirmed. Asked once, at the first subscription, it named the old
// master after go-redis had followed a failover: the membership check
// asked that node, which answered cluster_state:ok, and the subscription
// stayed for as long as it ran on the node it had moved to once that one
// was removed from the cluster, every invalidation lost, the gauge at 1
// (TestClusterInvalidationAfterFailedOverNodeRemoval). A slot map read
// again between go-redis's connection and the confirmation may name
// another node: at worst a needless replacement, or a missed removal.
func channelMaster(cc *redis.ClusterClient, channel string, wait time.Duration) func() *redis.Client {
	return func() *redis.Client {
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		defer cancel()
		node, _ := cc.MasterForKey(ctx, channel)
		return node
	}
}

// clusterNodes returns the clients of every node in cc's slot map, read
// afresh (within wait) when a node answers, in address order. A node that
// knows no slot (removed from the cluster and reset) is not asked for the
// map: its empty answer made this list empty, and the membership check
// found no node to say the cluster works (see emptySlotMap).
func clusterNodes(ctx context.Context, cc *redis.ClusterClient, wait time.Duration) []*redis.Client {
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	var mu sync.Mutex
	var nodes []*redis.Client
	_ = cc.ForEachShard(ctx, func(_ context.Context, c *redis.Client) error {
		mu.Lock()
		nodes = append(nodes, c)
		mu.Unlock()
		return nil
	})
	slices.SortFunc(nodes, func(a, b *redis.Client) int { return strings.Compare(a.Options().Addr, b.Options().Addr) })
	return nodes
}

// run serves one PubSub after the other, from ps, whose Cluster node
// node finds (nil: not a Cluster): a new one replaces a connection that
// stopped answering, until Close.
func (sub *Subscriber) run(ctx context.Context, ps *redis.PubSub, node func() *redis.Client) {
	defer close(sub.done)
	defer sub.sentinels.close()
	for n := 1; ; n++ {
		in := make(chan any)
		quit := make(chan struct{})
		received := make(chan struct{})
		go func() {
			defer close(received)
			receive(sub.base, ps, in, quit)
		}()
		stopped, subscribed, refused, left := sub.watch(ps, node, in)
		close(quit)
		err := ps.Close() // unblocks a Receive waiting on a silent connection
		<-received
		if stopped {
			sub.closeErr = err
			return
		}
		switch {
		case !subscribed || refused || left:
		case sub.broken != nil:
			// The connection broke and none could be made since: the
			// PING had nothing to go on, and the reason is the dial's.
			sub.logger.Warn("redis invalidation: the connection was lost and cannot be made again; retrying", "err", sub.broken.Error())
		default:
			sub.logger.Warn("redis invalidation: no reply to PING; replacing the connection", "waited", (sub.idle + sub.timeout).String())
		}
		ps, node = sub.open(ctx, n)
	}
}

// receiveBackoff is how long receive waits after an error before it asks
// for the next reply, which may dial again.
const receiveBackoff = 100 * time.Millisecond

// receive passes every reply and error of ps to out until ps is closed or
// quit is closed. ctx has no deadline: it carries what the dial of a new
// connection records (Subscriber.base).
func receive(ctx context.Context, ps *redis.PubSub, out chan<- any, quit <-chan struct{}) {
	for {
		msg, err := ps.Receive(ctx)
		if errors.Is(err, redis.ErrClosed) {
			return
		}
		if err != nil {
			msg = err
		}
		select {
		case out <- msg:
		case <-quit:
			return
		}
		if err != nil {
			// Do not spin: after a transport error go-redis dials again
			// on the next Receive, and so it does after a refusal while
			// connecting (AUTH's WRONGPASS, "max number of clients
			// reached"), which comes back as a redis.Error like a reply
			// on a live connection: without a pause, a wrong or rotated
			// password made this loop open about 1,600 connections a
			// second to a Redis that refuses them.
			select {
			case <-time.After(receiveBackoff):
			case <-quit:
				return
			}
		}
	}
}

// watch applies what arrives on in, PINGs ps when it was quiet for
// sub.idle, and returns when Close was called (stopped), when nothing
// came back within sub.timeout of a PING, or, sub.idle after the last
// reply, when the server refused the subscription (refused), or, in a
// Cluster, when the node the subscription is on says it left the cluster
// (left; checked every sub.idle; locate finds the node, asked at each
// confirmed subscription) or cannot be connected to again
// (leaveAfterFailures transport errors in a row: left too). subscribed
// says whether a subscription of ps was ever confirmed.
//
// A Cluster node that refuses connections (killed, its certificate no
// longer trusted) was left only by the PING, 2*pingIdle command timeouts
// after its last reply, 6 s by default: go-redis dials a pinned node
// again and again, and the channel slot's master again until the cluster
// has promoted its replica (cluster-node-timeout, 15 s by default, and
// an election), and invalidations published meanwhile were lost
// (TestClusterInvalidationFromKilledNode). Leaving costs no more than
// coming back: either subscription expires the whole cache.
//
// go-redis sends SUBSCRIBE on each connection it opens for ps, before
// anything else, and does not send it again when the server refuses it
// (an ACL user without the channel: Redis 7's default for new users, or
// after an ACL change, which also cuts the subscribed connection): the
// refusal is the first reply, an error reply, and the connection then
// stays open, unsubscribed, and answers PINGs. So an error reply (or an
// error go-redis met while connecting) before the connection's
// subscription was confirmed means ps is not subscribed: it is logged,
// and ps is replaced, which sends SUBSCRIBE again, until the server
// takes it; an ACL fixed meanwhile needs no restart.
func (sub *Subscriber) watch(ps *redis.PubSub, locate func() *redis.Client, in <-chan any) (stopped, subscribed, refused, left bool) {
	timer := time.NewTimer(sub.idle)
	defer timer.Stop()
	var node *redis.Client      // the Cluster node of the confirmed subscription
	var member <-chan time.Time // node's membership checks, or the sentinels'
	if locate != nil || sub.sentinels != nil {
		check := time.NewTicker(sub.idle)
		defer check.Stop()
		member = check.C
	}
	defer sub.live.Store(false) // ps is closed or replaced next
	sub.broken = nil
	pinged := false
	confirmed := false // the SUBSCRIBE of ps's current connection
	failures := 0      // transport errors since the last confirmed subscription
	for {
		select {
		case <-sub.stop:
			return true, subscribed, refused, false
		case <-member:
			if node != nil && sub.outOfCluster(node) || confirmed && sub.sentinels != nil && sub.notMaster() {
				return false, subscribed, refused, true
			}
		case msg := <-in:
			switch m := msg.(type) {
			case *redis.Subscription:
				if m.Kind == "subscribe" {
					confirmed, refused = true, false
					failures = 0
					sub.refusal, sub.lost = "", false
					sub.sentinel = sub.onSentinel()
					sub.live.Store(!sub.sentinel)
					if locate != nil {
						node = locate()
					}
				}
			case error:
				var rerr redis.Error
				switch {
				case !errors.As(m, &rerr):
					confirmed = false // go-redis dials again, and subscribes again
					sub.live.Store(false)
					sub.noteBroken(m)
					// In a Cluster, to the node go-redis took from the
					// slot map for the first subscription (the channel
					// slot's master), which may have been failed over.
					reloadSlotsAfter(sub.client, m)
					if failures++; locate != nil && failures >= leaveAfterFailures {
						sub.logLost(m)
						return false, subscribed, refused, true
					}
				case !confirmed:
					refused = true
					sub.logRefused(m)
					continue // no proof of a subscription
				}
			}
			if !sub.handle(msg, &subscribed) {
				continue
			}
			sub.broken = nil
			pinged = false
			timer.Reset(sub.idle)
		case <-timer.C:
			if pinged || refused {
				if pinged {
					// A hung Cluster master may have been failed over.
					reloadSlotsAfter(sub.client, context.DeadlineExceeded)
				}
				return false, subscribed, refused, false
			}
			// The reply arrives through Receive; a failed write means no
			// reply will come, and the next tick replaces the connection.
			ctx, cancel := context.WithTimeout(sub.base, sub.timeout)
			if err := ps.Ping(ctx); err != nil {
				sub.noteBroken(err) // a new connection for it failed too
			}
			cancel()
			pinged = true
			timer.Reset(sub.timeout)
		}
	}
}

// noteBroken keeps err as the reason the subscription has no connection,
// unless it is a timeout and a more telling error came since the last
// reply: under load a dial may run out of its third of the command timeout
// before the server's refusal (a certificate not trusted), and "context
// deadline exceeded" was all the log said.
func (sub *Subscriber) noteBroken(err error) {
	var ne net.Error
	timeout := errors.Is(err, context.DeadlineExceeded) || errors.As(err, &ne) && ne.Timeout()
	if sub.broken == nil || !timeout {
		sub.broken = err
	}
}

// outOfCluster reports whether the Cluster node a subscription is on
// says it is not part of a working cluster (cluster_state:fail) while
// another node says the cluster works (cluster_state:ok): removed from it
// (redis-cli's del-node resets the node and leaves it running) or cut off
// from its majority. Such a node still answers PINGs, but no message
// published on the others reaches it: every instance lost every
// invalidation for as long as it ran (TestClusterInvalidationAfterNodeRemoval).
// A cluster that is down as a whole (a master dead with no replica, a
// failover's second or two) has every node say fail, and messages still
// reach them all: leaving a node then, for the next one every check (the
// dead master among them), lost 24 of 40 invalidations published in 6 s
// (TestClusterInvalidationWhileClusterDown). A node that does not answer
// is left to the PING.
func (sub *Subscriber) outOfCluster(node *redis.Client) bool {
	ctx, cancel := context.WithTimeout(context.Background(), sub.idle/pingIdle)
	defer cancel()
	if !clusterFails(ctx, node) || !sub.clusterWorks(ctx, node.Options().Addr) {
		return false
	}
	sub.logger.Warn("redis invalidation: the subscribed node is not in the working cluster (cluster_state:fail where other nodes say ok); subscribing on another node", "node", node.Options().Addr)
	return true
}

// notMaster reports whether the server the subscription's connection was
// dialed to is one no sentinel that answers names as the master (see
// sentinelwatch.go). Sentinels that cannot be asked, or that disagree,
// leave the subscription where it is.
func (sub *Subscriber) notMaster() bool {
	addr := sub.dialed.get()
	if addr == "" {
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), sub.idle/pingIdle)
	defer cancel()
	named := sub.sentinels.named(ctx)
	if len(named) == 0 || slices.Contains(named, addr) {
		return false
	}
	sub.logger.Warn("redis invalidation: the subscribed server is not the master the sentinels name; subscribing on the master", "server", addr, "master", named[0])
	return true
}

// onSentinel reports whether the server a standalone client names says it
// is a Redis Sentinel (HELLO's mode). A sentinel in redis.addr confirms
// SUBSCRIBE as a data server does, answers its PINGs, and relays nothing
// published on the data servers: while every lookup failed, naming the
// setting, the subscription logged "subscribed" and its gauge read 1
// (TestSentinelAsAddrSubscriptionNamed). HELLO needs no ACL rule on
// Redis 7, and go-redis sends one on each connection anyway; a server
// that does not answer it is taken for no sentinel.
func (sub *Subscriber) onSentinel() bool {
	if !sub.standalone {
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), sub.idle/pingIdle)
	defer cancel()
	reply, err := sub.client.Do(ctx, "HELLO", "2").Slice()
	if err != nil {
		return false
	}
	for i := 0; i+1 < len(reply); i += 2 {
		if reply[i] == "mode" {
			return reply[i+1] == "sentinel"
		}
	}
	return false
}

// clusterFails reports whether node answers cluster_state:fail.
func clusterFails(ctx context.Context, node *redis.Client) bool {
	info, err := node.ClusterInfo(ctx).Result()
	return err == nil && strings.Contains(info, "cluster_state:fail")
}

// clusterWorks reports whether a node of the slot map other than the one
// at addr answers cluster_state:ok, asking them all at once within ctx.
func (sub *Subscriber) clusterWorks(ctx context.Context, addr string) bool {
	cc, ok := sub.client.(*redis.ClusterClient)
	if !ok {
		return false
	}
	var works atomic.Bool
	var wg sync.WaitGroup
	for _, n := range clusterNodes(ctx, cc, sub.idle/pingIdle) {
		if n.Options().Addr == addr {
			continue
		}
		wg.Go(func() {
			if info, err := n.ClusterInfo(ctx).Result(); err == nil && strings.Contains(info, "cluster_state:ok") {
				works.Store(true)
			}
		})
	}
	wg.Wait()
	return works.Load()
}

// logLost logs, once until a subscription is confirmed again, that the
// Cluster node the subscription was on is left for its transport errors
// (in a cluster that cannot be reached at all, every node is left in turn).
func (sub *Subscriber) logLost(err error) {
	if sub.lost {
		return
	}
	sub.lost = true
	sub.logger.Warn("redis invalidation: the subscribed node cannot be reached; subscribing on another node", "err", err.Error())
}

// logRefused logs a refused subscription at error level, once for each
// reason in a row: it is tried again every sub.idle. A NOPERM says which
// rule the ACL user lacks: the channel, or a command the connection runs
// first (SELECT for a redis.db other than 0), which no channel rule fixes.
func (sub *Subscriber) logRefused(err error) {
	why := err.Error()
	if why == sub.refusal {
		return
	}
	sub.refusal = why
	attrs := []any{"err", why, "retry_every", sub.idle.String()}
	if redis.HasErrorPrefix(err, "NOPERM") {
		needs := "+subscribe &" + sub.channel
		if cmd := refusedCommand(err); cmd != "" && !strings.EqualFold(cmd, "subscribe") {
			needs = commandRule(cmd)
		}
		attrs = append(attrs, "needs", needs)
	}
	sub.logger.Error("redis invalidation: subscription refused; invalidations published by other instances are not applied until it is taken", attrs...)
}

// handle applies one reply and reports whether it came from the server
// (any reply, an error reply included, proves the connection alive; watch
// takes an error reply before the subscription's confirmation for its
// refusal first).
func (sub *Subscriber) handle(msg any, subscribed *bool) bool {
	switch m := msg.(type) {
	case *redis.Subscription:
		if m.Kind != "subscribe" {
			return true
		}
		*subscribed = true
		// Messages may have been published before this subscription
		// (the first one included: routes may be cached already). The
		// routes are re-read, not forgotten: a Redis restarted with its
		// data takes SUBSCRIBE while it still answers reads with
		// LOADING, and meanwhile the old routes are served stale.
		n := sub.cache.ExpireAll()
		first := sub.subs.Add(1) == 1
		if first {
			close(sub.ready)
		}
		switch {
		case sub.sentinel:
			sub.logger.Error("redis invalidation: subscribed on a Redis Sentinel, which relays no invalidation published on the data servers: "+sentinelFix, "routes_expired", n)
		case first:
			sub.logger.Info("redis invalidation subscribed", "routes_expired", n)
		default:
			sub.logger.Warn("redis invalidation resubscribed after reconnect; every cached route will be read again, since invalidations published meanwhile were lost", "routes_expired", n)
		}
	case *redis.Message:
		id := strings.ToLower(strings.TrimSpace(m.Payload))
		if !routing.ValidID(id) {
			sub.logBadID(len(m.Payload), time.Now())
			return true
		}
		n := sub.cache.Invalidate(id)
		sub.applied.Add(1)
		sub.logger.Debug("redis invalidation", "sandbox_id", id, "deleted", n)
	case *redis.Pong:
	case error:
		var rerr redis.Error
		return errors.As(m, &rerr)
	}
	return true
}

// badIDLogEvery is how often payloads that are no sandbox id are logged.
const badIDLogEvery = 10 * time.Second

// logBadID logs an ignored payload of n bytes at warn level, at most once
// per badIDLogEvery; the next line counts those held back (suppressed).
// Whoever may PUBLISH on the channel can send them as fast as Redis
// relays them (a million a second here), and a line each filled the disk
// and pushed other lines out of the process log, which drops what its
// output cannot take in time.
func (sub *Subscriber) logBadID(n int, now time.Time) {
	if held, ok := sub.badLogged.Admit(now, badIDLogEvery); ok {
		sub.logger.Warn("redis invalidation: ignored bad id", loglimit.WithSuppressed(held, "len", n)...)
	}
}

// Ready is closed once the first SUBSCRIBE is confirmed by Redis.
func (sub *Subscriber) Ready() <-chan struct{} { return sub.ready }

// Subscriptions counts confirmed SUBSCRIBEs: 1 after start, +1 per reconnect.
func (sub *Subscriber) Subscriptions() int64 { return sub.subs.Load() }

// Applied counts invalidation messages applied to the cache.
func (sub *Subscriber) Applied() int64 { return sub.applied.Load() }

// Subscribed reports whether invalidations are being received now: a
// SUBSCRIBE was confirmed on the current connection and it has not failed
// since. False while Redis is unreachable, while it refuses the
// subscription, while it is a Redis Sentinel (onSentinel), and from a
// connection's failure until its replacement is confirmed (which expires
// the whole cache).
func (sub *Subscriber) Subscribed() bool { return sub.live.Load() }

// Close unsubscribes and waits until no more messages are applied.
func (sub *Subscriber) Close() error {
	sub.closeOnce.Do(func() { close(sub.stop) })
	<-sub.done
	return sub.closeErr
}
