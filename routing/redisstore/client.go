package redisstore

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
)

// maxRetries is how often a transport error (refused, reset, EOF) is retried
// within one CommandTimeout.
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
type timeouts struct {
	dial, read, pool, minBackoff, maxBackoff time.Duration
}

func budget(commandTimeout time.Duration) timeouts {
	return timeouts{
		dial:       commandTimeout / (maxRetries + 1),
		read:       commandTimeout,
		pool:       commandTimeout,
		minBackoff: commandTimeout / 128,
		maxBackoff: commandTimeout / 10,
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
	tlsConf, err := tlsConfig(cfg)
	if err != nil {
		return nil, err
	}
	t := budget(cfg.CommandTimeout)
	switch {
	case len(cfg.Cluster.Addrs) > 0:
		return redis.NewClusterClient(clusterOptions(cfg, t, tlsConf)), nil
	case cfg.Sentinel.MasterName != "":
		return redis.NewFailoverClient(failoverOptions(cfg, t, tlsConf)), nil
	}
	opt, err := standaloneOptions(cfg, t, tlsConf)
	if err != nil {
		return nil, err
	}
	return redis.NewClient(opt), nil
}

// The three option builders below differ in how they find the server;
// from OnConnect down they set the same connection behaviour (go-redis has
// no type the three share), and a change to one belongs in all three.

// clusterOptions is a Cluster client's; a cluster has no DB to select.
func clusterOptions(cfg Config, t timeouts, tlsConf *tls.Config) *redis.ClusterOptions {
	return &redis.ClusterOptions{
		Addrs:                    cfg.Cluster.Addrs,
		Username:                 cfg.Username,
		Password:                 cfg.Password,
		OnConnect:                setClientName,
		Protocol:                 2,
		MaxRetries:               maxRetries,
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
		TLSConfig:                tlsConf,
		DisableIdentity:          true,
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
	}
}

// failoverOptions is a Sentinel client's. It has no
// MaintNotificationsConfig: go-redis turns maintenance notifications off
// for failover clients itself.
func failoverOptions(cfg Config, t timeouts, tlsConf *tls.Config) *redis.FailoverOptions {
	return &redis.FailoverOptions{
		MasterName:            cfg.Sentinel.MasterName,
		SentinelAddrs:         cfg.Sentinel.Addrs,
		SentinelPassword:      cfg.Sentinel.Password,
		Username:              cfg.Username,
		Password:              cfg.Password,
		DB:                    cfg.DB,
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
		TLSConfig:             tlsConf,
		DisableIdentity:       true,
	}
}

// standaloneOptions is a standalone client's, from url when it is set
// (the URL carries credentials, db and TLS; explicit fields fill what it
// leaves out), else from addr.
func standaloneOptions(cfg Config, t timeouts, tlsConf *tls.Config) (*redis.Options, error) {
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
			return nil, fmt.Errorf("redis url %s: %w", redactUserinfo(cfg.URL), err)
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
		if tlsConf != nil {
			if opt.TLSConfig != nil {
				tlsConf.ServerName = opt.TLSConfig.ServerName
			}
			opt.TLSConfig = tlsConf
		}
	}
	opt.ClientName = "" // a client_name in the URL would be refused as setClientName says
	opt.OnConnect = setClientName
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

// tlsConfig returns nil when TLS is off (and the URL is not rediss://).
func tlsConfig(cfg Config) (*tls.Config, error) {
	if !cfg.TLS && !strings.HasPrefix(cfg.URL, "rediss://") {
		return nil, nil
	}
	c := &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: cfg.InsecureSkipVerify}
	if cfg.CAFile != "" {
		pem, err := os.ReadFile(cfg.CAFile)
		if err != nil {
			return nil, fmt.Errorf("redis ca_file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("redis ca_file %s: no PEM certificates", cfg.CAFile)
		}
		c.RootCAs = pool
	}
	return c, nil
}

// redactUserinfo masks everything between the scheme and the last "@" of
// a URL that may not parse: a password may itself hold "/", "?" or "#".
func redactUserinfo(raw string) string {
	scheme, rest, ok := strings.Cut(raw, "://")
	if !ok {
		return "(not a URL)"
	}
	if i := strings.LastIndexByte(rest, '@'); i >= 0 {
		rest = "xxxxx" + rest[i:]
	}
	return scheme + "://" + rest
}
