package redisstore

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
)

// maxRetries is how often a transport error (refused, reset, EOF) is retried
// within one CommandTimeout (a Cluster client's own retries stand in for
// them: noNodeRetries).
const maxRetries = 2

// clientName shows up in CLIENT LIST so operators can tell proxies apart.
const clientName = "cubeproxy"

// setClientName names each new connection, ignoring a refusal: go-redis's
// own ClientName option fails the connection when CLIENT SETNAME is
// refused, and an ACL user granted only the commands the proxy needs
// (README, "Redis store") may not run it. A name is a convenience; a
// connection without one serves routes the same. Only the server's
// refusal is ignored: after a timeout or a reset the connection may still
// get the late reply, and go-redis must drop it rather than pool it.
func setClientName(ctx context.Context, cn *redis.Conn) error {
	err := cn.ClientSetName(ctx, clientName).Err()
	var refused redis.Error
	if errors.As(err, &refused) {
		return nil
	}
	return err
}

// onConnect is setClientName, after an AUTH as username with an empty
// password when a user is named without one: go-redis sends no AUTH (nor
// HELLO's) without a password, so every connection ran as the default
// user, with its rights rather than the ACL user's, and a nopass ACL user
// (one a TLS client certificate stands in for) could not be used
// (TestACLUserWithoutPassword). A user with a password, given none, is now
// refused WRONGPASS. The name is not quoted: it may be the password.
func onConnect(username, password string) func(context.Context, *redis.Conn) error {
	if username == "" || password != "" {
		return setClientName
	}
	return func(ctx context.Context, cn *redis.Conn) error {
		if err := cn.AuthACL(ctx, username, "").Err(); err != nil {
			return fmt.Errorf("failed to authenticate as redis.username with no password: %w", err)
		}
		return setClientName(ctx, cn)
	}
}

// noPipelinePool makes pipelines (Lookup's two HGETALLs) run on the main
// pool, like every other command. go-redis otherwise keeps a second pool
// for them (up to 10 connections with 128 KiB read and write buffers
// each), and with it a lookup whose connections were dropped opened a
// fourth connection, one more than maxRetries allows
// (TestLookupRetriesTransportErrors).
const noPipelinePool = -1

// timeouts is the per-attempt budget derived from CommandTimeout: three dial
// attempts fit into one command timeout; a read may use the whole budget
// because go-redis does not retry read timeouts (the command may have run).
// The context deadline set per Lookup caps the sum in every case.
//
// A sentinel's answer (the master's address, asked for inside each dial)
// gets half a dial's budget: go-redis replaces a sentinel that fails to
// answer only when the dial's budget is not used up yet (sentinelDialer).
type timeouts struct {
	dial, read, sentinelRead, pool, minBackoff, maxBackoff time.Duration
}

func budget(commandTimeout time.Duration) timeouts {
	return timeouts{
		dial:         commandTimeout / (maxRetries + 1),
		sentinelRead: commandTimeout / (maxRetries + 1) / 2,
		read:         commandTimeout,
		pool:         commandTimeout,
		minBackoff:   commandTimeout / 128,
		maxBackoff:   commandTimeout / 10,
	}
}

// NewClient builds a go-redis client for cfg: a Cluster client when
// cluster.addrs is set, a Sentinel failover client when sentinel.master_name
// is set, else a standalone client from addr or url. It does not dial.
func NewClient(cfg Config) (redis.UniversalClient, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	tc, err := tlsConfig(cfg)
	if err != nil {
		return nil, err
	}
	t := budget(cfg.CommandTimeout)
	switch {
	case len(cfg.Cluster.Addrs) > 0:
		c := redis.NewClusterClient(clusterOptions(cfg, t, tc))
		c.AddHook(slotMapReload{c})
		c.AddHook(keyStep{})
		reads := &slotMapReads{recent: cfg.CommandTimeout + time.Second}
		c.AddHook(frozenMaster{c: c, reads: reads})
		seeds := strings.Join(cfg.Cluster.Addrs, ",")
		c.OnNewNode(func(node *redis.Client) {
			node.AddHook(newLastDial(node.Options().Addr, false, cfg.CommandTimeout))
			node.AddHook(emptySlotMap{addr: node.Options().Addr, seeds: seeds, reads: reads})
		})
		return c, nil
	case cfg.Sentinel.MasterName != "":
		d := newSentinelDialer(cfg.Sentinel.Addrs, t, tc, cfg.OnShortage)
		c := redis.NewFailoverClient(failoverOptions(cfg, t, tc, d))
		// First, the outermost: it sees sentinelErrors' error.
		c.AddHook(newLastDial("sentinels "+strings.Join(cfg.Sentinel.Addrs, ", "), true, cfg.CommandTimeout))
		c.AddHook(sentinelErrors{name: cfg.Sentinel.MasterName, dialer: d})
		c.AddHook(masterConns{})
		return c, nil
	}
	opt, err := standaloneOptions(cfg, t, tc)
	if err != nil {
		return nil, err
	}
	c := redis.NewClient(opt)
	c.AddHook(newLastDial(opt.Addr, false, cfg.CommandTimeout))
	return c, nil
}

// The three option builders below differ in how they find the server;
// from OnConnect down they set the same connection behaviour (go-redis has
// no type the three share; MaxRetries aside, see noNodeRetries), and a
// change to one belongs in all three.

// clusterOptions is a Cluster client's; a cluster has no DB to select.
func clusterOptions(cfg Config, t timeouts, tc clientTLS) *redis.ClusterOptions {
	return &redis.ClusterOptions{
		Addrs:                    cfg.Cluster.Addrs,
		Dialer:                   newDialer(t, tc, cfg.OnShortage),
		Username:                 cfg.Username,
		Password:                 cfg.Password,
		OnConnect:                onConnect(cfg.Username, cfg.Password),
		Protocol:                 2,
		MaxRetries:               noNodeRetries,
		MinRetryBackoff:          t.minBackoff,
		MaxRetryBackoff:          t.maxBackoff,
		DialTimeout:              t.dial,
		DialerRetries:            1,
		ReadTimeout:              t.read,
		WriteTimeout:             t.read,
		ContextTimeoutEnabled:    true,
		PoolSize:                 cfg.PoolSize,
		PipelinePoolSize:         noPipelinePool,
		PoolTimeout:              t.pool,
		TLSConfig:                tc.conf,
		DisableIdentity:          true,
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
	}
}

// noNodeRetries turns off the retries of a Cluster client's node
// clients (go-redis's own default for a Cluster): the Cluster client
// retries a command that got no answer itself, on the same master and
// then on the one the slot map names (up to MaxRedirects, 3, which a
// MOVED or ASK needs too), and with maxRetries on each node as well a
// lookup of a key on a master that dropped its connections made 12 of
// them, and took 200-250 ms to fail where 4 take 30 ms
// (TestClusterLookupRetries).
const noNodeRetries = -1

// slotMapReload makes a Cluster client read the slot map again when a
// command fails without an answer from Redis (refused, reset, timed out)
// or with CLUSTERDOWN.
// go-redis re-reads it on a MOVED, and otherwise only every
// ClusterStateReloadInterval (60 s): a master that died or hung sends no
// MOVED, so after the cluster had promoted its replica, lookups of its
// keys kept going to it and failed (503) for up to a minute
// (TestClusterFollowsFailover). The reload runs in the background, one at
// a time, at most about five a second; while the cluster has not failed
// over yet it reads the same map, and the next failure reads it again.
type slotMapReload struct{ c *redis.ClusterClient }

// DialHook leaves dials as they are: a failed dial fails its command,
// which ProcessHook or ProcessPipelineHook sees.
func (h slotMapReload) DialHook(next redis.DialHook) redis.DialHook { return next }

// ProcessHook reloads after a command that got no answer.
func (h slotMapReload) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if err != nil {
			reloadSlotsAfter(h.c, err)
		}
		return err
	}
}

// ProcessPipelineHook reloads after a pipeline of which a command got no
// answer (a Lookup's two reads may go to two nodes).
func (h slotMapReload) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		if err != nil {
			for _, cmd := range cmds {
				reloadSlotsAfter(h.c, cmd.Err())
			}
		}
		return err
	}
}

// reloadSlotsAfter asks a Cluster client (c; any other client is left
// alone) to re-read its slot map when err says a node did not answer, or
// answered CLUSTERDOWN: not for Redis's other replies (redis.Error:
// NOPERM, MOVED, which go-redis handles), a reply refused for its size, or
// a caller that gave up (context.Canceled). A node removed from the
// cluster (reset, still running) or cut off from its majority answers
// CLUSTERDOWN for the slots it no longer serves, and go-redis re-reads
// the map on none: lookups of those slots failed until its periodic
// reload, up to a minute (TestClusterFollowsNodeRemoval). Re-reads are
// coalesced by go-redis.
func reloadSlotsAfter(c redis.UniversalClient, err error) {
	cc, ok := c.(*redis.ClusterClient)
	if !ok || err == nil || errors.Is(err, context.Canceled) || errors.Is(err, ErrReplyTooLarge) {
		return
	}
	var answered redis.Error
	if errors.As(err, &answered) && !redis.HasErrorPrefix(err, "CLUSTERDOWN") {
		return
	}
	cc.ReloadState(context.Background())
}

// keyStep gives the commands the store sends through a Cluster client a
// key step, so that go-redis does not ask a node for COMMAND's whole
// table before each of them: it does so for every command whose step is
// unset (0), under a lock every command of the client takes, with a 5 s
// budget of its own, from a node picked at random, and keeps the table
// only once a node gave it. The ACL user README names has no +command, so
// it was refused before every command: measured on the binary with one
// node and 50 clients of cold lookups, 1800 lookups/s (p50 25 ms) against
// 4200 (p50 9 ms) with +command, 36420 COMMANDs refused in 5 s
// (TestClusterLookupNeedsNoCommandInfo); and with a master hung, the
// COMMAND sent to it held the lock: every lookup and every PUBLISH failed,
// whichever master it was for (TestClusterPublishWithHungMaster).
//
// The keyed commands get Redis's own step, 1. PUBLISH has no key (step
// 0 in Redis's table, which go-redis cannot tell from unset) and gets 1
// too: go-redis reads the step only to split a multi-key command across
// shards, which none of these is, and routes each as before.
type keyStep struct{}

// DialHook leaves dials as they are.
func (keyStep) DialHook(next redis.DialHook) redis.DialHook { return next }

// ProcessHook sets the key step of the store's commands.
func (keyStep) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		switch cmd.Name() {
		case "hgetall", "hset", "zadd", "hdel", "zrem", "publish":
			cmd.SetStepCount(1)
		}
		return next(ctx, cmd)
	}
}

// ProcessPipelineHook leaves pipelines as they are: go-redis asks for no
// key step there.
func (keyStep) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// frozenMaster names, in the bare timeout of a command on a key, the
// master the slot map gives that key. A master that froze after the
// start (a stopped process, a frozen host: its kernel still takes the
// connection) times the command out on that node, whose lastDial names
// it; but the Cluster client retries the timeout, and the retry's backoff
// ends on the command's deadline, whose bare "context deadline exceeded"
// was every lookup's error: /readyz and the log named no node, where the
// standalone and Sentinel clients name theirs
// (TestClusterFrozenNodeErrorNamesNode). go-redis v9.24 no longer retries
// a read that timed out on the command's deadline, whose error ("context
// deadline exceeded: read tcp LOCAL->NODE: i/o timeout") names the node
// only after the proxy's own address: it is named too, so that the error
// begins as before.
//
// A command that ran out of budget before any slot map was read (a seed
// that accepts the connection and never answers) is named with the node
// whose slot map read got no answer (slotMapReads): go-redis v9.24 returns
// its context's bare end when the read of the map ended on it, and its
// read's own error otherwise (TestHungRedisErrorNamesServer).
type frozenMaster struct {
	c     *redis.ClusterClient
	reads *slotMapReads
}

// DialHook leaves dials as they are.
func (frozenMaster) DialHook(next redis.DialHook) redis.DialHook { return next }

// ProcessHook names the key's master in a command's bare timeout.
func (h frozenMaster) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		start := time.Now()
		err := next(ctx, cmd)
		if err != nil && (bareTimeout(err) || unnamedReadTimeout(err)) {
			err = h.explain(ctx, cmd, err, start)
			cmd.SetErr(err)
		}
		return err
	}
}

// unnamedReadTimeout reports a read that timed out, its error not yet
// named by a hook: the read's own error names the node only after the
// proxy's local address, where a Cluster's bare timeout was named
// "no answer from NODE in time".
func unnamedReadTimeout(err error) bool {
	var op *net.OpError
	var na *noAnswer
	var dt *dialTimedOut
	return errors.As(err, &op) && op.Op == "read" && op.Timeout() && !errors.As(err, &na) && !errors.As(err, &dt)
}

// ProcessPipelineHook leaves pipelines as they are: a Cluster store reads
// its keys apart (hgetallEitherApart).
func (frozenMaster) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// explain returns err, the timeout of cmd begun at start, as a *noAnswer
// from the master of cmd's key, when cmd is one of the store's keyed
// commands and the slot map is known: it is read from memory. With no slot
// map read yet (go-redis would read one within ctx, which may not have
// ended when a read's own timeout came first), it is a *noAnswer from the
// node whose read of the map got none, when one did since start or is
// still waiting.
func (h frozenMaster) explain(ctx context.Context, cmd redis.Cmder, err error, start time.Time) error {
	if !h.reads.known.Load() {
		if server := h.reads.unanswered(start); server != "" {
			return &noAnswer{err: err, server: server}
		}
		return err
	}
	switch cmd.Name() {
	case "hgetall", "hset", "zadd", "hdel", "zrem":
	default:
		return err // no key (PUBLISH's is a channel), or not the store's
	}
	args := cmd.Args()
	if len(args) < 2 {
		return err
	}
	return masterNoAnswer(ctx, h.c, args[1], err)
}

// masterNoAnswer returns err, a bare timeout of a read of key, as a
// *noAnswer from the master the slot map of c gives key, or err as it is
// when no map is known.
func masterNoAnswer(ctx context.Context, c *redis.ClusterClient, key any, err error) error {
	k, ok := key.(string)
	if !ok {
		return err
	}
	node, merr := c.MasterForKey(ctx, k)
	if merr != nil {
		return err
	}
	return &noAnswer{err: err, server: node.Options().Addr}
}

// emptySlotMap makes a Cluster node's empty answer to CLUSTER SHARDS or
// CLUSTER SLOTS an error, so that go-redis, which reads the slot map from
// a node it picks at random and tries the next one only after an error,
// asks another node.
// An empty map is the answer of a node that knows no slot: one removed from
// the cluster and reset (redis-cli's del-node), which keeps running and
// which go-redis keeps among the nodes it asks for a minute or more (a seed
// for good), or one not yet joined. Taken for the whole map, it sent every
// command to a random node until the next read (a MOVED each, CLUSTERDOWN
// from the removed node), and a subscription go-redis connected again
// meanwhile could land on the removed node, where no invalidation reaches
// it, while the membership check asked another (TestClusterSkipsEmptySlotMap).
// go-redis's ClusterSlots option (a loader of our own) could skip it too,
// but go-redis then knows no answering node: it rewrote each loopback node
// address to ":port" (127.0.0.1:7000 became :7000), and cannot fill in a
// TLS-only node's port 0 with the seed's.
//
// go-redis returns a node's failure to read the map only when no node it
// asked gave one (the first failure met), so the error says that, with
// the seeds: every seed of a cluster not yet created (nodes without
// CLUSTER ADDSLOTS, joined or not) answers an empty map, and the bare
// "<node> knows no slot (removed from the cluster, or not yet joined)"
// named one node, another on each lookup, as if that node alone were
// wrong (TestClusterWithoutSlots).
//
// go-redis (v9.24 on) reads the map with CLUSTER SHARDS first and with
// CLUSTER SLOTS when that fails without a transport error (Redis 6, an
// ACL user without +cluster|shards, a reply it cannot use), and returns
// the first command's error: both get the same treatment here, a map
// without a slot range (a node without slots answers one shard, itself,
// with none) being empty. go-redis's own error for that ("CLUSTER SHARDS
// returned no slot ranges") named neither the node nor the setting.
//
// It also notes each read's start and a read that got no answer, which
// frozenMaster names when go-redis gives a bare timeout (slotMapReads).
type emptySlotMap struct {
	addr  string // the node's
	seeds string // redis.cluster.addrs, comma-separated
	reads *slotMapReads
}

// DialHook leaves dials as they are.
func (h emptySlotMap) DialHook(next redis.DialHook) redis.DialHook { return next }

// ProcessHook turns an empty CLUSTER SHARDS or CLUSTER SLOTS answer into
// an error, and names the setting in the refusal of a server that is no
// Cluster node.
func (h emptySlotMap) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		var empty func() bool
		switch c := cmd.(type) {
		case *redis.ClusterSlotsCmd:
			empty = func() bool { return len(c.Val()) == 0 }
		case *redis.ClusterShardsCmd:
			empty = func() bool {
				for _, shard := range c.Val() {
					if len(shard.Slots) > 0 {
						return false
					}
				}
				return true
			}
		default:
			return next(ctx, cmd)
		}
		read := h.reads.begin(h.addr)
		err := next(ctx, cmd)
		switch {
		case err == nil && empty():
			err = fmt.Errorf("redis cluster: no node gave a slot map (%s knows no slot): a cluster not yet created (no CLUSTER ADDSLOTS, or redis-cli --cluster create not run), or nodes removed from the cluster or not yet joined; redis.cluster.addrs: %s", h.addr, h.seeds)
			cmd.SetErr(err)
		case notClusterNode(err):
			err = fmt.Errorf("redis cluster: %s in redis.cluster.addrs is not a Cluster node (%w): name a standalone Redis with redis.addr, a master behind sentinels with redis.sentinel.master_name and redis.sentinel.addrs", h.addr, err)
			cmd.SetErr(err)
		}
		h.reads.end(read, err)
		return err
	}
}

// slotMapReads is what a Cluster client's reads of the slot map met, for
// frozenMaster to name the node a command that ran out of budget waited
// for before any map was known. The read may be another command's:
// go-redis (v9.24 on) has concurrent commands, and its background
// reload, wait for one read of the map, each until its own deadline.
type slotMapReads struct {
	recent  time.Duration               // how long before a command a read's failure still counts
	known   atomic.Bool                 // a read gave a map
	pending atomic.Pointer[slotMapRead] // the read under way, if any
	failed  atomic.Pointer[slotMapRead] // the last read that got no answer
}

// slotMapRead is one read of the slot map: the node asked, and when it
// began (pending) or failed.
type slotMapRead struct {
	server string
	at     time.Time
}

// begin notes a read of server's slot map under way.
func (r *slotMapReads) begin(server string) *slotMapRead {
	read := &slotMapRead{server: server, at: time.Now()}
	r.pending.Store(read)
	return read
}

// end notes the end of read with err: a map given, or no answer (a
// timeout; a refusal, a reset or a refused dial names itself).
func (r *slotMapReads) end(read *slotMapRead, err error) {
	r.pending.CompareAndSwap(read, nil)
	switch {
	case err == nil:
		r.known.Store(true)
	case isTimeout(err) || errors.Is(err, context.DeadlineExceeded):
		var op *net.OpError
		if errors.As(err, &op) && op.Op == "dial" {
			return // named by the dial's error (lastDial)
		}
		r.failed.Store(&slotMapRead{server: read.server, at: time.Now()})
	}
}

// unanswered is the node whose read of the slot map got no answer, for a
// command begun at start: the read under way (it outlived the command), or
// the last that failed since shortly before start. It is "" when there is
// none.
func (r *slotMapReads) unanswered(start time.Time) string {
	if read := r.pending.Load(); read != nil {
		return read.server
	}
	if read := r.failed.Load(); read != nil && !read.at.Before(start.Add(-r.recent)) {
		return read.server
	}
	return ""
}

// notClusterNode reports a refusal of CLUSTER SHARDS or SLOTS by a server
// that is no Cluster node: a standalone Redis ("cluster support disabled")
// or a sentinel (no CLUSTER command). The bare refusal named no setting, and
// a sentinel's ("ERR unknown command 'cluster', with args beginning
// with: 'slots'") read as if the proxy had sent a wrong command
// (TestServerOfAnotherKindIsNamed). go-redis asks the other seeds first,
// and returns it only when none gave a map.
func notClusterNode(err error) bool {
	return redis.HasErrorPrefix(err, "This instance has cluster support disabled") ||
		redis.HasErrorPrefix(err, "unknown command 'cluster'")
}

// ProcessPipelineHook leaves pipelines as they are: go-redis reads the
// slot map with a command of its own.
func (h emptySlotMap) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// sentinelErrors rewrites the error go-redis gives a dial when no
// sentinel named the master: "redis: all sentinels specified in
// configuration are unreachable: " and each sentinel's error, joined in
// the order their questions failed, one per line, whatever each met.
//
// The order changed from one lookup to the next (5 texts in 30 lookups of
// three refused sentinels), and the readiness watch, which logs each new
// reason at error level, logged one about every second instead of once
// (TestSentinelsDownErrorIsStable): the errors are sorted, on one line.
//
// A data node listed as a sentinel answers "ERR unknown command
// 'sentinel'", which was "unreachable" too: the error says it is no
// sentinel (TestSentinelAddrsNotSentinels).
//
// A sentinel's NOAUTH or WRONGPASS named neither of the two passwords a
// Sentinel configuration holds, and redis.sentinel.password does not fall
// back to redis.password as the platform's proxy's did: the error names
// the setting (TestSentinelPasswordRefusalNamesTheSetting).
//
// Sentinels that answer but monitor no master of redis.sentinel.master_name
// (SENTINEL GET-MASTER-ADDR-BY-NAME answers nil: a typo, a name another
// deployment uses) were "unreachable: redis: nil", which sent the operator
// to the network (TestSentinelUnknownMasterName): the error names the
// setting and the name, and what the other sentinels met, if any failed
// otherwise.
//
// Each sentinel is named with the last transport error it gave
// (sentinelDialer.failed), in the order redis.sentinel.addrs lists them:
// go-redis's errors for a sentinel that accepted and never answered, or
// whose dial outlasted the dial's budget, were a bare "i/o timeout" or
// "context deadline exceeded", naming no sentinel. A command whose
// budget ran out before its dial failed gets this error (lastDial).
type sentinelErrors struct {
	name   string
	dialer *sentinelDialer
}

// sentinelsError is such an error: its text, and the sentinels' errors
// it wraps (go-redis retries a dial error found among them).
type sentinelsError struct {
	msg  string
	errs []error
}

func (e *sentinelsError) Error() string   { return e.msg }
func (e *sentinelsError) Unwrap() []error { return e.errs }

// DialHook rewrites the error of a dial for which no sentinel named the
// master.
func (h sentinelErrors) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := next(ctx, network, addr)
		if err == nil {
			return c, err
		}
		joined, ok := errors.Unwrap(err).(interface{ Unwrap() []error })
		if !ok {
			return c, err // not the sentinels' answer
		}
		return c, h.rewrite(joined.Unwrap())
	}
}

// rewrite is the error of a dial for which no sentinel named the master,
// errs the sentinels' errors go-redis joined.
func (h sentinelErrors) rewrite(errs []error) *sentinelsError {
	var texts, bare []string
	unknown := false
	for _, e := range errs {
		var sd *sentinelDialError
		switch {
		case errors.As(e, &sd) || isContextError(e) || isTimeout(e):
			// A configured sentinel's dial error, or one go-redis met
			// on a connection to it (which sentinel it cannot say):
			// failed names each with its own.
			if bareTimeout(e) {
				bare = append(bare, e.Error())
			}
		case errors.Is(e, redis.Nil):
			unknown = true
		case strings.Contains(e.Error(), "unknown command 'sentinel'"):
			texts = append(texts, "a server in redis.sentinel.addrs is not a sentinel (it answered SENTINEL with unknown command: a data node's port, where a sentinel's, 26379 by default, was meant?)")
		case redis.HasErrorPrefix(e, "NOAUTH"):
			texts = append(texts, e.Error()+" (a sentinel asks for a password: set redis.sentinel.password, the sentinels' own; redis.password is the data nodes' and is not sent to them)")
		case redis.HasErrorPrefix(e, "WRONGPASS"):
			texts = append(texts, e.Error()+" (a sentinel refuses redis.sentinel.password)")
		default:
			texts = append(texts, e.Error())
		}
	}
	slices.Sort(bare)
	named := h.dialer.failures(len(texts) == 0 && !unknown, slices.Compact(bare))
	slices.Sort(texts)
	texts = append(named, slices.Compact(texts)...)
	if len(texts) == 0 && !unknown {
		// Every ask was given up (context.Canceled: the dial's context
		// ended first), which names no sentinel and is recorded for
		// none: the error ended at "master: " and said nothing
		// (TestSentinelsAskCanceledErrorSaysSo).
		for _, e := range errs {
			texts = append(texts, e.Error())
		}
		slices.Sort(texts)
		if texts = slices.Compact(texts); len(texts) > 0 {
			texts[len(texts)-1] += " (given up before any sentinel answered)"
		}
	}
	msg := "redis sentinel: no sentinel named the master: " + strings.Join(texts, "; ")
	if unknown {
		msg = fmt.Sprintf("redis sentinel: no sentinel knows a master named %q (redis.sentinel.master_name)", h.name)
		if len(texts) > 0 {
			msg += "; other sentinels: " + strings.Join(texts, "; ")
		}
	}
	return &sentinelsError{msg: msg, errs: errs}
}

// lastDial makes a command that ran out of budget while a dial it waited
// for had failed fail with the dial's error, which names the server, and
// wraps the command's too. go-redis dials in the background, and a
// command whose budget ended first failed with a bare "context deadline
// exceeded": with a Redis whose SYNs are dropped (a frozen host, a
// firewall, a wrong IP in a filtered network) every lookup did, as did a
// lookup through sentinels none of which answered, under load or with
// one whose SYNs are dropped, and /readyz and the log named no server
// (TestFrozenRedisErrorNamesServer, TestSentinelsDownErrorNamesFrozen).
// Only a dial that failed while the command ran counts: an older one may
// no longer be true.
//
// A command that ran out of budget with no dial failed meanwhile waited
// for the server's answer, and its bare "context deadline exceeded" or
// "i/o timeout" (a Redis that accepts and never answers: a stopped
// process, whose kernel still completes the handshake) is named with
// the server's address: a standalone client's or a Cluster node's, or
// for a failover client the master's last connected (noAnswer,
// TestHungRedisErrorNamesServer).
type lastDial struct {
	last   atomic.Pointer[dialFailure] // nil once a dial succeeded
	server atomic.Pointer[string]      // the server commands go to ("": not known)
	fixed  bool                        // server stays; else the last connection's replaces it
	recent time.Duration               // how long before a command a failed dial still counts
}

// newLastDial returns a lastDial for a client of server, or for a
// failover client (learns) the sentinels it asks for the master
// ("sentinels ADDR, ADDR"): until a dial connects, a command that ran out
// of budget with no dial ended yet (under load) waited for them; once
// one has, the master's address is learned from it. Its commands have budget
// (redis.command_timeout). A dial that failed up to a second more than
// budget before a command began counts too: a command whose budget ended
// before the dial it waited for ended (under load) failed bare, while the
// dials before failed as it would (TestSentinelsDownErrorUnderLoad).
func newLastDial(server string, learns bool, budget time.Duration) *lastDial {
	h := &lastDial{fixed: !learns, recent: budget + time.Second}
	h.server.Store(&server)
	return h
}

// noAnswer is a command's error at the end of its budget, with no answer
// from server.
type noAnswer struct {
	err    error
	server string
}

func (e *noAnswer) Error() string {
	return "no answer from " + e.server + " in time: " + e.err.Error()
}
func (e *noAnswer) Unwrap() error { return e.err }

// dialFailure is a dial's error and when it was met.
type dialFailure struct {
	err error
	at  time.Time
}

// dialTimedOut is a command's error at the end of its budget, err, told
// by the error of the dial it waited for, dial.
type dialTimedOut struct{ err, dial error }

func (e *dialTimedOut) Error() string   { return e.dial.Error() }
func (e *dialTimedOut) Unwrap() []error { return []error{e.err, e.dial} }

// DialHook records each dial's failure, or success. A dial's own
// context's end names no server, and is not recorded.
func (h *lastDial) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := next(ctx, network, addr)
		switch {
		case err == nil:
			h.last.Store(nil)
			if !h.fixed {
				server := c.RemoteAddr().String()
				h.server.Store(&server)
			}
		default:
			// A bare context end too: it is no answer from the server.
			h.last.Store(&dialFailure{err: err, at: time.Now()})
		}
		return c, err
	}
}

// bareTimeout reports the end of a command's budget, or a read's, in an
// error that names no server.
func bareTimeout(err error) bool {
	if !errors.Is(err, context.DeadlineExceeded) && !isTimeout(err) {
		return false
	}
	var op *net.OpError
	var se *sentinelsError
	var dt *dialTimedOut
	var na *noAnswer
	return !errors.As(err, &op) && !errors.As(err, &se) && !errors.As(err, &dt) && !errors.As(err, &na)
}

// explain returns err, a command's begun at start, or when it is a bare
// timeout: a *dialTimedOut when a dial failed since start, else a
// *noAnswer when the server is known.
func (h *lastDial) explain(err error, start time.Time) error {
	if err == nil || !bareTimeout(err) {
		return err
	}
	if last := h.last.Load(); last != nil && !last.at.Before(start.Add(-h.recent)) {
		if bareTimeout(last.err) {
			return err // which server did not answer the dial is not known
		}
		return &dialTimedOut{err: err, dial: last.err}
	}
	if server := *h.server.Load(); server != "" {
		return &noAnswer{err: err, server: server}
	}
	return err
}

// ProcessHook explains a command that ran out of budget waiting for a
// dial that failed.
func (h *lastDial) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		start := time.Now()
		err := h.explain(next(ctx, cmd), start)
		if err != nil {
			cmd.SetErr(h.explain(cmd.Err(), start))
		}
		return err
	}
}

// ProcessPipelineHook explains each command of a pipeline as ProcessHook.
func (h *lastDial) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		start := time.Now()
		err := h.explain(next(ctx, cmds), start)
		if err != nil {
			for _, cmd := range cmds {
				if cmd.Err() != nil {
					cmd.SetErr(h.explain(cmd.Err(), start))
				}
			}
		}
		return err
	}
}

// isContextError reports a context's end (go-redis's own test, which
// it does not export).
func isContextError(err error) bool {
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)
}

// isTimeout reports a timed-out read or dial.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// masterConns gives the failover client's connections to the master
// their whole read budget back: sentinelDialer cannot tell the master's
// address from a sentinel's it was not given, and caps the reads of both;
// only the failover client's own dials, the master's, pass through its
// hooks, those of the sentinel clients go-redis makes do not.
type masterConns struct{}

// DialHook unwraps the master's connection from its read cap.
func (masterConns) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := next(ctx, network, addr)
		if capped, ok := c.(*shortReads); ok && err == nil {
			return capped.Conn, nil
		}
		return c, err
	}
}

// ProcessHook leaves commands as they are.
func (masterConns) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

// ProcessPipelineHook leaves pipelines as they are.
func (masterConns) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// ProcessHook leaves commands as they are.
func (sentinelErrors) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

// ProcessPipelineHook leaves pipelines as they are.
func (sentinelErrors) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// failoverOptions is a Sentinel client's. It has no
// MaintNotificationsConfig: go-redis turns maintenance notifications off
// for failover clients itself.
func failoverOptions(cfg Config, t timeouts, tc clientTLS, d *sentinelDialer) *redis.FailoverOptions {
	return &redis.FailoverOptions{
		MasterName:       cfg.Sentinel.MasterName,
		SentinelAddrs:    cfg.Sentinel.Addrs,
		SentinelPassword: cfg.Sentinel.Password,
		Dialer:           d.dial,
		Username:         cfg.Username,
		Password:         cfg.Password,
		DB:               cfg.DB,
		// Not onConnect: go-redis runs it on the sentinels' connections
		// too, and an ACL user on the sentinels is not supported.
		OnConnect:             setClientName,
		Protocol:              2,
		MaxRetries:            maxRetries,
		MinRetryBackoff:       t.minBackoff,
		MaxRetryBackoff:       t.maxBackoff,
		DialTimeout:           t.dial,
		DialerRetries:         1,
		ReadTimeout:           t.read,
		WriteTimeout:          t.read,
		ContextTimeoutEnabled: true,
		PoolSize:              cfg.PoolSize,
		PipelinePoolSize:      noPipelinePool,
		PoolTimeout:           t.pool,
		TLSConfig:             tc.conf,
		DisableIdentity:       true,
	}
}

// newDialer is go-redis's own dialer (redis.NewDialer: DialTimeout, its
// TCP keep-alive, TLS when tlsConf is set) whose TLS connections show
// go-redis their socket (checkedTLS), and whose every connection refuses
// a reply over MaxReplyBytes or MaxReplyElems (guardedConn). A dial that
// finds no descriptor calls shed (Config.OnShortage), when set, and is
// tried once more when that freed any: at the limit, the proxy's idle
// sandbox connections held the descriptors a lookup's connection needed,
// and the lookup failed (TestStoreDialShedsIdleSandboxConns).
func newDialer(t timeouts, tc clientTLS, shed func() int) func(ctx context.Context, network, addr string) (net.Conn, error) {
	tcp := redis.NewDialer(&redis.Options{DialTimeout: t.dial})
	dial := func(ctx context.Context, network, addr string) (net.Conn, certAsk, error) {
		if tc.conf == nil {
			c, err := tcp(ctx, network, addr)
			return c, certNotAsked, err
		}
		return dialTLS(ctx, tcp, network, addr, tc, t.dial)
	}
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, ask, err := dial(ctx, network, addr)
		if err != nil && shed != nil && descriptorShortage(err) && shed() > 0 {
			c, ask, err = dial(ctx, network, addr)
		}
		if err != nil {
			return c, handshakeError(err, addr)
		}
		if tc, ok := c.(*tls.Conn); ok {
			if _, ok := tc.NetConn().(syscall.Conn); ok {
				c = checkedTLS{tc}
			}
		}
		return guard(c, ask, tc.conf == nil), nil
	}
}

// certAsk says whether the server asked for a client certificate in the
// TLS handshake, and whether the proxy had one to send.
type certAsk uint8

const (
	certNotAsked certAsk = iota
	certAskedNoneSet
	certAskedSent
)

// dialTLS is what go-redis's own dialer runs for TLS (tls.DialWithDialer:
// the TCP dial by tcp, then the handshake, both within timeout), but
// within the caller's context, which tls.DialWithDialer ignores: a
// handshake with a hung sentinel then ends at the sentinel's deadline
// (sentinelDialer) or when go-redis, which asks every sentinel at once,
// has its answer from another, rather than at the end of the dial's
// whole budget, which it held for the master's dial too.
//
// Each handshake verifies with the roots of tc.roots as they are then.
// It reports whether the server asked for a client certificate: with
// TLS 1.3 the server checks it only after the client's handshake has
// ended, and its refusal arrives as an alert or a reset on the first
// command (see certRefusedError).
func dialTLS(ctx context.Context, tcp func(context.Context, string, string) (net.Conn, error), network, addr string, tc clientTLS, timeout time.Duration) (net.Conn, certAsk, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	raw, err := tcp(ctx, network, addr)
	if err != nil {
		return nil, certNotAsked, err
	}
	conf := tc.conf.Clone()
	if conf.ServerName == "" {
		// The host dialed is the name checked, as tls.Dial does.
		host, _, err := net.SplitHostPort(addr)
		if err != nil {
			host = addr
		}
		conf.ServerName = host
	}
	if tc.roots != nil {
		conf.RootCAs = tc.roots.get()
	}
	ask := certNotAsked
	get := conf.GetClientCertificate
	conf.GetClientCertificate = func(cri *tls.CertificateRequestInfo) (*tls.Certificate, error) {
		if get == nil {
			ask = certAskedNoneSet
			return &tls.Certificate{}, nil // sends none, as with no callback
		}
		ask = certAskedSent
		return get(cri)
	}
	c := tls.Client(raw, conf)
	if err := c.HandshakeContext(ctx); err != nil {
		_ = raw.Close()
		return nil, certNotAsked, err
	}
	return c, ask, nil
}

// handshakeError names addr in the error of a TLS handshake: a failed
// TCP dial names it (a *net.OpError, left as it is), but a handshake's
// error is the handshake's alone ("tls: failed to verify certificate:
// x509: certificate signed by unknown authority"), and through Sentinel,
// where the master's address is the sentinels' answer, /readyz and the
// log could not tell a sentinel's certificate from the master's
// (TestTLSHandshakeErrorNamesServer).
func handshakeError(err error, addr string) error {
	var opErr *net.OpError
	if errors.As(err, &opErr) {
		return err
	}
	return fmt.Errorf("TLS handshake with %s: %w", addr, err)
}

// descriptorShortage reports a dial that failed for want of the
// process's (EMFILE) or the system's (ENFILE) file descriptors.
func descriptorShortage(err error) bool {
	return errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE)
}

// checkedTLS is a TLS connection that exposes its TCP socket (SyscallConn)
// so that go-redis checks it before it reuses it from the pool, as it
// checks a plain one: a non-blocking peek finds the end of a connection
// the server closed while it sat idle (Redis restarted, its `timeout`
// setting, a load balancer's idle timeout), and go-redis dials a new one.
// Without the check every pooled connection was tried first, each failing
// its command with EOF, and a lookup gives up after three: a third of the
// pool's size in lookups failed after every Redis restart
// (TestTLSPoolDropsClosedConnections). The peek reads no TLS record; any
// bytes waiting on an idle connection (none are expected with RESP2) make
// go-redis close it, which costs a dial.
type checkedTLS struct{ *tls.Conn }

// SyscallConn returns the TCP socket's raw connection, for go-redis's
// liveness peek only: reading from it directly would bypass TLS.
func (c checkedTLS) SyscallConn() (syscall.RawConn, error) {
	return c.NetConn().(syscall.Conn).SyscallConn()
}

// sentinelDialer dials the data nodes and the sentinels of a Sentinel
// client with newDialer, and gives each connection to a sentinel a read
// deadline of at most sentinelRead: to a configured one, its dial too;
// to any other address, a sentinel go-redis discovered or the master,
// its reads until masterConns takes the cap off the master's.
//
// go-redis asks its chosen sentinel for the master's address inside every
// dial of a data connection, within that dial's budget (t.dial), and drops
// the sentinel for another only when the question fails before the budget
// ends: a sentinel that stops answering (a frozen host, a path that drops
// packets) kept the whole budget, so it was never dropped, and every new
// connection, hence every lookup not answered by a pooled one, failed for
// as long as that one sentinel hung, with the master and the other
// sentinels healthy (TestHungSentinelIsReplaced). Commands to data nodes
// keep the whole command timeout.
//
// It keeps each configured sentinel's last transport error (failed), for
// sentinelErrors to name it with.
type sentinelDialer struct {
	addrs        []string // redis.sentinel.addrs
	sentinels    map[string]bool
	dialer       func(ctx context.Context, network, addr string) (net.Conn, error)
	sentinelRead time.Duration

	mu     sync.Mutex
	failed map[string]error // by configured sentinel; none since its last answer
}

// sentinelDialError is a configured sentinel's dial error.
type sentinelDialError struct{ err error }

func (e *sentinelDialError) Error() string { return "sentinel: " + e.err.Error() }
func (e *sentinelDialError) Unwrap() error { return e.err }

// fail records err as addr's last error; nil (an answer) clears it.
// A dial given up because another sentinel answered is no failure.
func (d *sentinelDialer) fail(addr string, err error) {
	if errors.Is(err, context.Canceled) {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if err == nil {
		delete(d.failed, addr)
		return
	}
	d.failed[addr] = err
}

// failures is the error of each configured sentinel that failed since it
// last answered, in configuration order, as "sentinel: " and the error
// when that names the sentinel (a dial's, a handshake's), else
// "sentinel ADDR: " and the error. When none answered (noAnswers), one
// with no error recorded is given the timeouts go-redis met that name no
// sentinel (bare): a lookup whose budget ran out before a sentinel's
// dial ended, under load, named none of them
// (TestSentinelsDownErrorUnderLoad).
func (d *sentinelDialer) failures(noAnswers bool, bare []string) []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []string
	for _, a := range d.addrs {
		err, ok := d.failed[a]
		switch {
		case ok && strings.Contains(err.Error(), a):
			out = append(out, "sentinel: "+err.Error())
		case ok:
			out = append(out, "sentinel "+a+": "+err.Error())
		case noAnswers && len(bare) > 0:
			out = append(out, "sentinel "+a+": "+strings.Join(bare, ", "))
		}
	}
	return out
}

func newSentinelDialer(addrs []string, t timeouts, tc clientTLS, shed func() int) *sentinelDialer {
	d := &sentinelDialer{
		addrs:        addrs,
		failed:       make(map[string]error, len(addrs)),
		sentinels:    make(map[string]bool, len(addrs)),
		dialer:       newDialer(t, tc, shed),
		sentinelRead: t.sentinelRead,
	}
	for _, a := range addrs {
		d.sentinels[a] = true
	}
	return d
}

func (d *sentinelDialer) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	if !d.sentinels[addr] {
		c, err := d.dialer(ctx, network, addr)
		if err != nil {
			return c, err
		}
		noteDialed(ctx, addr)
		// A sentinel go-redis learned from the listed ones (SENTINEL
		// SENTINELS) is dialed here too, by its announced IP: one
		// listed by host name is learned again so. Left the whole
		// command timeout for its answers, one that hung was never
		// dropped (TestHungDiscoveredSentinelIsReplaced).
		return &shortReads{Conn: c, max: d.sentinelRead}, nil
	}
	// The connection and its TLS handshake are an answer too: a hung
	// sentinel accepts the TCP connection (its kernel does) and never
	// completes the handshake, and one behind a path that drops packets
	// never completes the connection.
	ctx, cancel := context.WithTimeout(ctx, d.sentinelRead)
	defer cancel()
	c, err := d.dialer(ctx, network, addr)
	if err != nil {
		// go-redis says a sentinel failed only when all configured ones did.
		d.fail(addr, err)
		return c, &sentinelDialError{err}
	}
	return &shortReads{Conn: c, max: d.sentinelRead, seen: func(err error) { d.fail(addr, err) }}, nil
}

// shortReads caps every read deadline set on a connection at max from
// now. No deadline (a subscription waiting for +switch-master) stays none.
// It hides the socket (syscall.Conn), so go-redis skips its check of an
// idle pooled connection before reuse, as it does for a TLS one: a dead
// sentinel connection then fails its command, which go-redis retries.
//
// seen, when set, is told of each read's outcome: nil for bytes read,
// else the error, with no address in it (a local port differs on each
// connection, and the text must not).
type shortReads struct {
	net.Conn
	max  time.Duration
	seen func(error)
}

// Read reads, and tells seen what it met.
func (c *shortReads) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	switch {
	case c.seen == nil || errors.Is(err, net.ErrClosed): // closed here
	case n > 0:
		c.seen(nil)
	case isTimeout(err):
		c.seen(errors.New("connected, no answer in time"))
	case err != nil:
		var op *net.OpError
		if errors.As(err, &op) {
			err = fmt.Errorf("connected, then %w", op.Err)
		} else {
			err = fmt.Errorf("connected, then %w", err)
		}
		c.seen(err)
	}
	return n, err
}

// SetReadDeadline sets t, or now+max when that is earlier.
func (c *shortReads) SetReadDeadline(t time.Time) error {
	return c.Conn.SetReadDeadline(c.capped(t))
}

// SetDeadline sets the write deadline t and the read deadline as
// SetReadDeadline does.
func (c *shortReads) SetDeadline(t time.Time) error {
	if err := c.Conn.SetWriteDeadline(t); err != nil {
		return err
	}
	return c.Conn.SetReadDeadline(c.capped(t))
}

func (c *shortReads) capped(t time.Time) time.Time {
	if limit := time.Now().Add(c.max); !t.IsZero() && t.After(limit) {
		return limit
	}
	return t
}

// standaloneOptions is a standalone client's, from url when it is set
// (the URL carries credentials, db and TLS; explicit fields fill what it
// leaves out), else from addr.
func standaloneOptions(cfg Config, t timeouts, tc clientTLS) (*redis.Options, error) {
	tlsConf := tc.conf
	opt := &redis.Options{Addr: cfg.Addr, Username: cfg.Username, Password: cfg.Password, DB: cfg.DB, TLSConfig: tlsConf}
	if cfg.URL != "" {
		var err error
		opt, err = redis.ParseURL(cfg.URL)
		if err != nil {
			// A *url.Error quotes the whole URL, password included, and
			// its reason may quote a piece of it ("invalid port ":Zm9v"");
			// this error ends up in the process's log.
			var ue *url.Error
			if errors.As(err, &ue) {
				err = errors.New("not a valid URL (check that the password is URL-encoded)")
			}
			return nil, fmt.Errorf("redis.url %s: %w", redactURL(cfg.URL), err)
		}
		if opt.Username == "" {
			opt.Username = cfg.Username
		}
		if opt.Password == "" {
			opt.Password = cfg.Password
		}
		if opt.DB == 0 {
			opt.DB = cfg.DB
		}
		if opt.Username != "" && opt.Password == "" && cfg.Logger != nil {
			// redis-cli -u reads a lone name before the '@' as the
			// password, go-redis as the user: a URL that works with
			// redis-cli failed here with a bare "NOAUTH Authentication
			// required". The name is not quoted: it may be the password.
			cfg.Logger.Warn("redis.url names a user and no password (redis.password is empty too): the name is sent as the ACL user, with an empty password (a nopass user's); redis-cli -u reads a lone name as the password instead. For a password alone write redis://:PASSWORD@host")
		}
		if tlsConf != nil {
			if opt.TLSConfig != nil {
				tlsConf.ServerName = opt.TLSConfig.ServerName
			}
			opt.TLSConfig = tlsConf
		}
	}
	opt.ClientName = "" // a client_name in the URL would be refused as setClientName says
	opt.Dialer = newDialer(t, clientTLS{conf: opt.TLSConfig, roots: tc.roots}, cfg.OnShortage)
	opt.OnConnect = onConnect(opt.Username, opt.Password)
	opt.Protocol = 2
	opt.MaxRetries = maxRetries
	opt.MinRetryBackoff = t.minBackoff
	opt.MaxRetryBackoff = t.maxBackoff
	opt.DialTimeout = t.dial
	opt.DialerRetries = 1
	opt.ReadTimeout = t.read
	opt.WriteTimeout = t.read
	opt.ContextTimeoutEnabled = true
	opt.PoolSize = cfg.PoolSize
	opt.PipelinePoolSize = noPipelinePool
	opt.PoolTimeout = t.pool
	opt.DisableIdentity = true
	opt.MaintNotificationsConfig = &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}
	return opt, nil
}

// clientTLS is how the connections to Redis use TLS: conf (nil: TLS is
// off), and roots, redis.ca_file (nil: conf's RootCAs, the system's).
type clientTLS struct {
	conf  *tls.Config
	roots *caBundle
}

// tlsConfig returns a zero clientTLS when TLS is off (and the URL is not
// rediss://).
func tlsConfig(cfg Config) (clientTLS, error) {
	if !cfg.tlsOn() {
		return clientTLS{}, nil
	}
	tc := clientTLS{conf: &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: cfg.InsecureSkipVerify}}
	if cfg.CAFile != "" {
		b, err := newCABundle(cfg.CAFile, cfg.Logger)
		if err != nil {
			return clientTLS{}, err
		}
		// go-redis is given conf with the roots read at start; the
		// dialer's handshakes use the bundle as it is then.
		tc.conf.RootCAs, tc.roots = b.pool, b
	}
	if cfg.CertFile != "" {
		pair, err := newClientPair(cfg.CertFile, cfg.KeyFile, cfg.Logger)
		if err != nil {
			return clientTLS{}, err
		}
		tc.conf.GetClientCertificate = pair.get
	}
	return tc, nil
}

// redactURL masks everything between the scheme and the last "@" of
// a URL that may not parse (a password may itself hold "/", "?" or "#"),
// and the value of every query option: go-redis refuses an option it does
// not know by its name alone, and `?password=` is one an operator may
// try. The names stay, as the error is about them.
func redactURL(raw string) string {
	scheme, rest, ok := strings.Cut(raw, "://")
	if !ok {
		return "(not a URL)"
	}
	if i := strings.LastIndexByte(rest, '@'); i >= 0 {
		rest = "xxxxx" + rest[i:]
	}
	if path, query, ok := strings.Cut(rest, "?"); ok {
		opts := strings.Split(query, "&")
		for i, o := range opts {
			if name, _, ok := strings.Cut(o, "="); ok {
				opts[i] = name + "=xxxxx"
			}
		}
		rest = path + "?" + strings.Join(opts, "&")
	}
	return scheme + "://" + rest
}
