package redisstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// Instance describes one running proxy in the registry.
type Instance struct {
	ProxyID   string    `json:"proxy_id"`   // instance_id of the proxy
	AdminURL  string    `json:"admin_url"`  // where the lifecycle manager reaches its admin API
	NodeIP    string    `json:"node_ip"`    // node_ip of the proxy
	StartedAt time.Time `json:"started_at"` // unix milliseconds in JSON (MarshalJSON)
	Version   string    `json:"version"`    // the proxy's build version
}

// MarshalJSON writes the entry as the platform's proxy does, started_at in
// unix milliseconds: the platform's lifecycle manager decodes it into an
// int64 and skips an entry that does not decode, so with an RFC 3339
// string it never found this proxy (no state pushes, no last_active polls).
func (i Instance) MarshalJSON() ([]byte, error) {
	type entry struct {
		ProxyID   string `json:"proxy_id"`
		AdminURL  string `json:"admin_url"`
		NodeIP    string `json:"node_ip"`
		StartedAt int64  `json:"started_at"`
		Version   string `json:"version"`
	}
	return json.Marshal(entry{i.ProxyID, i.AdminURL, i.NodeIP, i.StartedAt.UnixMilli(), i.Version})
}

// Registry keeps this instance's entry in the registry hash and its
// heartbeat (unix ms) in the sorted set. Readers treat a heartbeat older
// than a few intervals as a dead instance: a crashed proxy cannot remove
// its own entries.
type Registry struct {
	client redis.UniversalClient
	cfg    RegistryConfig
	id     string
	value  []byte
	budget time.Duration
	logger *slog.Logger
	stop   chan struct{}
	done   chan struct{}
	// ctx is cancelled by Stop: a heartbeat in flight to a Redis that hangs
	// must not hold the shutdown for its command timeout.
	ctx    context.Context
	cancel context.CancelFunc

	stopOnce sync.Once

	// cluster and sentinel say how the client reaches Redis, for the
	// hint of a server of another kind (otherKindHint).
	cluster, sentinel bool

	// lastBeat is the score (unix ms) of the last heartbeat written.
	lastBeat atomic.Int64

	// Failed heartbeats are logged at the first, then at most once every
	// warnEvery with their count, and once more when one succeeds again:
	// a Redis that is down for an hour must not cost 720 warnings per
	// instance. Only the run goroutine touches these.
	warnEvery time.Duration
	failed    int       // beats failed since the last success
	unlogged  int       // of those, beats failed since the last warning
	warned    time.Time // when the last warning was logged
}

// heartbeatWarnEvery is how often a failing heartbeat is logged, as other
// repeated warnings are (certs' on-demand rate limit).
const heartbeatWarnEvery = time.Minute

// StartRegistry starts the registry when cfg.Registry.Enabled, with the
// store's client and command timeout. It returns a nil *Registry (whose Stop
// is a no-op) when the registry is disabled.
func (s *Store) StartRegistry(inst Instance, logger *slog.Logger) (*Registry, error) {
	if !s.cfg.Registry.Enabled {
		return nil, nil
	}
	return startRegistry(s.client, s.cfg.Registry, s.cfg.CommandTimeout, inst, logger, heartbeatWarnEvery, s.cfg.Sentinel.MasterName != "")
}

// StartRegistry writes the entry at once and then every cfg.Interval until
// Stop, whatever cfg.Enabled says. cmdTimeout bounds each write. Failed writes are logged and retried
// on the next tick; they never stop the loop. client is taken for a
// Sentinel client's only through Store.StartRegistry.
func StartRegistry(client redis.UniversalClient, cfg RegistryConfig, cmdTimeout time.Duration, inst Instance, logger *slog.Logger) (*Registry, error) {
	return startRegistry(client, cfg, cmdTimeout, inst, logger, heartbeatWarnEvery, false)
}

// startRegistry is StartRegistry with the interval between warnings of a
// failing heartbeat, which tests shorten, and whether client reaches
// Redis through sentinels (redis.sentinel.master_name).
func startRegistry(client redis.UniversalClient, cfg RegistryConfig, cmdTimeout time.Duration, inst Instance, logger *slog.Logger, warnEvery time.Duration, sentinel bool) (*Registry, error) {
	if inst.ProxyID == "" {
		return nil, errors.New("redis registry: empty proxy_id")
	}
	value, err := json.Marshal(inst)
	if err != nil {
		return nil, fmt.Errorf("redis registry: %w", err)
	}
	if cmdTimeout <= 0 {
		cmdTimeout = DefaultCommandTimeout
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	_, cluster := client.(*redis.ClusterClient)
	r := &Registry{
		client: client,
		cfg:    Config{Registry: cfg}.WithDefaults().Registry,
		id:     inst.ProxyID,
		value:  value,
		budget: cmdTimeout,
		logger: logger.With("proxy_id", inst.ProxyID),
		stop:   make(chan struct{}),
		done:   make(chan struct{}),

		cluster:  cluster,
		sentinel: sentinel,

		warnEvery: warnEvery,
	}
	r.ctx, r.cancel = context.WithCancel(context.Background())
	go r.run()
	return r, nil
}

func (r *Registry) run() {
	defer close(r.done)
	tick := time.NewTicker(r.cfg.Interval)
	defer tick.Stop()
	for {
		r.report(r.beat(), time.Now())
		select {
		case <-r.stop:
			return
		case <-tick.C:
			// A tick that fired while a slow beat ran must not win
			// over a Stop that came meanwhile.
			select {
			case <-r.stop:
				return
			default:
			}
		}
	}
}

// report logs a heartbeat's outcome: the first failure, then at most one
// warning every warnEvery with the failures since the last one, and one
// line when a heartbeat succeeds after failures.
func (r *Registry) report(err error, now time.Time) {
	if err == nil {
		if r.failed > 0 {
			r.logger.Info("redis registry heartbeat recovered", "failed_beats", r.failed)
			r.failed, r.unlogged = 0, 0
		}
		return
	}
	r.failed++
	r.unlogged++
	if r.failed > 1 && now.Sub(r.warned) < r.warnEvery {
		return
	}
	r.logger.Warn("redis registry heartbeat failed (logged at most once a minute while it fails)",
		"err", err, "failed_beats", r.unlogged)
	r.unlogged, r.warned = 0, now
}

// beat writes the entry and the heartbeat in one round trip.
func (r *Registry) beat() error {
	ctx, cancel := context.WithTimeout(r.ctx, r.budget)
	defer cancel()
	// A plain pipeline, not MULTI: in a Cluster the two keys live on different slots.
	now := time.Now().UnixMilli()
	_, err := r.client.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.HSet(ctx, r.cfg.Hash, r.id, r.value)
		p.ZAdd(ctx, r.cfg.ZSet, redis.Z{Score: float64(now), Member: r.id})
		return nil
	})
	if err != nil {
		return fmt.Errorf("redis registry hset %s / zadd %s: %w%s", r.cfg.Hash, r.cfg.ZSet, err, r.hint(err))
	}
	r.lastBeat.Store(now)
	return nil
}

// LastBeat returns the score (unix ms) of the last heartbeat written, or 0
// when none was (or r is nil: the registry is off), for /admin/healthz's
// heartbeat_last_pushed_ms.
func (r *Registry) LastBeat() int64 {
	if r == nil {
		return 0
	}
	return r.lastBeat.Load()
}

// hint names what the operator changes for an error of the registry's
// writes, as a refused or misdirected read does: for a NOPERM, the rule
// to grant (Redis names the command, or "one of the keys", never the
// rule); for a server of another kind than the settings say, the setting
// (otherKindHint). It is "" for any other error.
func (r *Registry) hint(err error) string {
	if !redis.HasErrorPrefix(err, "NOPERM") {
		return otherKindHint(err, r.cluster, r.sentinel)
	}
	if cmd := refusedCommand(err); cmd != "" {
		return " (the Redis ACL user needs " + commandRule(cmd) + ")"
	}
	return " (the Redis ACL user needs ~" + r.cfg.Hash + " ~" + r.cfg.ZSet + ")"
}

// Stop ends the heartbeat loop and removes this instance's entries. It
// returns the removal's error, if any; ctx bounds the whole of it, the wait
// for a heartbeat in flight included. Calling it again removes the entries
// again.
func (r *Registry) Stop(ctx context.Context) error {
	if r == nil {
		return nil
	}
	r.stopOnce.Do(func() {
		close(r.stop)
		r.cancel()
	})
	// go-redis watches a context's deadline, not its cancellation, once a
	// command is on the wire: a heartbeat in flight to a Redis that hangs
	// ends at its own command timeout. Waiting longer than ctx for it would
	// stretch the shutdown; the removal is then skipped (a stale entry's
	// heartbeat ages out for readers anyway).
	select {
	case <-r.done:
	case <-ctx.Done():
		return fmt.Errorf("redis registry: heartbeat in flight at stop: %w", ctx.Err())
	}
	_, err := r.client.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.HDel(ctx, r.cfg.Hash, r.id)
		p.ZRem(ctx, r.cfg.ZSet, r.id)
		return nil
	})
	if err != nil {
		return fmt.Errorf("redis registry hdel %s / zrem %s: %w%s", r.cfg.Hash, r.cfg.ZSet, err, r.hint(err))
	}
	return nil
}
