// Package redisstore reads the sandbox routing table from Redis, the way the
// platform's control plane writes it, and shares invalidations and an
// instance registry between CubeProxy instances through the same Redis.
package redisstore

import (
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"slices"
	"strings"
	"time"
)

// Defaults for Config; they match the keys the control plane and the
// platform's previous proxy use.
const (
	DefaultKeyPrefix         = "cube:v1:shared:sandbox:proxy:"
	DefaultLegacyKeyPrefix   = "bypass_host_proxy:"
	DefaultInvalidateChannel = "cube:v1:shared:cube_proxy:invalidate"
	DefaultCommandTimeout    = time.Second
	DefaultRegistryInterval  = 5 * time.Second
	DefaultRegistryHash      = "cube:v1:shared:cube_proxy:registry"
	DefaultRegistryZSet      = "cube:v1:shared:cube_proxy:heartbeat"
)

// Config selects the Redis deployment and the key layout. Exactly one of
// Addr, URL, Sentinel.MasterName or Cluster.Addrs names the server(s).
type Config struct {
	// Addr is host:port of a standalone server.
	Addr string `yaml:"addr" usage:"host:port of a standalone Redis"`
	// URL is a redis:// or rediss:// URL (user, password, db and TLS in one string).
	URL string `yaml:"url" usage:"redis:// or rediss:// URL (user, password, db, TLS)"`
	// Username is the ACL user (Redis 6+); empty uses the default user.
	Username string `yaml:"username" usage:"ACL user (Redis 6+; empty: the default user)"`
	// Password authenticates to the data nodes (not to sentinels).
	Password string `yaml:"password" usage:"password of the data nodes"`
	// DB is the database index (standalone and Sentinel; Cluster has only 0).
	DB int `yaml:"db" usage:"database index"`
	// TLS turns on TLS to the data nodes and sentinels.
	TLS bool `yaml:"tls" usage:"TLS to the data nodes and sentinels"`
	// CAFile is a PEM bundle that verifies the server; empty uses the
	// system roots. Read again when it changes (see caBundle).
	CAFile string `yaml:"ca_file" usage:"PEM bundle that verifies the Redis server (empty: the system's roots)"`
	// CertFile and KeyFile are the client certificate (PEM, chain after
	// it) and its key, for a server that asks for one: redis-server's
	// tls-auth-clients is on by default, and without a certificate its
	// handshake fails ("tls: certificate required"). Read again when
	// either file changes (see clientPair).
	CertFile string `yaml:"cert_file" usage:"client certificate (PEM) for a Redis that asks for one (tls-auth-clients)"`
	KeyFile  string `yaml:"key_file" usage:"key of redis.cert_file (PEM)"`
	// InsecureSkipVerify disables server certificate checks (tests only).
	InsecureSkipVerify bool `yaml:"insecure_skip_verify" usage:"skip Redis certificate checks (tests only)"`

	Sentinel SentinelConfig `yaml:"sentinel"` // set master_name to reach Redis through Sentinel
	Cluster  ClusterConfig  `yaml:"cluster"`  // set addrs to use a Redis Cluster

	// PoolSize is the connection pool size per node (0: go-redis default, 10 per CPU).
	PoolSize int `yaml:"pool_size" usage:"connections per node (0: go-redis default)"`
	// KeyPrefix is prepended to the sandbox id to form the route hash key.
	KeyPrefix string `yaml:"key_prefix" usage:"route hash key prefix"`
	// LegacyKeyPrefix is the fallback key prefix, used when the first key is empty.
	LegacyKeyPrefix string `yaml:"legacy_key_prefix" usage:"fallback route hash key prefix"`
	// DisableLegacy skips the legacy key, saving one HGETALL per lookup
	// (sent in the same round trip as the first) when no old deployment
	// writes it.
	DisableLegacy bool `yaml:"disable_legacy" usage:"do not read the legacy key"`
	// InvalidateChannel is the pub/sub channel carrying sandbox ids to drop.
	InvalidateChannel string `yaml:"invalidate_channel" usage:"pub/sub channel of cache invalidations"`
	// CommandTimeout bounds one lookup, retries included.
	CommandTimeout time.Duration `yaml:"command_timeout" usage:"budget of one lookup, retries included"`

	// Registry is configured at the top level of the proxy config (registry:).
	Registry RegistryConfig `yaml:"-"`

	// Logger gets what an operator has to fix and a lookup cannot answer
	// with (a legacy key the ACL user may not read); nil logs nothing.
	Logger *slog.Logger `yaml:"-"`

	// OnShortage is called when a dial fails for want of the process's
	// descriptors, and returns how many it freed (the proxy closes idle
	// sandbox connections); the dial is tried once more when it freed
	// any. nil frees none.
	OnShortage func() int `yaml:"-"`
}

// SentinelConfig points at Redis Sentinel.
type SentinelConfig struct {
	MasterName string   `yaml:"master_name" usage:"Sentinel master name"`
	Addrs      []string `yaml:"addrs" usage:"Sentinel addresses"`
	// Password authenticates to the sentinels themselves.
	Password string `yaml:"password" usage:"password of the sentinels themselves"`
}

// ClusterConfig lists seed nodes of a Redis Cluster.
type ClusterConfig struct {
	Addrs []string `yaml:"addrs" usage:"Cluster node addresses"`
}

// RegistryConfig controls the instance registry (off by default).
type RegistryConfig struct {
	Enabled  bool          `yaml:"enabled" usage:"announce this instance in Redis (store: redis)"`
	Interval time.Duration `yaml:"interval" usage:"how often the registry entry is written"`
	Hash     string        `yaml:"hash" usage:"registry hash key"`
	ZSet     string        `yaml:"zset" usage:"heartbeat sorted-set key"`
	// AdminURL is the platform proxy's CUBE_PROXY_ADMIN_URL.
	AdminURL string `yaml:"admin_url" usage:"the admin API's URL the entry announces, for a lifecycle manager that reaches it otherwise than at the admin listener's address (a port mapping, a name); empty = that address, node_ip in place of a wildcard host"`
}

// WithDefaults returns c with every empty field set to its default.
func (c Config) WithDefaults() Config {
	if c.KeyPrefix == "" {
		c.KeyPrefix = DefaultKeyPrefix
	}
	if c.LegacyKeyPrefix == "" {
		c.LegacyKeyPrefix = DefaultLegacyKeyPrefix
	}
	if c.InvalidateChannel == "" {
		c.InvalidateChannel = DefaultInvalidateChannel
	}
	if c.CommandTimeout <= 0 {
		c.CommandTimeout = DefaultCommandTimeout
	}
	if c.Registry.Interval <= 0 {
		c.Registry.Interval = DefaultRegistryInterval
	}
	if c.Registry.Hash == "" {
		c.Registry.Hash = DefaultRegistryHash
	}
	if c.Registry.ZSet == "" {
		c.Registry.ZSet = DefaultRegistryZSet
	}
	return c
}

// Validate reports a configuration that names no server or more than one
// kind. Its errors name the settings by the keys of cubeproxy's redis:
// section (redis.addr), a missing one with its environment variable, as
// the operator who reads them writes them.
func (c Config) Validate() error {
	var named []string
	for _, k := range []struct {
		key string
		set bool
	}{
		{"redis.addr", c.Addr != ""}, {"redis.url", c.URL != ""},
		{"redis.sentinel.master_name", c.Sentinel.MasterName != ""}, {"redis.cluster.addrs", len(c.Cluster.Addrs) > 0},
	} {
		if k.set {
			named = append(named, k.key)
		}
	}
	switch {
	case len(named) == 0:
		return errors.New("store is redis but no Redis is named: set redis.addr (CUBEPROXY_REDIS_ADDR, for example 127.0.0.1:6379), redis.url, redis.sentinel.master_name or redis.cluster.addrs")
	case len(named) > 1:
		return fmt.Errorf("%s and %s are both set: name one Redis (standalone, Sentinel or Cluster), with one of redis.addr, redis.url, redis.sentinel.master_name or redis.cluster.addrs", named[0], named[1])
	case c.Sentinel.MasterName != "" && len(c.Sentinel.Addrs) == 0:
		return errors.New("redis.sentinel.master_name is set but redis.sentinel.addrs is empty: set redis.sentinel.addrs (CUBEPROXY_REDIS_SENTINEL_ADDRS), the sentinels to ask for the master")
	case len(c.Cluster.Addrs) > 0 && c.DB != 0:
		return fmt.Errorf("redis.db: %d, but a Redis Cluster has only db 0 (redis.cluster.addrs is set); remove redis.db", c.DB)
	case c.DB < 0:
		return fmt.Errorf("redis.db: %d is negative", c.DB)
	case (c.CertFile == "") != (c.KeyFile == ""):
		set, unset := "redis.cert_file", "redis.key_file"
		if c.CertFile == "" {
			set, unset = unset, set
		}
		return fmt.Errorf("%s is set but %s is empty: a client certificate needs both, the certificate and its key", set, unset)
	case (c.CAFile != "" || c.CertFile != "" || c.InsecureSkipVerify) && !c.tlsOn():
		key := "redis.ca_file"
		switch {
		case c.CAFile != "":
		case c.CertFile != "":
			key = "redis.cert_file"
		default:
			key = "redis.insecure_skip_verify"
		}
		return fmt.Errorf("%s is set but TLS to Redis is off: set redis.tls: true (CUBEPROXY_REDIS_TLS=true) or a rediss:// redis.url, or remove %s", key, key)
	case c.PoolSize < 0:
		return fmt.Errorf("redis.pool_size: %d is negative", c.PoolSize)
	case c.PoolSize > MaxPoolSize:
		// go-redis panics above 2^31-1 (check and serve died with a stack
		// trace), and allocates the pool's slots up front below that: 1e8
		// took 5 s to start.
		return fmt.Errorf("redis.pool_size: %d is above %d, the most connections per node the proxy opens (a Redis takes 10000 clients by default)", c.PoolSize, MaxPoolSize)
	}
	return CheckURL(c.URL)
}

// tlsOn reports whether the connections use TLS: redis.tls, or a
// rediss:// URL, its scheme in any case, as go-redis reads it (REDISS://
// was TLS to go-redis, with the system's roots, while ca_file and the
// client certificate were refused as "TLS to Redis is off").
func (c Config) tlsOn() bool {
	scheme, _, ok := strings.Cut(c.URL, "://")
	return c.TLS || ok && strings.EqualFold(scheme, "rediss")
}

// CheckURL refuses a redis.url whose userinfo holds a raw '/', '?' or
// '#'. Such a character ends the authority there, and go-redis reads the
// rest of it, "@host" included, as the db, an option or a fragment: its
// refusal quoted the password into the process's log (invalid database
// number: "s3cret@r:6379"), and after a '#' the URL was valid, for
// localhost:6379 without a password. The userinfo ends at the last '@',
// or, in a unix:// URL, whose socket path may hold an '@' too
// (/run/redis/redis@main.sock), at the last "@/". The refusal names the
// URL with its userinfo masked.
func CheckURL(raw string) error {
	scheme, rest, ok := strings.Cut(raw, "://")
	if !ok {
		return nil // go-redis refuses it, and redactURL hides it all
	}
	at := strings.LastIndexByte(rest, '@')
	if strings.EqualFold(scheme, "unix") {
		at = strings.LastIndex(rest, "@/")
	}
	if at >= 0 && strings.ContainsAny(rest[:at], "/?#") {
		return fmt.Errorf("redis.url %s: its user name or password holds a raw '/', '?' or '#', which would end the host there and make the rest the db or an option: URL-encode them (%%2F, %%3F, %%23)", redactURL(raw))
	}
	return checkURLOptions(raw, rest[at+1:])
}

// overriddenURLOptions are the go-redis URL options the proxy sets itself
// on every connection, whatever the URL says, with what to do instead.
// go-redis takes them, and the proxy then replaced them without a word:
// `?pool_size=100` left the pool at go-redis's default, `?dial_timeout=5s`
// at a third of redis.command_timeout, `?skip_verify=true` verified all
// the same (TestURLOptionsTheProxySets). go-redis v9.24 takes six more
// that v9.23 refused ("unexpected option"), and a URL that named one no
// longer failed to start: dialer_retries down to pipeline_min_idle_conns.
var overriddenURLOptions = map[string]string{
	"pool_size":          "set redis.pool_size instead",
	"dial_timeout":       "the proxy derives it from redis.command_timeout (one lookup's budget, retries included): set that instead",
	"read_timeout":       "the proxy derives it from redis.command_timeout (one lookup's budget, retries included): set that instead",
	"write_timeout":      "the proxy derives it from redis.command_timeout (one lookup's budget, retries included): set that instead",
	"pool_timeout":       "the proxy derives it from redis.command_timeout (one lookup's budget, retries included): set that instead",
	"max_retries":        "the proxy derives its retries from redis.command_timeout (one lookup's budget, retries included): remove it",
	"min_retry_backoff":  "the proxy derives its retries from redis.command_timeout (one lookup's budget, retries included): remove it",
	"max_retry_backoff":  "the proxy derives its retries from redis.command_timeout (one lookup's budget, retries included): remove it",
	"skip_verify":        "set redis.insecure_skip_verify instead",
	"protocol":           "the proxy speaks RESP2 to Redis: remove it",
	"client_name":        "the proxy names its connections " + clientName + ": remove it",
	"pipeline_pool_size": "the proxy runs pipelines on the main pool: remove it",

	"dialer_retries":          "the proxy dials once per attempt and derives its retries from redis.command_timeout (one lookup's budget, retries included): remove it",
	"dialer_retry_timeout":    "the proxy dials once per attempt and derives its retries from redis.command_timeout (one lookup's budget, retries included): remove it",
	"context_timeout_enabled": "the proxy bounds each command by redis.command_timeout: set that instead",
	"disable_identity":        "the proxy sends no CLIENT SETINFO: remove it",
	"identity_suffix":         "the proxy sends no CLIENT SETINFO: remove it",
	"pipeline_min_idle_conns": "the proxy runs pipelines on the main pool: remove it",
}

// checkURLOptions refuses a query option of raw, the part after its
// userinfo being tail, that the proxy would override (overriddenURLOptions),
// naming the option and not its value. A query that does not parse is left
// to go-redis, whose refusal is masked (redactURL).
func checkURLOptions(raw, tail string) error {
	_, query, ok := strings.Cut(tail, "?")
	if !ok {
		return nil
	}
	query, _, _ = strings.Cut(query, "#")
	opts, err := url.ParseQuery(query)
	if err != nil {
		return nil
	}
	names := make([]string, 0, len(opts))
	for name := range opts {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		if instead, ok := overriddenURLOptions[name]; ok {
			return fmt.Errorf("redis.url %s: option %s is not applied, the proxy sets it on every connection: %s", redactURL(raw), name, instead)
		}
	}
	return nil
}

// MaxPoolSize bounds redis.pool_size: a hundred times Redis's default
// maxclients.
const MaxPoolSize = 1_000_000
