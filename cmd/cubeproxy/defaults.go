package main

import (
	"time"

	"github.com/cube-sandbox/cubeproxy/accesslog"
	"github.com/cube-sandbox/cubeproxy/certs"
	"github.com/cube-sandbox/cubeproxy/config"
	"github.com/cube-sandbox/cubeproxy/proxy"
	"github.com/cube-sandbox/cubeproxy/routing"
	"github.com/cube-sandbox/cubeproxy/routing/redisstore"
	"github.com/cube-sandbox/cubeproxy/telemetry"
)

// The settings below reach the packages that use them through these
// mappings, which build and effective share: what serve -h and cubeproxy
// check show is what those packages make of the same values.

// proxyConfig is the part of proxy.Config that comes straight from
// settings; build adds what it constructs (node IP, signer, telemetry...).
func proxyConfig(cfg *config.Config) proxy.Config {
	return proxy.Config{
		Parser:                  routing.ParserConfig{Domains: cfg.Domains, SharedHosts: cfg.SharedHosts},
		MaxRequestBodySize:      cfg.MaxRequestBody,
		ConnectTimeout:          cfg.Upstream.ConnectTimeout,
		ResponseHeaderTimeout:   cfg.Upstream.ResponseHeaderTimeout,
		IdleStreamTimeout:       cfg.Upstream.IdleTimeout,
		HeartbeatInterval:       cfg.Upstream.HeartbeatInterval,
		MaxConnsPerUpstream:     cfg.Upstream.MaxConns,
		UpstreamIdleConnTimeout: cfg.Upstream.IdleConnTimeout,
		UpstreamReadBufferSize:  cfg.Upstream.MaxHeaderSize,
		MaxStreamsPerSandbox:    cfg.MaxStreams,
		StreamLimitWait:         cfg.StreamLimitWait,
		MaxHeldBody:             cfg.MaxHeldBody,
		HeldBodyBudget:          cfg.HeldBodyBudget,
		HeldBodyPerSandbox:      cfg.HeldBodyPerSandbox,
		ResumeAddr:              cfg.Lifecycle.SidecarAddr,
		ResumeTimeout:           cfg.Lifecycle.ResumeTimeout,
	}
}

// serverConfig maps the listener settings.
func serverConfig(cfg *config.Config) proxy.ServerConfig {
	return proxy.ServerConfig{
		ClientReadTimeout:    cfg.Client.ReadTimeout,
		ClientBodyTimeout:    cfg.Client.BodyTimeout,
		ClientWriteTimeout:   cfg.Client.WriteTimeout,
		ClientIdleTimeout:    cfg.Client.IdleTimeout,
		MaxRequestHeaderSize: cfg.Client.MaxHeaderSize,
		MaxClientConns:       cfg.Client.MaxConns,
		DrainTimeout:         cfg.DrainTimeout,
		SharedPorts:          cfg.ReusePort,
	}
}

// cacheConfig maps the cache: section; lookupTimeout is the store's (0:
// the cache's default).
func cacheConfig(cfg *config.Config, lookupTimeout time.Duration) routing.CacheConfig {
	return routing.CacheConfig{
		Size: cfg.Cache.Size, NegativeSize: cfg.Cache.NegativeSize,
		TTLMin: cfg.Cache.TTLMin, TTLMax: cfg.Cache.TTLMax, NegativeTTL: cfg.Cache.NegativeTTL,
		LookupTimeout: lookupTimeout,
	}
}

// redisConfig is the Redis store's configuration, registry included.
func redisConfig(cfg *config.Config) redisstore.Config {
	rcfg := cfg.Redis
	rcfg.Registry = cfg.Registry
	return rcfg
}

// telemetryConfig maps the telemetry: section; getenv supplies the OTEL_*
// variables.
func telemetryConfig(cfg *config.Config, getenv func(string) string) telemetry.Config {
	return telemetry.Config{
		TraceSampleRatio: cfg.Telemetry.TraceSampleRatio, Env: getenv,
		ServiceName: "cubeproxy", ServiceVersion: appVersion(),
	}
}

// effective returns a copy of cfg in which every setting left unset holds
// the value the package that applies it uses instead: each package's own
// defaulting (WithDefaults, or the constant it applies to a zero value),
// never a copy of its numbers. getenv supplies the OTEL_* variables the
// trace sample ratio falls back to. Settings whose unset value means
// "off", "any" or "the library's choice" stay unset.
func effective(cfg *config.Config, getenv func(string) string) *config.Config {
	out := *cfg
	e := &out

	p := proxyConfig(cfg).WithDefaults()
	e.MaxRequestBody = p.MaxRequestBodySize
	e.Upstream.ConnectTimeout = p.ConnectTimeout
	e.Upstream.ResponseHeaderTimeout = p.ResponseHeaderTimeout
	e.Upstream.IdleTimeout = p.IdleStreamTimeout
	e.Upstream.HeartbeatInterval = p.HeartbeatInterval
	e.Upstream.MaxConns = p.MaxConnsPerUpstream
	e.Upstream.IdleConnTimeout = p.UpstreamIdleConnTimeout
	e.Upstream.MaxHeaderSize = p.UpstreamReadBufferSize
	e.MaxStreams = p.MaxStreamsPerSandbox
	e.StreamLimitWait = p.StreamLimitWait
	e.MaxHeldBody = p.MaxHeldBody
	e.HeldBodyBudget = p.HeldBodyBudget
	e.HeldBodyPerSandbox = p.HeldBodyPerSandbox
	e.Lifecycle.ResumeTimeout = p.ResumeTimeout

	s := serverConfig(cfg).WithDefaults()
	e.Client.ReadTimeout = s.ClientReadTimeout
	e.Client.BodyTimeout = s.ClientBodyTimeout
	e.Client.WriteTimeout = s.ClientWriteTimeout
	e.Client.IdleTimeout = s.ClientIdleTimeout
	e.Client.MaxHeaderSize = s.MaxRequestHeaderSize
	e.Client.MaxConns = s.MaxClientConns
	e.DrainTimeout = s.DrainTimeout

	c := cacheConfig(cfg, 0).WithDefaults()
	e.Cache.Size, e.Cache.NegativeSize = c.Size, c.NegativeSize
	e.Cache.TTLMin, e.Cache.TTLMax, e.Cache.NegativeTTL = c.TTLMin, c.TTLMax, c.NegativeTTL

	r := redisConfig(cfg).WithDefaults()
	e.Registry = r.Registry
	r.Registry = redisstore.RegistryConfig{}
	// Lists are shared with cfg; nothing here writes to them.
	e.Redis = r

	if e.AccessLog.BufferLines == 0 {
		e.AccessLog.BufferLines = accesslog.DefaultBufferLines
	}
	if e.HTTPSAddr != "" {
		// Without an HTTPS listener no source is in effect.
		if e.TLS.Source = tlsSource(e.TLS); e.TLS.Source == "" {
			e.TLS.Source = certs.SourceSelfSigned // certs' reading of ""
		}
	}
	// Only where the source in effect reads them: config refuses them
	// under another source, and check's output must load again.
	if src := tlsSource(e.TLS); e.TLS.ReloadInterval <= 0 && src == certs.SourceFiles {
		e.TLS.ReloadInterval = certs.DefaultReloadInterval
	}
	if src := tlsSource(e.TLS); e.TLS.ACME.OnDemandRate <= 0 && src == certs.SourceACME {
		e.TLS.ACME.OnDemandRate = certs.DefaultOnDemandRate
	}
	if ratio, err := telemetryConfig(cfg, getenv).SampleRatio(); err == nil {
		// An error is the start's to report (check does).
		e.Telemetry.TraceSampleRatio = ratio
	}
	return e
}

// shownDefaults is what serve -h names as each flag's default: the value
// a proxy started with no file, environment or flag uses.
func shownDefaults() *config.Config {
	return effective(config.Default(), func(string) string { return "" })
}
