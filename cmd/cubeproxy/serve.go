package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"time"

	"github.com/cube-sandbox/cubeproxy/config"
	"github.com/cube-sandbox/cubeproxy/proxy"
	"github.com/cube-sandbox/cubeproxy/routing"
)

// app is a wired proxy: store, cache, pipeline, admin API and server.
type app struct {
	cfg     *config.Config
	log     *slog.Logger
	routes  *routing.MemoryStore // nil with the Redis store
	cache   *routing.Cache
	proxy   *proxy.Proxy
	server  *proxy.Server
	httpLn  net.Listener
	adminLn net.Listener
}

// listening is told the bound addresses once the listeners are open (demo
// and tests use it to learn ports chosen with :0).
type listening func(a *app)

// serve loads the configuration, runs the proxy until ctx ends, then drains.
func serve(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer, ready listening) error {
	cfg, err := config.Load(args, getenv, stderr)
	if err != nil {
		return err
	}
	a, err := build(cfg, stdout)
	if err != nil {
		return err
	}
	return a.run(ctx, ready)
}

func newLogger(cfg *config.Config, w io.Writer) (*slog.Logger, error) {
	var level slog.Level
	if err := level.UnmarshalText([]byte(cfg.LogLevel)); err != nil {
		return nil, fmt.Errorf("log_level %q: %w", cfg.LogLevel, err)
	}
	opts := &slog.HandlerOptions{Level: level}
	switch cfg.LogFormat {
	case "json", "":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("log_format %q: want json or text", cfg.LogFormat)
}

// build wires everything and opens the listeners, so that a bad address
// fails at startup with a clear error.
func build(cfg *config.Config, logOut io.Writer) (*app, error) {
	log, err := newLogger(cfg, logOut)
	if err != nil {
		return nil, err
	}
	a := &app{cfg: cfg, log: log}

	var nodeIP netip.Addr
	if cfg.NodeIP != "" {
		if nodeIP, err = netip.ParseAddr(cfg.NodeIP); err != nil {
			return nil, fmt.Errorf("node_ip %q: %w", cfg.NodeIP, err)
		}
	}
	if err := proxy.CheckAdminAddr(cfg.AdminAddr, cfg.AdminToken); err != nil {
		return nil, err
	}

	var store routing.Store
	switch cfg.Store {
	case "memory", "":
		ms, err := loadRoutes(cfg.Routes, log)
		if err != nil {
			return nil, err
		}
		if cfg.PersistRoutes {
			if cfg.Routes == "" {
				return nil, errors.New("persist_routes needs a routes file")
			}
			ms.SetPersistPath(cfg.Routes)
		}
		a.routes, store = ms, ms
	default:
		return nil, fmt.Errorf("store %q: want memory or redis", cfg.Store)
	}

	a.cache, err = routing.NewCache(store, routing.CacheConfig{
		Size: cfg.Cache.Size, NegativeSize: cfg.Cache.NegativeSize,
		TTLMin: cfg.Cache.TTLMin, TTLMax: cfg.Cache.TTLMax, NegativeTTL: cfg.Cache.NegativeTTL,
	})
	if err != nil {
		return nil, err
	}

	instance := cfg.InstanceID
	if instance == "" {
		instance, _ = os.Hostname()
	}
	a.proxy, err = proxy.New(proxy.Config{
		NodeIP:                  nodeIP,
		Parser:                  routing.ParserConfig{Domains: cfg.Domains, SharedHosts: cfg.SharedHosts},
		MaxRequestBodySize:      cfg.MaxRequestBody,
		ConnectTimeout:          cfg.Upstream.ConnectTimeout,
		ResponseHeaderTimeout:   cfg.Upstream.ResponseHeaderTimeout,
		IdleStreamTimeout:       cfg.Upstream.IdleTimeout,
		HeartbeatInterval:       cfg.Upstream.HeartbeatInterval,
		MaxConnsPerUpstream:     cfg.Upstream.MaxConns,
		UpstreamIdleConnTimeout: cfg.Upstream.IdleConnTimeout,
		MaxStreamsPerSandbox:    cfg.MaxStreams,
		InstanceID:              instance,
		Logger:                  log,
	}, store, a.cache)
	if err != nil {
		return nil, err
	}
	admin := proxy.NewAdmin(proxy.AdminConfig{Token: cfg.AdminToken, Routes: a.routes}, a.proxy)
	a.server = proxy.NewServer(proxy.ServerConfig{
		ClientReadTimeout:    cfg.Client.ReadTimeout,
		ClientBodyTimeout:    cfg.Client.BodyTimeout,
		ClientWriteTimeout:   cfg.Client.WriteTimeout,
		ClientIdleTimeout:    cfg.Client.IdleTimeout,
		MaxRequestHeaderSize: cfg.Client.MaxHeaderSize,
		DrainTimeout:         cfg.DrainTimeout,
	}, a.proxy, admin)

	if a.httpLn, err = net.Listen("tcp", cfg.HTTPAddr); err != nil {
		return nil, fmt.Errorf("http listener: %w", err)
	}
	if a.adminLn, err = net.Listen("tcp", cfg.AdminAddr); err != nil {
		a.httpLn.Close()
		return nil, fmt.Errorf("admin listener: %w", err)
	}
	return a, nil
}

// loadRoutes opens the routes file; a missing file (the default path on a
// fresh checkout run from elsewhere) starts with an empty table.
func loadRoutes(path string, log *slog.Logger) (*routing.MemoryStore, error) {
	if path == "" {
		return routing.NewMemoryStore(), nil
	}
	ms, err := routing.LoadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		log.Warn("routes file not found; starting with an empty routing table", "path", path)
		return routing.NewMemoryStore(), nil
	}
	if err != nil {
		return nil, err
	}
	log.Info("routes loaded", "path", path, "count", len(ms.List()))
	return ms, nil
}

// run serves until ctx ends, then drains and returns.
func (a *app) run(ctx context.Context, ready listening) error {
	errc := make(chan error, 2)
	go func() { errc <- a.server.Serve(a.httpLn) }()
	go func() { errc <- a.server.ServeAdmin(a.adminLn) }()
	a.log.Info("cubeproxy listening",
		"http", a.httpLn.Addr().String(), "admin", a.adminLn.Addr().String(),
		"store", a.cfg.Store, "version", version)
	if ready != nil {
		ready(a)
	}
	var err error
	select {
	case <-ctx.Done():
	case err = <-errc:
		a.log.Error("listener failed", "err", err)
	}
	a.log.Info("shutting down: draining", "timeout", a.drainTimeout().String())
	if serr := a.server.Shutdown(context.Background()); serr != nil && err == nil {
		err = serr
	}
	a.log.Info("stopped")
	return err
}

func (a *app) drainTimeout() time.Duration {
	if a.cfg.DrainTimeout > 0 {
		return a.cfg.DrainTimeout
	}
	return 30 * time.Second
}
