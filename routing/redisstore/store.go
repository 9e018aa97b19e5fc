package redisstore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cube-sandbox/cubeproxy/routing"
)

// Store is a routing.Store over the hashes the control plane writes:
// HGETALL <KeyPrefix><id>, and when that is empty HGETALL <LegacyKeyPrefix><id>.
// The new key wins when both exist. Both are read in one round trip (a
// pipeline; on a Cluster, two concurrent reads). It is safe for concurrent use.
type Store struct {
	client redis.UniversalClient
	cfg    Config
	// cluster says the two keys of an id may live on different nodes.
	cluster bool

	// legacyDenied counts the legacy reads Redis refused (NOPERM) since
	// legacyWarned (unix nanos) last reported them.
	legacyDenied atomic.Int64
	legacyWarned atomic.Int64
}

// legacyWarnEvery is how often a legacy key the ACL user may not read is
// reported again while it lasts: the first refusal is logged at once (the
// readiness probe's lookup, at start), and an operator who looks later
// still finds a line within the hour.
const legacyWarnEvery = time.Hour

var _ routing.Store = (*Store)(nil)

// Open builds a client for cfg (see NewClient) and a Store over it.
// It does not dial: an unreachable Redis shows up as Lookup errors.
func Open(cfg Config) (*Store, error) {
	client, err := NewClient(cfg)
	if err != nil {
		return nil, err
	}
	return NewStore(client, cfg), nil
}

// NewStore returns a Store that reads through client with cfg's key layout
// and command timeout. Close closes client.
func NewStore(client redis.UniversalClient, cfg Config) *Store {
	_, cluster := client.(*redis.ClusterClient)
	return &Store{client: client, cfg: cfg.WithDefaults(), cluster: cluster}
}

// Client returns the underlying go-redis client (a *redis.ClusterClient in
// Cluster mode). The proxy does not call it: the registry and the
// subscriber take the store's client themselves; tests inspect it.
func (s *Store) Client() redis.UniversalClient { return s.client }

// Config returns the store's configuration with defaults applied.
func (s *Store) Config() Config { return s.cfg }

// Close closes the client and every connection in its pool.
func (s *Store) Close() error { return s.client.Close() }

// Lookup reads the route of sandbox id. It returns routing.ErrNotFound when
// both keys are empty or absent (a legacy key the ACL user may not read
// counts as absent, see legacyRefused), a *routing.FieldError (wrapped)
// for invalid data, and any other error when Redis cannot answer within
// CommandTimeout.
func (s *Store) Lookup(ctx context.Context, id string) (*routing.Route, error) {
	if !routing.ValidID(id) {
		// Never send a key built from garbage to Redis.
		return nil, &routing.FieldError{Field: routing.FieldSandboxID, Reason: "invalid sandbox id"}
	}
	// The route cache calls with a deadline of its own, CommandTimeout
	// away (serve sets it so): a second one under it would change nothing
	// but cost a context, its channel and a map entry in the parent on
	// every cold lookup.
	if d, ok := ctx.Deadline(); !ok || time.Until(d) > s.cfg.CommandTimeout {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, s.cfg.CommandTimeout)
		defer cancel()
	}

	key := s.cfg.KeyPrefix + id
	var fields map[string]string
	var err error
	if s.cfg.DisableLegacy {
		fields, err = s.routeKeyResult(key, s.client.HGetAll(ctx, key))
	} else if s.cluster {
		fields, key, err = s.hgetallEitherApart(ctx, key, s.cfg.LegacyKeyPrefix+id)
	} else {
		fields, key, err = s.hgetallEither(ctx, key, s.cfg.LegacyKeyPrefix+id)
	}
	if err != nil {
		if hint := otherKindHint(err, s.cluster, s.cfg.Sentinel.MasterName != ""); hint != "" {
			return nil, fmt.Errorf("%w%s", err, hint)
		}
		return nil, err
	}
	if len(fields) == 0 {
		return nil, routing.ErrNotFound
	}
	r, err := routing.ParseRoute(id, fields)
	if err != nil {
		return nil, fmt.Errorf("redis route %s: %w", key, err)
	}
	r.Key = key
	return r, nil
}

// sentinelFix is what an operator whose redis.addr names a Redis Sentinel
// changes.
const sentinelFix = "for a master behind sentinels set redis.sentinel.master_name and list the sentinels in redis.sentinel.addrs"

// otherKindHint is what the error of a command sent to the server
// redis.addr (or redis.url) names adds when that server is of another kind
// (" (...)", with its leading space), or "". cluster and sentinel say
// whether redis.cluster.addrs or redis.sentinel.master_name is set.
//
// A node of a Cluster read as one server answers the keys it holds and
// MOVED for the others: some sandboxes work and others are a 503, some
// heartbeats are written and others not. A sentinel there (its port,
// 26379, or the sentinels of a Sentinel deployment named as one server)
// knows no data command and takes no PUBLISH but its own. Bare, neither
// error named the setting to change, in the lookup's log line and /readyz
// (TestClusterNodeAsStandaloneAddr, TestServerOfAnotherKindIsNamed) nor
// in the registry's warning (TestWritesToServerOfAnotherKindNamed). A
// Cluster client follows MOVED itself, and a Sentinel client's data
// server is the master the sentinels name.
func otherKindHint(err error, cluster, sentinel bool) string {
	switch {
	case cluster:
		return ""
	case redis.HasErrorPrefix(err, "MOVED"):
		return " (this Redis is a Cluster node: list the cluster's nodes in redis.cluster.addrs)"
	case !sentinel && (redis.HasErrorPrefix(err, "unknown command") ||
		redis.HasErrorPrefix(err, "Only HELLO messages are accepted by Sentinel")):
		return " (a Redis Sentinel answers so: " + sentinelFix + ")"
	}
	return ""
}

// hgetallEither reads key and then legacy in one pipeline, and returns the
// fields of key, or of legacy when key is empty, with the key they came
// from. Asking for legacy only once key came back empty cost an unknown id
// (every miss for a deleted sandbox, every random name under the wildcard
// domain) two round trips; sending both costs a known one an HGETALL of a
// key that is usually absent, in the same round trip. The answer is what
// the two reads in turn gave: legacy's own error counts only when key is
// empty.
func (s *Store) hgetallEither(ctx context.Context, key, legacy string) (map[string]string, string, error) {
	pipe := s.client.Pipeline()
	cur := pipe.HGetAll(ctx, key)
	old := pipe.HGetAll(ctx, legacy)
	// Exec's error is the first command's that failed, and each is judged
	// below on its own; but an error go-redis met before either read was
	// answered (a password refused while connecting) is left on neither
	// command, which would read as two empty hashes: "no route" for what
	// is an outage.
	if _, err := pipe.Exec(ctx); err != nil && cur.Err() == nil && old.Err() == nil {
		if redis.HasErrorPrefix(err, "NOPERM") {
			// A SELECT refused while connecting, say.
			return nil, key, fmt.Errorf("redis hgetall %s: %w (the Redis ACL user needs %s)", key, err, s.aclRule(err))
		}
		return nil, key, fmt.Errorf("redis hgetall %s: %w", key, err)
	}
	if errors.Is(cur.Err(), ErrReplyTooLarge) {
		// (errors.Is first: the target of errors.As escapes, an
		// allocation each lookup would pay.)
		var big *ReplyTooLargeError
		if !errors.As(cur.Err(), &big) || big.Reply == 0 {
			return nil, key, tooLarge(key)
		}
		// Legacy's reply was too large, and go-redis gave the failure to
		// the new key's read too, which it had read. Read the new key
		// alone again (a second round trip, small, only while a legacy
		// hash is corrupted): it wins when it holds a route.
		fields, err := s.routeKeyResult(key, s.client.HGetAll(ctx, key))
		if err != nil || len(fields) > 0 {
			return fields, key, err
		}
		return nil, legacy, tooLarge(legacy)
	}
	fields, err := s.routeKeyResult(key, cur)
	if err != nil || len(fields) > 0 {
		return fields, key, err
	}
	return s.legacyResult(legacy, old)
}

// hgetallEitherApart is hgetallEither for a Cluster, where the two keys
// usually live on different masters: a pipeline returns when the last node
// answers, and a master that hung until the cluster failed it over (a
// frozen host, a partition that drops packets) made every cold lookup of
// an id whose legacy key it held wait out the budget, a 503 although the
// new key, on a healthy master, held the route
// (TestClusterLegacyKeyOnHungNode). So the legacy key is read beside the
// new one, and waited for only when the new one is empty.
func (s *Store) hgetallEitherApart(ctx context.Context, key, legacy string) (map[string]string, string, error) {
	// Not cancelled when the new key wins: a read cut short closes its
	// pooled connection, and the legacy read of every known route would
	// dial again. It ends by the lookup's deadline (Lookup set one).
	end, _ := ctx.Deadline()
	oldCtx, cancel := context.WithDeadline(context.WithoutCancel(ctx), end)
	oldc := make(chan *redis.MapStringStringCmd, 1)
	go func() {
		defer cancel()
		oldc <- s.client.HGetAll(oldCtx, legacy)
	}()
	fields, err := s.routeKeyResult(key, s.client.HGetAll(ctx, key))
	if err != nil || len(fields) > 0 {
		return fields, key, err
	}
	select {
	case old := <-oldc:
		return s.legacyResult(legacy, old)
	case <-ctx.Done():
		// Named as the read would have been (frozenMaster).
		err := ctx.Err()
		if cc, ok := s.client.(*redis.ClusterClient); ok && bareTimeout(err) {
			err = masterNoAnswer(ctx, cc, legacy, err)
		}
		return nil, legacy, fmt.Errorf("redis hgetall %s: %w", legacy, err)
	}
}

// legacyResult is the answer of the legacy key's read, once the new key
// was found empty: a key the ACL user may not read counts as no legacy key.
func (s *Store) legacyResult(legacy string, old *redis.MapStringStringCmd) (map[string]string, string, error) {
	if err := old.Err(); err != nil && redis.HasErrorPrefix(err, "NOPERM") {
		if refusedCommand(err) != "" {
			// A command refused on the way to the key (ASKING, which a
			// Cluster key moved mid-migration needs) says nothing of the
			// key: taken for "no legacy key", it answered a route only
			// a legacy key holds 404, negatively cached, its cached
			// route dropped (TestClusterLegacyKeyMovedWithoutAsking).
			return nil, legacy, fmt.Errorf("redis hgetall %s: %w (the Redis ACL user needs %s)", legacy, err, s.aclRule(err))
		}
		// The ACL user may read the new key and not the legacy one: a
		// deployment that never had legacy keys and grants only the new
		// pattern. Reading that as an outage answered every unknown id
		// 503 and kept /readyz 503 for good; read it as no legacy key.
		s.legacyRefused(legacy, err)
		return nil, legacy, nil
	}
	fields, err := hgetallResult(legacy, old)
	return fields, legacy, err
}

// routeKeyResult is hgetallResult for the new key, whose NOPERM names the
// ACL rules the user lacks: the route cannot be read at all, an outage
// (503) the operator must fix, and the log line says how.
func (s *Store) routeKeyResult(key string, cmd *redis.MapStringStringCmd) (map[string]string, error) {
	fields, err := hgetallResult(key, cmd)
	if err != nil && redis.HasErrorPrefix(err, "NOPERM") {
		return nil, fmt.Errorf("%w (the Redis ACL user needs %s)", err, s.aclRule(err))
	}
	return fields, err
}

// aclRule is the rule a NOPERM of a route read asks the operator to
// grant. Redis names a command it refuses ("no permissions to run the
// 'select' command"): one other than HGETALL (SELECT with a redis.db
// other than 0, CLUSTER SLOTS in a Cluster) is the rule, and naming
// "+hgetall ~<prefix>*" instead, which the user has, sent the operator to
// fix what was not broken. A refused key names no command.
func (s *Store) aclRule(err error) string {
	if cmd := refusedCommand(err); cmd != "" && !strings.EqualFold(cmd, "hgetall") {
		return commandRule(cmd)
	}
	return "+hgetall ~" + s.cfg.KeyPrefix + "*"
}

// slotMapRule is the rule a refused read of the Cluster slot map asks
// for, as README does: go-redis (v9.24 on) asks CLUSTER SHARDS first and
// CLUSTER SLOTS when that fails, and a user with neither is refused the
// first; either one is enough, but "+cluster|shards" alone left out the
// one Redis 6 has and the proxy asked for until v9.24, and
// "+cluster|slots" alone has the first refused at each read of the map,
// an ACL LOG entry (TestLookupNamesTheRefusedCommand).
const slotMapRule = "+cluster|slots +cluster|shards"

// commandRule is the rule that grants cmd, a command Redis refused.
func commandRule(cmd string) string {
	if strings.EqualFold(cmd, "cluster|shards") || strings.EqualFold(cmd, "cluster|slots") {
		return slotMapRule
	}
	return "+" + cmd
}

// refusedCommand is the command a NOPERM error says the user may not run
// ("no permissions to run the 'select' command"), or "" when it names
// none (a refused key or channel).
func refusedCommand(err error) string {
	const mark = "run the '"
	msg := err.Error()
	if i := strings.Index(msg, mark); i >= 0 {
		if cmd, _, ok := strings.Cut(msg[i+len(mark):], "'"); ok {
			return cmd
		}
	}
	return ""
}

// legacyRefused reports a legacy read Redis refused: at once the first
// time, then at most every legacyWarnEvery with the count since. Routes
// only a legacy key holds answer 404 meanwhile, which the line says.
func (s *Store) legacyRefused(key string, err error) {
	n := s.legacyDenied.Add(1)
	now := time.Now().UnixNano()
	last := s.legacyWarned.Load()
	if last != 0 && now-last < int64(legacyWarnEvery) || !s.legacyWarned.CompareAndSwap(last, now) {
		return
	}
	s.legacyDenied.Add(-n)
	if s.cfg.Logger != nil {
		s.cfg.Logger.Warn("redis: the ACL user may not read legacy route keys; reading them as absent (routes only a legacy key holds answer 404): grant ~"+
			s.cfg.LegacyKeyPrefix+"* or set redis.disable_legacy",
			"key", key, "denied_reads", n, "err", err)
	}
}

// hgetallResult is the answer of HGETALL key: a key of another type, or
// a reply too large, is bad data (a *routing.FieldError), any other error
// an outage.
func hgetallResult(key string, cmd *redis.MapStringStringCmd) (map[string]string, error) {
	fields, err := cmd.Result()
	if err == nil {
		return fields, nil
	}
	if errors.Is(err, ErrReplyTooLarge) {
		return nil, tooLarge(key)
	}
	if redis.HasErrorPrefix(err, "WRONGTYPE") {
		// A key of another type is bad data, not an outage: answer 404, not 503.
		return nil, fmt.Errorf("redis hgetall %s: %w", key, &routing.FieldError{Field: "hash", Reason: "route key is not a hash"})
	}
	return nil, fmt.Errorf("redis hgetall %s: %w", key, err)
}

// tooLarge is the error of a route hash whose HGETALL reply exceeds
// MaxReplyBytes or MaxReplyElems. A corrupted hash (a runaway writer's
// fields by the hundred thousand, a huge value) is bad data: refused
// before go-redis allocates it, and answered 404 route_invalid, logged
// once and negatively cached, where a read of it whole took longer than
// the budget (a 503) and was tried again by every request for it.
func tooLarge(key string) error {
	return fmt.Errorf("redis hgetall %s: %w", key, &routing.FieldError{Field: "hash",
		Reason: fmt.Sprintf("route hash too large (over %d MiB or %d fields)", MaxReplyBytes>>20, MaxReplyElems/2)})
}
