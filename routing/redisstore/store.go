package redisstore

import (
	"context"
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/cube-sandbox/cubeproxy/routing"
)

// Store is a routing.Store over the hashes the control plane writes:
// HGETALL <KeyPrefix><id>, and when that is empty HGETALL <LegacyKeyPrefix><id>.
// The new key wins when both exist. Both are read in one round trip (a
// pipeline). It is safe for concurrent use.
type Store struct {
	client redis.UniversalClient
	cfg    Config
}

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
	return &Store{client: client, cfg: cfg.WithDefaults()}
}

// Client returns the underlying client (for the registry and health checks).
func (s *Store) Client() redis.UniversalClient { return s.client }

// Config returns the store's configuration with defaults applied.
func (s *Store) Config() Config { return s.cfg }

// Close closes the client and every connection in its pool.
func (s *Store) Close() error { return s.client.Close() }

// Lookup reads the route of sandbox id. It returns routing.ErrNotFound when
// both keys are empty or absent, a *routing.FieldError (wrapped) for invalid
// data, and any other error when Redis cannot answer within CommandTimeout.
func (s *Store) Lookup(ctx context.Context, id string) (*routing.Route, error) {
	if !routing.ValidID(id) {
		// Never send a key built from garbage to Redis.
		return nil, &routing.FieldError{Field: routing.FieldSandboxID, Reason: "invalid sandbox id"}
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.CommandTimeout)
	defer cancel()

	key := s.cfg.KeyPrefix + id
	var fields map[string]string
	var err error
	if s.cfg.DisableLegacy {
		fields, err = hgetallResult(key, s.client.HGetAll(ctx, key))
	} else {
		fields, key, err = s.hgetallEither(ctx, key, s.cfg.LegacyKeyPrefix+id)
	}
	if err != nil {
		return nil, err
	}
	if len(fields) == 0 {
		return nil, routing.ErrNotFound
	}
	r, err := routing.ParseRoute(id, fields)
	if err != nil {
		return nil, fmt.Errorf("redis route %s: %w", key, err)
	}
	return r, nil
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
		return nil, key, fmt.Errorf("redis hgetall %s: %w", key, err)
	}
	fields, err := hgetallResult(key, cur)
	if err != nil || len(fields) > 0 {
		return fields, key, err
	}
	fields, err = hgetallResult(legacy, old)
	return fields, legacy, err
}

// hgetallResult is the answer of HGETALL key: a key of another type is
// bad data (a *routing.FieldError), any other error an outage.
func hgetallResult(key string, cmd *redis.MapStringStringCmd) (map[string]string, error) {
	fields, err := cmd.Result()
	if err == nil {
		return fields, nil
	}
	if redis.HasErrorPrefix(err, "WRONGTYPE") {
		// A key of another type is bad data, not an outage: answer 404, not 503.
		return nil, fmt.Errorf("redis hgetall %s: %w", key, &routing.FieldError{Field: "hash", Reason: "route key is not a hash"})
	}
	return nil, fmt.Errorf("redis hgetall %s: %w", key, err)
}
