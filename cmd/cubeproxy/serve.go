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
	"os/signal"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel"

	"github.com/cube-sandbox/cubeproxy/accesslog"
	"github.com/cube-sandbox/cubeproxy/auth"
	"github.com/cube-sandbox/cubeproxy/certs"
	"github.com/cube-sandbox/cubeproxy/config"
	"github.com/cube-sandbox/cubeproxy/internal/proclog"
	"github.com/cube-sandbox/cubeproxy/proxy"
	"github.com/cube-sandbox/cubeproxy/routing"
	"github.com/cube-sandbox/cubeproxy/routing/redisstore"
	"github.com/cube-sandbox/cubeproxy/telemetry"
)

// app is a wired proxy: store, cache, pipeline, admin API, listeners and
// everything that must be stopped in order.
type app struct {
	cfg      *config.Config
	log      *slog.Logger
	instance string

	tel      *telemetry.Telemetry
	access   *accesslog.Logger
	routes   *routing.MemoryStore // nil with the Redis store
	redis    *redisstore.Store    // nil with the memory store
	sub      *redisstore.Subscriber
	registry *redisstore.Registry
	reached  atomic.Bool            // the store answered at least once (readiness)
	unready  atomic.Pointer[string] // why the store has not answered yet (nil: no failed attempt)
	cache    *routing.Cache
	certs    *certs.Manager
	proxy    *proxy.Proxy
	server   *proxy.Server
	// shedder is proxy once built: the Redis store, opened before it,
	// dials (the readiness watch's lookups) from other goroutines.
	shedder atomic.Pointer[proxy.Proxy]
	// flushOverwrites says the routes file overwrites a warning's
	// spacing held back (persist_routes; nil otherwise).
	flushOverwrites func()

	httpLn, httpsLn, adminLn net.Listener
	metricsLn                net.Listener // nil: metrics_addr is off
	// listenFn opens each listener: listenTCP, or a test's wrapper that
	// sees which were opened (nil: listenTCP).
	listenFn func(ctx context.Context, addr string, reuse bool) (net.Listener, error)

	stopBackground context.CancelFunc

	// signals takes SIGHUP, SIGUSR1 and SIGUSR2 from before the access log
	// is opened (build) until run stops.
	signals chan os.Signal

	// reopening is set while a SIGHUP's reopen waits for the access log's
	// writer: a later SIGHUP joins it instead of leaving one more
	// goroutine behind a stalled sink, setting reopenAgain, so that the
	// goroutine reopens once more when its reopen is done. That reopen
	// may have opened the path before logrotate's rename (a SIGHUP storm,
	// a second logrotate configuration's postrotate): without the second
	// one, lines went on to the renamed file.
	reopening   atomic.Bool
	reopenAgain atomic.Bool
	// reopened, when set, is called after each successful reopen of the
	// access log (tests: it holds a reopen past its open).
	reopened func()
	// reopens is the reopen goroutine SIGHUP started, if any: close waits
	// for it once the access log's writer has ended.
	reopens sync.WaitGroup

	// loadConfig loads the configuration again as serve loaded it (same
	// flags and environment), for SIGHUP's check; nil where serve did not
	// build the app.
	loadConfig func() (*config.Config, error)
	// rechecks counts the SIGHUPs a configuration check has yet to
	// answer: one goroutine checks at a time, and checks again when a
	// SIGHUP came while it read (the file may have changed since), so a
	// burst reads the file once or twice, and an edit is never missed.
	rechecks atomic.Int64
	// checking is the check goroutine SIGHUP started, if any.
	checking sync.WaitGroup

	// flushBudget is the time close gives the access log and telemetry
	// to flush (0: defaultFlushBudget). Only tests set it, in the
	// listening callback: one of a stalled sink need not wait 5 s for it.
	flushBudget time.Duration
}

// defaultFlushBudget is the access log and telemetry's time at close.
const defaultFlushBudget = 5 * time.Second

// listening is told when the listeners are open (demo and tests use it to
// learn ports chosen with :0).
type listening func(a *app)

// serve loads the configuration, runs the proxy until ctx ends, then drains.
func serve(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer, ready listening) error {
	cfg, err := config.LoadCommandContext(ctx, "cubeproxy serve", shownDefaults(), args, getenv, stderr)
	if stoppedLoading(ctx, "cubeproxy serve", err, stderr) {
		return nil
	}
	if err != nil {
		return err
	}
	// A stdout nobody reads (a stalled log driver) must not hold requests
	// or the accept loop when they log: the process log is queued, and
	// what is queued is written before serve returns, startup errors and
	// the last "stopped" line included, waiting for a stalled stdout only
	// so long. Both logs write through a stdout the runtime's poller
	// serves, so that a stalled write parks their goroutine rather than
	// hold a thread and its processor, which with GOMAXPROCS=1 held every
	// request; closing it last cuts a write still waiting.
	out, closeOut := proclog.Pollable(stdout)
	defer closeOut()
	logOut := proclog.New(out, proclog.DefaultBufferBytes)
	defer logOut.Close(processLogFlushWait)
	a, err := build(ctx, cfg, logOut, out)
	if errors.Is(err, errStoppedStarting) {
		return nil
	}
	if err != nil {
		return cfg.NameOrigins(err)
	}
	a.loadConfig = func() (*config.Config, error) {
		cfg, err := config.LoadCommand("cubeproxy serve", shownDefaults(), args, getenv, io.Discard)
		if err != nil {
			return nil, err
		}
		if err := startRefusal(cfg); err != nil {
			return nil, cfg.NameOrigins(err)
		}
		return cfg, nil
	}
	a.tel.Metrics.SetProcessLogDropped(logOut.Dropped)
	logOut.ReportLossTo(a.log)
	warnUnknownEnv(a.log, os.Environ())
	if v := pushedMetricsExporter(getenv); v != "" {
		a.log.Warn(metricsExporterWarning, "OTEL_METRICS_EXPORTER", v)
	}
	return a.run(ctx, ready)
}

// metricsExporterWarning is said, by serve and check, of an
// OTEL_METRICS_EXPORTER that asks for a push (pushedMetricsExporter).
const metricsExporterWarning = "OTEL_METRICS_EXPORTER is not supported: metrics are only served for scraping at /metrics on the admin listener"

// pushedMetricsExporter returns OTEL_METRICS_EXPORTER when it names an
// exporter the proxy does not run (otlp, console), or "". Set
// cluster-wide with the other OTEL_* variables, it would otherwise look
// like a push that never arrives.
func pushedMetricsExporter(getenv func(string) string) string {
	if v := strings.ToLower(strings.TrimSpace(getenv("OTEL_METRICS_EXPORTER"))); v != "" && v != "none" && v != "prometheus" {
		return v
	}
	return ""
}

// processLogFlushWait is how long serve waits at exit for a stalled
// stdout to take the process log's last lines.
const processLogFlushWait = 2 * time.Second

// warnUnknownEnv logs each CUBEPROXY_* variable that names no setting.
// It reads the process environment, not getenv: only the list has the
// names nobody asked for. A warning, not an error: other tools put
// variables of their own under the prefix (deploy scripts, Kubernetes
// service links, which config.UnknownEnv leaves out).
func warnUnknownEnv(log *slog.Logger, environ []string) {
	for _, v := range config.UnknownEnv(environ) {
		if key := config.FileOnlySetting(v.Name); key != "" {
			log.Warn("unknown CUBEPROXY_ variable ignored", "name", v.Name, "file_only", key)
		} else if v.Nearest != "" {
			log.Warn("unknown CUBEPROXY_ variable ignored", "name", v.Name, "did_you_mean", v.Nearest)
		} else {
			log.Warn("unknown CUBEPROXY_ variable ignored", "name", v.Name)
		}
	}
}

// parsed is what build derives from the settings before it starts
// anything; cubeproxy check stops there.
type parsed struct {
	log      *slog.Logger
	instance string
	nodeIP   netip.Addr
	exempt   []uint16
	signer   *auth.Signer // nil without auth.signing_keys
}

// parseSettings checks and converts the settings that need no file,
// socket or server, so that build and check refuse the same values.
func parseSettings(cfg *config.Config, logOut io.Writer) (ps parsed, err error) {
	if ps.log, err = newLogger(cfg, logOut); err != nil {
		return ps, err
	}
	ps.instance = cfg.InstanceID
	if ps.instance == "" {
		ps.instance, _ = os.Hostname()
	}
	if cfg.NodeIP != "" {
		if ps.nodeIP, err = netip.ParseAddr(cfg.NodeIP); err != nil {
			return ps, fmt.Errorf("node_ip %q: %w", cfg.NodeIP, err)
		}
	}
	if err := proxy.CheckAdminAddr(cfg.AdminAddr, cfg.AdminToken); err != nil {
		return ps, err
	}
	if err := auth.CheckAdminToken(cfg.AdminToken); err != nil {
		return ps, err
	}
	if err := proxyConfig(cfg).CheckHeldBodies(); err != nil {
		return ps, err
	}
	if ps.exempt, err = ports(cfg.Auth.ExemptPorts); err != nil {
		return ps, err
	}
	if len(cfg.Auth.SigningKeys) > 0 {
		if ps.signer, err = auth.NewSigner(cfg.Auth.SigningKeys); err != nil {
			return ps, fmt.Errorf("auth.signing_keys: %w", err)
		}
	}
	return ps, nil
}

// startRefusal is what a start would refuse in cfg beyond config's own
// checks, short of reading the files it names or opening anything: the
// verdict of SIGHUP's look at the file, and what FuzzStartupSettings runs
// over and over. Without it, a file edited into one whose start fails
// (log_level: verbose, a non-loopback admin_addr without a token) was
// reported as changed, to be applied by a restart.
func startRefusal(cfg *config.Config) error {
	if _, err := parseSettings(cfg, io.Discard); err != nil {
		return err
	}
	if err := checkAccessLogFormat(cfg.AccessLog.Format); err != nil {
		return err
	}
	switch cfg.Store {
	case "memory", "":
	case "redis":
		if err := redisConfig(cfg).WithDefaults().Validate(); err != nil {
			return fmt.Errorf("open Redis: %w", err) // as openStore says it
		}
	default:
		return fmt.Errorf("store %q: want memory or redis", cfg.Store)
	}
	if _, err := routing.NewCache(routing.NewMemoryStore(), cacheConfig(cfg, routing.DefaultLookupTimeout)); err != nil {
		return err
	}
	return checkListeners(cfg)
}

func newLogger(cfg *config.Config, w io.Writer) (*slog.Logger, error) {
	var level slog.Level
	if err := level.UnmarshalText([]byte(cfg.LogLevel)); err != nil {
		return nil, fmt.Errorf("log_level %q: want debug, info, warn or error (%w)", cfg.LogLevel, err)
	}
	switch cfg.LogLevel { // config spells the four words in lower case
	case "debug", "info", "warn", "error":
	default:
		// slog also reads a level with an offset (info+1, debug-4): one
		// above info hid the "cubeproxy listening" line, and nothing said
		// why the log stayed silent.
		return nil, fmt.Errorf("log_level %q: want debug, info, warn or error (a level with an offset, as slog reads it, is not taken)", cfg.LogLevel)
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

// errStoppedStarting is build's error when a signal (ctx's end) cut the
// start short: serve and demo then return nil, as after a drain.
var errStoppedStarting = errors.New("stopped by a signal before serving")

// stoppedLoading reports whether err, from loading a serving command's
// configuration, is a signal's (ctx's end) cutting short the wait for a
// config file that is a pipe, and says so on stderr: a stop before serving,
// exit 0, as one during the rest of the start. Without it the read took
// no notice of the signal, and main's signal handling had taken SIGTERM's
// and SIGINT's default action away: the process waited on, deaf to both,
// until a SIGKILL.
func stoppedLoading(ctx context.Context, command string, err error, stderr io.Writer) bool {
	if err == nil || ctx.Err() == nil || !errors.Is(err, ctx.Err()) {
		return false
	}
	fmt.Fprintf(stderr, "%s: signal during startup: stopped before serving (interrupted: %v)\n", command, err)
	return true
}

// build wires everything and opens the listeners, so that a bad setting
// or address fails at startup with a clear error. On error, whatever was
// started is stopped. The process log goes to logOut, an access log whose
// path is stdout ("" or "-") to stdout.
func build(ctx context.Context, cfg *config.Config, logOut, stdout io.Writer) (_ *app, err error) {
	ps, err := parseSettings(cfg, logOut)
	if err != nil {
		return nil, err
	}
	log := ps.log
	a := &app{cfg: cfg, log: log, instance: ps.instance}
	defer func() {
		if err != nil {
			if a.server != nil {
				// Never served, it stops at once: without this its janitor
				// and hang-up watcher (an epoll descriptor) outlived every
				// failed start of an in-process run.
				_ = a.server.Shutdown(context.Background())
			}
			a.close()
			if ctx.Err() != nil {
				// SIGTERM or SIGINT while starting (resolving a listener's
				// host name, waiting for ACME's certificates or for the
				// storage lock another replica holds): a stop the operator
				// asked for, not a failed start. Reported as the listener's
				// or the CA's failure, with exit 1, it sent the operator
				// looking for a fault, and a supervisor counted one. Not
				// errors.Is(err, context.Canceled) alone: certmagic's lock
				// wait formats the cancellation away (%v). What the start
				// was doing is kept in the line.
				log.Info("signal during startup: stopped before serving", "interrupted", err.Error())
				err = errStoppedStarting
			}
		}
	}()

	// The SDK reports a failed export through this process-wide handler,
	// whose default writes plain-text lines among the JSON ones.
	otel.SetErrorHandler(otelErrorHandler{newThrottledLog(log, "telemetry", time.Now)})
	// The SDK's own log says when it ignored an OTEL_EXPORTER_OTLP_* value
	// it could not use (a CA file missing, a timeout or headers that do not
	// parse), which it does at error level only. Its default logger wrote
	// that as plain text to stderr, among the JSON lines and untagged.
	otel.SetLogger(logr.FromSlogHandler(log.With("component", "telemetry").Handler()))
	tcfg := telemetryConfig(cfg, nil) // nil: the process environment
	tcfg.InstanceID = a.instance
	a.tel, err = telemetry.New(ctx, tcfg)
	if err != nil {
		return nil, fmt.Errorf("telemetry: %w", err)
	}
	// Watched from before the access log is opened: a rotation while the
	// start still waits (an ACME sync, a Redis slow to answer) renamed the
	// file, and its signal, dropped until run watched it, left every line
	// going to the renamed file until the next rotation. Queued now, it is
	// taken once serving (run's loop).
	// Room for one of each, so that a SIGUSR2 waiting does not crowd out
	// logrotate's signal. Until Notify, main ignores SIGHUP; where nothing
	// does (tests), one would end the process (Go's runtime drops an
	// unwatched SIGUSR1 or 2).
	a.signals = make(chan os.Signal, 3)
	signal.Notify(a.signals, syscall.SIGHUP, sigReopen, sigUpgrade)
	if err := a.openAccessLog(stdout); err != nil {
		return nil, err
	}
	// Before the store: its readiness watch and the Redis subscriber run
	// until close cancels bg.
	bg, stop := context.WithCancel(context.Background())
	a.stopBackground = stop
	store, lookupTimeout, err := a.openStore(bg)
	if err != nil {
		return nil, err
	}
	a.cache, err = routing.NewCache(store, cacheConfig(cfg, lookupTimeout))
	if err != nil {
		return nil, err
	}
	pcfg := proxyConfig(cfg)
	pcfg.NodeIP, pcfg.Signer, pcfg.ExemptPorts = ps.nodeIP, ps.signer, ps.exempt
	pcfg.Telemetry, pcfg.AccessLog, pcfg.InstanceID, pcfg.Logger = a.tel, a.access, a.instance, log
	a.proxy, err = proxy.New(pcfg, a.cache)
	if err != nil {
		return nil, err
	}
	a.shedder.Store(a.proxy)
	if a.redis != nil {
		// Through the proxy, not straight to the cache: it forgets the
		// pause of a sandbox whose route was removed.
		a.sub = a.redis.Subscribe(bg, a.proxy, log)
		sub := a.sub
		// Only the log said that an instance applied no invalidation
		// (an ACL without the channel); the scrape says it too.
		a.tel.Metrics.SetInvalidationStats(func() telemetry.InvalidationStats {
			return telemetry.InvalidationStats{Subscribed: sub.Subscribed(), Subscriptions: sub.Subscriptions(), Messages: sub.Applied()}
		})
	}
	adminCfg := proxy.AdminConfig{
		Token:           cfg.AdminToken,
		Routes:          a.routes,
		Metrics:         a.tel.MetricsHandler(),
		MetricsLoopback: cfg.Telemetry.MetricsLoopback,
		Signer:          ps.signer,
		Ready:           a.ready,
		Pprof:           cfg.AdminPprof,
	}
	if a.redis != nil {
		adminCfg.Publish = a.publish
	}
	adminCfg.CertificatesReady = a.certificatesReady
	// a.registry is set below, before run serves the admin listener.
	adminCfg.Heartbeat = func() int64 { return a.registry.LastBeat() }
	a.server = proxy.NewServer(serverConfig(cfg), a.proxy, proxy.NewAdmin(adminCfg, a.proxy))

	// A SIGTERM or SIGINT while the store loaded (a large routes file
	// parses for seconds, ignoring ctx) stops the start here: opened, the
	// listeners took connections and "cubeproxy ready" was logged by a
	// process about to drain, which a reuse_port takeover took for the
	// new one. The deferred check above turns this into a stop.
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("before opening the listeners: %w", err)
	}
	if err := a.listen(ctx); err != nil {
		return nil, err
	}
	if cfg.ReusePort {
		warnTakeover(log)
	}
	if a.redis != nil && cfg.Registry.Enabled {
		// After listen: the entry names the admin listener's address,
		// unless the operator named the URL it is reached at. Its
		// warnings only with the registry on: earlier builds warned every
		// Redis-store proxy on the default loopback admin_addr of an
		// announcement it never made.
		announced := cfg.Registry.AdminURL
		if announced == "" {
			announced = adminURL(a.adminLn.Addr(), cfg.NodeIP)
			warnLoopbackAdmin(log, a.adminLn.Addr())
		}
		a.registry, err = a.redis.StartRegistry(redisstore.Instance{
			ProxyID: a.instance, AdminURL: announced,
			NodeIP: cfg.NodeIP, StartedAt: time.Now(), Version: appVersion(),
		}, log)
		if err != nil {
			return nil, fmt.Errorf("registry: %w", err)
		}
		warnSlowHeartbeat(log, cfg.Registry.Interval)
	}
	return a, nil
}

// managerExpiry is how long the platform's lifecycle manager waits for a
// proxy's next heartbeat before it takes the proxy for gone.
const managerExpiry = 15 * time.Second

// warnSlowHeartbeat warns of a registry.interval at or over the lifecycle
// manager's expiry: the manager would drop the proxy between beats and,
// at each beat, take it for a new one and replay its whole registry to
// it (every sandbox's metadata), for as long as it runs.
func warnSlowHeartbeat(log *slog.Logger, interval time.Duration) {
	if interval >= managerExpiry {
		log.Warn("registry.interval is at or over the platform lifecycle manager's heartbeat expiry: it will drop this proxy between beats and replay its registry to it at each one; keep it under 15s",
			"interval", interval.String(), "expiry", managerExpiry.String())
	}
}

// warnLoopbackAdmin warns when the registry announces an admin API that
// listens on loopback only (the default admin_addr, 127.0.0.1:8082): a
// lifecycle manager on another host that finds this proxy in the registry
// reaches its own host's loopback there, and its pushes fail or land on
// another proxy.
func warnLoopbackAdmin(log *slog.Logger, addr net.Addr) {
	if tcp, ok := addr.(*net.TCPAddr); ok && tcp.IP.IsLoopback() {
		log.Warn("the registry announces an admin API on a loopback address: only a lifecycle manager on this host reaches it; for one elsewhere listen on the node's address (admin_addr) with an admin_token",
			"admin_url", "http://"+addr.String())
	}
}

// openAccessLog opens the access log, unless its format is off; a path
// of "" or "-", or a name of stdout (/dev/stdout), is stdout.
func (a *app) openAccessLog(stdout io.Writer) error {
	cfg := a.cfg.AccessLog
	if err := checkAccessLogFormat(cfg.Format); err != nil || cfg.Format == "off" {
		return err
	}
	acfg := accesslog.Config{Format: cfg.Format, Path: cfg.Path, BufferLines: cfg.BufferLines, Log: a.log,
		OnCloseFailure: a.tel.Metrics.AccessLogCloseFailed, OnTruncate: a.tel.Metrics.AccessLogTruncated}
	if accesslog.NamesStdout(acfg.Path) {
		acfg.Output = stdout
	}
	var err error
	a.access, err = accesslog.New(acfg, a.tel.Metrics.AccessLogDropped)
	return err
}

// checkAccessLogFormat refuses a format the access log does not write.
func checkAccessLogFormat(format string) error {
	switch format {
	case "off", "", accesslog.FormatJSON, accesslog.FormatCube:
		return nil
	}
	return fmt.Errorf("access_log.format %q: want json, cube or off", format)
}

// shedIdle closes idle sandbox connections for a Redis dial that found no
// descriptor (redisstore.Config.OnShortage), as a sandbox connect does;
// none before the proxy is built.
func (a *app) shedIdle() int {
	if p := a.shedder.Load(); p != nil {
		return p.ShedIdle()
	}
	return 0
}

// openStore opens the route store cfg.store names, instrumented, and the
// lookup timeout the cache should use with it (0: the cache's default).
// The Redis store's readiness watch runs until bg ends.
func (a *app) openStore(bg context.Context) (_ routing.Store, lookupTimeout time.Duration, err error) {
	cfg := a.cfg
	switch cfg.Store {
	case "memory", "":
		if a.routes, err = openRoutes(cfg, a.log); err != nil {
			return nil, 0, err
		}
		if cfg.PersistRoutes {
			a.removeStaleTemps()
			warn, flush := overwriteWarning(a.log, time.Now, func(d time.Duration, f func()) { time.AfterFunc(d, f) })
			a.routes.OnOverwrite(warn)
			a.flushOverwrites = flush
		}
		a.reached.Store(true)
		return proxy.InstrumentStore(a.routes, a.tel.Metrics, telemetry.StoreMemory), 0, nil
	case "redis":
		rcfg := redisConfig(cfg)
		rcfg.Logger = a.log
		rcfg.OnShortage = a.shedIdle
		redis.SetLogger(redisLogger{newThrottledLog(a.log, "redis", time.Now)})
		if a.redis, err = redisstore.Open(rcfg); err != nil {
			// err names the redis settings at fault. Not "route store:",
			// which NameOrigins reads as the store setting's refusal.
			return nil, 0, fmt.Errorf("open Redis: %w", err)
		}
		go a.watchReachable(bg)
		// The cache's own bound would otherwise cut a longer command_timeout short.
		lookupTimeout = rcfg.WithDefaults().CommandTimeout
		return proxy.InstrumentStore(reachStore{a.redis, &a.reached}, a.tel.Metrics, telemetry.StoreRedis), lookupTimeout, nil
	}
	return nil, 0, fmt.Errorf("store %q: want memory or redis", cfg.Store)
}

// ready is /readyz's check: the route store has answered at least once.
// Its words hold for a store that refuses as for one that is down: "never
// been reachable" sent an operator whose Redis answered NOPERM, or a
// Cluster without slots, to look at the network.
func (a *app) ready() error {
	if a.reached.Load() {
		return nil
	}
	if why := a.unready.Load(); why != nil {
		return errors.New("no route read from the store has succeeded yet: " + *why)
	}
	return errors.New("no route read from the store has succeeded yet")
}

// readyPoll is how often run looks whether the proxy has become ready
// (sayReady) until it has.
const readyPoll = 100 * time.Millisecond

// sayReady logs "cubeproxy ready" and reports true once /readyz's checks
// pass (ready, certificatesReady).
func (a *app) sayReady() bool {
	if a.ready() != nil || a.certificatesReady() != nil {
		return false
	}
	a.log.Info("cubeproxy ready", "instance", a.instance)
	return true
}

// certificatesReady is /readyz's check of the HTTPS listener: acme
// without sync starts before its wildcard is obtained, and a load balancer
// sending HTTPS there meanwhile got failed handshakes from a ready node.
// The certificates are loaded after the admin config is built, hence the
// nil check.
func (a *app) certificatesReady() error {
	if a.certs == nil {
		return nil
	}
	return a.certs.Ready()
}

// publish tells the other proxy instances to drop id's cached route. The
// admin request that changed the route waits on it, within
// redis.command_timeout (Store.Publish), as a lookup does: a second of its
// own cut a longer command timeout short, and every admin change answered
// 503 invalidation_not_published from a Redis that served the lookups
// (TestRedisLongCommandTimeoutIsThePublishBudget).
func (a *app) publish(id string) error {
	return a.redis.Publish(context.Background(), id)
}

// listen loads the certificates and opens the listeners, so that a port
// in use or a certificate that cannot load fails the start.
func (a *app) listen(ctx context.Context) (err error) {
	cfg := a.cfg
	if err := checkListeners(cfg); err != nil {
		return err
	}
	if cfg.HTTPSAddr != "" {
		if a.certs, err = certs.New(ctx, a.certsConfig()); err != nil {
			return err // certs names itself ("tls certificates: ...")
		}
		a.warnUncoveredDomains(a.certs.Covers)
		a.tel.Metrics.SetCertExpiry(a.certs.EarliestExpiry)
	}
	if cfg.ReusePort {
		// Every address is bound first, none listened on: a listener on
		// a port the running proxy shares takes connections at once, and
		// a start that failed on a later address closed it over them.
		var addrs [][2]string
		for _, ka := range [][2]string{{"https_addr", cfg.HTTPSAddr}, {"http_addr", cfg.HTTPAddr},
			{"admin_addr", cfg.AdminAddr}, {"metrics_addr", cfg.MetricsAddr}} {
			if ka[1] != "" {
				addrs = append(addrs, ka)
			}
		}
		release, err := reservePorts(addrs)
		if err != nil {
			return err
		}
		// Held until every listener is open: they share the ports.
		defer release()
	}
	open := a.listenFn
	if open == nil {
		open = listenTCP
	}
	if cfg.HTTPSAddr != "" {
		if a.httpsLn, err = open(ctx, cfg.HTTPSAddr, cfg.ReusePort); err != nil {
			return listenError("https_addr", cfg.HTTPSAddr, cfg.ReusePort, err)
		}
	}
	if cfg.HTTPAddr != "" {
		if a.httpLn, err = open(ctx, cfg.HTTPAddr, cfg.ReusePort); err != nil {
			return listenError("http_addr", cfg.HTTPAddr, cfg.ReusePort, err)
		}
	}
	if a.adminLn, err = open(ctx, cfg.AdminAddr, cfg.ReusePort); err != nil {
		return listenError("admin_addr", cfg.AdminAddr, cfg.ReusePort, err)
	}
	if cfg.MetricsAddr != "" {
		if a.metricsLn, err = open(ctx, cfg.MetricsAddr, cfg.ReusePort); err != nil {
			return listenError("metrics_addr", cfg.MetricsAddr, cfg.ReusePort, err)
		}
	}
	return nil
}

// listenError names the setting whose listener could not open, as every
// other startup error does, and for a port in use how to pick another (for
// a privileged one, what it needs):
// "http listener: listen tcp :8081: bind: address already in use" left
// a newcomer whose demo met another server on 8081 to find the flag.
// reuse is whether the listener was opened with reuse_port: a port in use
// then, or one a reuse_port proxy holds, is a takeover that failed, and
// "stop it" would have the operator stop the proxy serving the node.
func listenError(key, addr string, reuse bool, err error) error {
	err = fmt.Errorf("%s %q: %w", key, addr, err)
	if start := unprivilegedPortStart(unprivilegedPortFile); errors.Is(err, syscall.EACCES) && privilegedPort(addr, start) {
		return fmt.Errorf("%w (a port below %d needs root or the CAP_NET_BIND_SERVICE capability; or choose a port from %d up)", err, start, start)
	}
	if errors.Is(err, syscall.EADDRINUSE) {
		// The three keys are top-level: their flag and variable are the key respelled.
		flagName, env := "--"+strings.ReplaceAll(key, "_", "-"), config.EnvPrefix+strings.ToUpper(key)
		switch {
		case reuse:
			return fmt.Errorf("%w (the process there listens without reuse_port, or is another user's: a port is shared only by processes of one user that all set it; or choose another address with %s or %s)", err, flagName, env)
		case portShared(addr):
			return fmt.Errorf("%w (a process started with reuse_port listens there: set reuse_port here too (--reuse-port, %sREUSE_PORT) to start beside it; or choose another address with %s or %s)", err, config.EnvPrefix, flagName, env)
		}
		return fmt.Errorf("%w (another process listens there: stop it, or choose another address with %s or %s)", err, flagName, env)
	}
	return err
}

// privilegedPort reports whether addr's port is one of those below start
// (unprivilegedPortStart) that only root (or CAP_NET_BIND_SERVICE) may bind.
func privilegedPort(addr string, start int) bool {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	p, err := net.LookupPort("tcp", port)
	return err == nil && p > 0 && p < start
}

// unprivilegedPortFile is Linux's net.ipv4.ip_unprivileged_port_start, for
// the process's network namespace.
const unprivilegedPortFile = "/proc/sys/net/ipv4/ip_unprivileged_port_start"

// unprivilegedPortStart is the lowest port any user may bind, read from
// path (unprivilegedPortFile): 1024 by default, but raised or lowered per
// network namespace (0 in Docker's containers). 1024, the traditional
// bound, where path cannot be read (other systems).
func unprivilegedPortStart(path string) int {
	b, err := os.ReadFile(path)
	if err != nil {
		return 1024
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || n < 0 {
		return 1024
	}
	return n
}

// checkListeners refuses listener settings this system or the TLS
// settings could not honour.
func checkListeners(cfg *config.Config) error {
	if cfg.ReusePort && !reusePortSupported {
		return errors.New("reuse_port is supported on Linux only")
	}
	if cfg.TLS.RedirectHTTP && cfg.HTTPSAddr == "" {
		// Proxying instead would serve in plain HTTP what the operator
		// meant to close to it.
		return errors.New("tls.redirect_http needs https_addr: there is no HTTPS listener to redirect to")
	}
	if cfg.TLS.RedirectHTTP && cfg.HTTPAddr == "" {
		// Only the plain-HTTP listener redirects: the operator expects
		// http:// to be sent to HTTPS, and nothing would answer it.
		return errors.New("tls.redirect_http is on but http_addr is empty: no plain-HTTP listener would redirect; set http_addr (CUBEPROXY_HTTP_ADDR, for example :8081), or remove tls.redirect_http")
	}
	if cfg.TLS.RedirectPort != 0 && !cfg.TLS.RedirectHTTP {
		// Only redirects name the port: an operator who set it alone
		// would expect plain HTTP to redirect, and it would be proxied.
		return errors.New("tls.redirect_port is set but tls.redirect_http is off: nothing would be redirected; set tls.redirect_http: true (CUBEPROXY_TLS_REDIRECT_HTTP=true), or remove tls.redirect_port")
	}
	if cfg.HTTPSAddr != "" && cfg.TLS.ACME.OnDemand && len(certDomains(cfg)) == 0 {
		// allowCertificate would have no domain to hold names to.
		return errors.New("tls.acme.on_demand is on but tls.domain and domains are empty: no name could be told to be a sandbox's; set tls.domain (CUBEPROXY_TLS_DOMAIN) or domains, which say which names may get a certificate")
	}
	return nil
}

// warnUncoveredDomains warns about each entry of domains whose sandbox
// hosts no certificate names: they are routed, but over HTTPS they get
// the default certificate of another name (files) or a failed handshake
// (acme manages *.<tls.domain> only), which otherwise shows only as
// clients' TLS errors. A warning, not a refusal: such a domain may be
// meant for plain HTTP alone. covers is the certificates' Covers (check
// has no Manager for acme).
func (a *app) warnUncoveredDomains(covers func(host string) bool) {
	for _, d := range a.cfg.Domains {
		d = strings.TrimPrefix(strings.ToLower(strings.Trim(d, ". ")), "*.")
		if d == "" {
			continue
		}
		// A sandbox host is one label more: <port>-<id>.<domain>.
		if !covers("1-x." + d) {
			a.log.Warn("tls: no certificate names the sandbox hosts of a domain; HTTPS clients will refuse them (add a certificate for *.<domain>, or with acme set tls.domain to it or enable tls.acme.on_demand)",
				"domain", d, "source", tlsSource(a.cfg.TLS))
		}
	}
	a.warnUncoveredSharedHosts(covers)
}

// warnUncoveredSharedHosts warns, as warnUncoveredDomains does, about each
// entry of shared_hosts no certificate names: over HTTPS it got the
// default certificate of another name (files) or a failed handshake
// (acme), unsaid. On-demand issuance never serves one (it names sandbox
// hosts only), so under acme only the managed names count.
func (a *app) warnUncoveredSharedHosts(covers func(host string) bool) {
	if tlsSource(a.cfg.TLS) == certs.SourceACME {
		c := a.certsConfig()
		c.ACME.OnDemand = false
		covers = func(host string) bool { return certs.ACMECovers(c, host) }
	}
	for _, h := range a.cfg.SharedHosts {
		h = strings.ToLower(strings.Trim(h, ". "))
		if _, err := netip.ParseAddr(strings.Trim(h, "[]")); h == "" || err == nil {
			continue // an IP literal: clients send no SNI and get the default certificate
		}
		if !covers(h) {
			a.log.Warn("tls: no certificate names a shared host; HTTPS clients will refuse it (add a certificate that names it; acme manages only <tls.domain> and the names one label below it)",
				"host", h, "source", tlsSource(a.cfg.TLS))
		}
	}
}

// certsConfig maps the tls: section; on-demand issuance asks the route
// cache, so unknown sandboxes never reach the CA.
func (a *app) certsConfig() certs.Config {
	t := a.cfg.TLS
	c := certs.Config{
		Source: t.Source, Domain: t.Domain, ReloadInterval: t.ReloadInterval, Logger: a.log,
		ACME: certs.ACMEConfig{
			CA: t.ACME.CA, Email: t.ACME.Email, TrustedRootsFile: t.ACME.TrustedRootsFile, StorageDir: t.ACME.StorageDir,
			SkipWildcard: t.ACME.SkipWildcard, OnDemand: t.ACME.OnDemand, OnDemandRate: t.ACME.OnDemandRate, Sync: t.ACME.Sync,
			DNS: certs.DNSConfig{
				Provider: t.ACME.DNS.Provider, Options: t.ACME.DNS.Options, Resolvers: t.ACME.DNS.Resolvers,
				PropagationTimeout: t.ACME.DNS.PropagationTimeout, PropagationDelay: t.ACME.DNS.PropagationDelay,
			},
		},
		Allow:      a.allowCertificate,
		ListenAddr: a.cfg.HTTPSAddr, // TLS-ALPN-01 is answered there
	}
	if t.CertFile != "" || t.KeyFile != "" {
		c.Files = append(c.Files, certs.FilePair{CertFile: t.CertFile, KeyFile: t.KeyFile, Setting: "tls"})
	}
	for i, f := range t.Files {
		c.Files = append(c.Files, certs.FilePair{CertFile: f.CertFile, KeyFile: f.KeyFile, Setting: fmt.Sprintf("tls.files[%d]", i)})
	}
	c.Source = tlsSource(t)
	return c
}

// tlsSource is the certificate source in effect: tls.source, or, unset,
// files when certificate files are named and otherwise "" (which certs
// serves as self_signed).
func tlsSource(t config.TLS) string {
	if t.Source == "" && (t.CertFile != "" || t.KeyFile != "" || len(t.Files) > 0) {
		return certs.SourceFiles
	}
	return t.Source
}

// allowCertificate permits on-demand issuance only for the canonical name
// (<port>-<id>, no leading zeros) of an exposed port of an existing
// sandbox, under tls.domain or one of domains. Anything looser lets a
// client choose what the proxy orders: any name pointed at the node (with
// an empty domains list), or 050005-… spellings of one port, each a new
// certificate that spends the CA's rate limits and the on-demand budget.
// On the node that runs the sandbox every port at SandboxIP is exposed
// (as for a request), so there a port the route does not map is allowed
// only while it accepts a connection (probeSandboxPort): else one known
// sandbox id would let anyone order 1-<id>, 2-<id>, … The sweep of
// certs asks this too, so such a name whose port closed is dropped from
// memory (it stays in storage and is loaded again when allowed).
//
// A name that is no sandbox's port, or no listening one, wraps
// certs.ErrUnknownName (the client gets the unrecognized_name alert, and
// certs takes no budget: it does after Allow); a route store that cannot
// answer does not (internal_error: the name may well be right).
func (a *app) allowCertificate(ctx context.Context, name string) error {
	domains := certDomains(a.cfg)
	if len(domains) == 0 {
		return errors.New("no domain configured") // the parser would take any
	}
	var t routing.Target
	parser := routing.NewParser(routing.ParserConfig{Domains: domains})
	if err := parser.Parse(&t, []byte(name), nil); err != nil {
		return fmt.Errorf("%w: not a sandbox host: %w", certs.ErrUnknownName, err)
	}
	if t.Shared {
		return fmt.Errorf("%w: not a sandbox host", certs.ErrUnknownName)
	}
	label, _, _ := strings.Cut(name, ".")
	if canonical := strconv.Itoa(int(t.Port)) + "-" + string(t.ID()); !strings.EqualFold(label, canonical) {
		return fmt.Errorf("%w: %s is not the canonical name %s", certs.ErrUnknownName, label, canonical)
	}
	if len(label) > 63 || strings.IndexByte(label, '_') >= 0 {
		// Sandbox ids may be longer than a DNS label and hold '_': no CA
		// issues for such a name, and every attempt would place an order
		// (retried for minutes) and hold the client's handshake.
		return fmt.Errorf("%w: %s is not a DNS label: no certificate can name it", certs.ErrUnknownName, label)
	}
	// As proxy's Config.NodeIP (config checks it is an address).
	node, _ := netip.ParseAddr(a.cfg.NodeIP)
	node = node.Unmap()
	r, res, err := a.cache.Get(ctx, t.ID())
	if err == nil && res == routing.CacheHit && !exposes(r, t.Port, node) {
		// A port exposed since the route was cached, as for a request.
		r, _, err = a.cache.Refresh(ctx, t.ID(), r)
	}
	var fe *routing.FieldError
	if errors.Is(err, routing.ErrNotFound) || errors.As(err, &fe) {
		return fmt.Errorf("%w: %w", certs.ErrUnknownName, err)
	}
	if err != nil {
		return err
	}
	if !exposes(r, t.Port, node) {
		return fmt.Errorf("%w: port %d not exposed", certs.ErrUnknownName, t.Port)
	}
	if _, mapped := r.HostPort(t.Port); !mapped {
		// Exposed only by the on-node rule (every port at SandboxIP): every
		// port of a known id would pass, and 1-<id>, 2-<id>, … would each
		// spend the budget and the CA's quota for the domain. Refused
		// here, before certs takes from the budget. A paused sandbox
		// accepts nothing, but its name must still reach a request, which
		// resumes it or is told to retry (TestAllowCertificatePausedOnThisNode):
		// allowed while the pause lasts, unprobed.
		if a.proxy != nil && a.proxy.Paused(string(t.ID())) {
			return nil
		}
		return a.probeSandboxPort(ctx, netip.AddrPortFrom(r.SandboxIP, t.Port))
	}
	return nil
}

// maxCertProbeTimeout bounds allowCertificate's connect to an unmapped
// port: it runs inside the client's handshake.
const maxCertProbeTimeout = time.Second

// probeSandboxPort allows the certificate of an on-node sandbox's unmapped
// port only while something accepts connections there: one connect,
// closed at once. Refused or timed out, the name wraps
// certs.ErrUnknownName; it gets its certificate at a later handshake, once
// the sandbox listens.
func (a *app) probeSandboxPort(ctx context.Context, addr netip.AddrPort) error {
	timeout := maxCertProbeTimeout
	if ct := a.cfg.Upstream.ConnectTimeout; ct > 0 && ct < timeout {
		timeout = ct
	}
	d := net.Dialer{Timeout: timeout}
	c, err := d.DialContext(ctx, "tcp", addr.String())
	if err != nil {
		return fmt.Errorf("%w: nothing accepts connections at %s: %w", certs.ErrUnknownName, addr, err)
	}
	_ = c.Close()
	return nil
}

// exposes reports whether a request for the container port reaches r's
// sandbox, as the proxy chooses its backend: on node (this node) every
// port at SandboxIP, elsewhere the ports r maps.
func exposes(r *routing.Route, port uint16, node netip.Addr) bool {
	if r.OnNode(node) {
		return r.SandboxIP.IsValid()
	}
	_, ok := r.HostPort(port)
	return ok
}

// adminURL is where other hosts reach the admin API: a wildcard listen
// address ("[::]:8082" for admin_addr ":8082") names no host, so the
// node's IP stands in for it (or the hostname when node_ip is unset).
func adminURL(addr net.Addr, nodeIP string) string {
	tcp, ok := addr.(*net.TCPAddr)
	if !ok || !tcp.IP.IsUnspecified() {
		return "http://" + addr.String()
	}
	host := nodeIP
	if host == "" {
		host, _ = os.Hostname()
	}
	return "http://" + net.JoinHostPort(host, strconv.Itoa(tcp.Port))
}

// certDomains lists the domains on-demand certificates may be issued
// under: tls.domain and domains, without blank entries.
func certDomains(cfg *config.Config) []string {
	var out []string
	for _, d := range append([]string{cfg.TLS.Domain}, cfg.Domains...) {
		if strings.Trim(d, " .*") != "" {
			out = append(out, d)
		}
	}
	return out
}

// watchReachable reads a route from Redis until it has answered once, for
// /readyz. A lookup rather than a PING: a wrong password fails both, but an
// ACL user that may PING and not read the route keys would otherwise be
// ready to answer every request 503. Each new reason is logged, since an
// unready proxy gets no traffic whose errors would show it.
func (a *app) watchReachable(ctx context.Context) {
	var last string
	for !a.reached.Load() {
		_, err := a.redis.Lookup(ctx, readinessProbeID)
		var fe *routing.FieldError
		if err == nil || errors.Is(err, routing.ErrNotFound) || errors.As(err, &fe) {
			a.reached.Store(true)
			return
		}
		if ctx.Err() != nil {
			return
		}
		if why := err.Error(); sameReason(why) != last {
			last = sameReason(why)
			a.unready.Store(&why)
			a.log.Error("route store not usable; /readyz stays 503 until it answers", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Second):
		}
	}
}

// hostPort matches an address with a port, as errors name the server.
var hostPort = regexp.MustCompile(`[^\s,;()]+:\d+\b`)

// timestamp matches an RFC 3339 time, as Go's x509 errors name the time of
// the check ("current time 2026-12-07T06:53:31Z is after ...").
var timestamp = regexp.MustCompile(`\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)?`)

// sameReason is why with every address and time blanked out: the reasons
// of one outage that differ only in the server they name or when they were
// met. With every seed of a Cluster down, go-redis reports the error of a
// seed it picks at random, and watchReachable logged the same outage about
// once a second (TestRedisUnreadyReasonLoggedOnceAcrossAddresses), as it
// did a Redis whose certificate had expired, each probe's error naming
// its own second (TestRedisUnreadyReasonLoggedOnceAcrossTimes).
func sameReason(why string) string {
	return hostPort.ReplaceAllString(timestamp.ReplaceAllString(why, "TIME"), "ADDR")
}

// readinessProbeID is the sandbox id watchReachable looks up; any answer,
// "not found" included, proves routes can be read.
const readinessProbeID = "cubeproxy-readiness-probe"

// reachStore marks the store reachable on any answer from it.
type reachStore struct {
	routing.Store
	reached *atomic.Bool
}

func (s reachStore) Lookup(ctx context.Context, id string) (*routing.Route, error) {
	r, err := s.Store.Lookup(ctx, id)
	if err == nil || errors.Is(err, routing.ErrNotFound) {
		s.reached.Store(true)
	}
	return r, err
}

func ports(in []int) ([]uint16, error) {
	out := make([]uint16, 0, len(in))
	for _, p := range in {
		if p < 1 || p > 65535 {
			return nil, fmt.Errorf("auth.exempt_ports: %d is not a port", p)
		}
		out = append(out, uint16(p))
	}
	return out, nil
}

// openRoutes loads the memory store's routes file and, with
// persist_routes, checks that it can be rewritten and has it rewritten.
func openRoutes(cfg *config.Config, log *slog.Logger) (*routing.MemoryStore, error) {
	routes, err := loadRoutes(cfg.Routes, log)
	if err != nil {
		return nil, err
	}
	if cfg.PersistRoutes {
		if cfg.Routes == "" {
			return nil, errors.New("persist_routes is on but routes is empty: admin route changes would be written nowhere; set routes (CUBEPROXY_ROUTES, for example configs/routes.yaml), or remove persist_routes")
		}
		if err := routing.CheckPersistPath(cfg.Routes); err != nil {
			return nil, fmt.Errorf("persist_routes: %w", err)
		}
		routes.SetPersistPath(cfg.Routes)
	}
	return routes, nil
}

// overwriteWarnEvery spaces the warnings of routes file overwrites: two
// processes persisting to one file overwrite each other at every write,
// up to hundreds a second for a small table.
const overwriteWarnEvery = 10 * time.Second

// overwriteWarning returns the memory store's OnOverwrite: a warning that
// a write replaced a routes file changed since this process loaded or
// last wrote it, at most one per overwriteWarnEvery, with the count of
// overwrites since the previous one. Overwrites held back by that spacing
// are said by afterFunc (time.AfterFunc) once it is up, not only with the
// next overwrite: the last hand edit written over within 10 s of a
// warning was otherwise never said to be gone. flush says the ones held
// back at once: at the stop, which the timer does not outlive.
func overwriteWarning(log *slog.Logger, now func() time.Time, afterFunc func(time.Duration, func())) (warn func(path string), flush func()) {
	// The store calls from one write at a time, but the timer's call
	// comes from its own goroutine.
	var mu sync.Mutex
	var last time.Time
	unsaid := 0
	armed := false
	var path string // of the unsaid ones
	say := func(t time.Time) {
		log.Warn("routes file changed since this process loaded or last wrote it (edited by hand, or another process persisting to it?): an admin change wrote the running table over it, and what was changed there is gone",
			"routes", path, "overwrites", unsaid)
		last, unsaid = t, 0
	}
	sayHeld := func() {
		mu.Lock()
		defer mu.Unlock()
		if unsaid > 0 {
			say(now())
		}
	}
	warn = func(p string) {
		mu.Lock()
		defer mu.Unlock()
		unsaid++
		path = p
		t := now()
		if last.IsZero() || t.Sub(last) >= overwriteWarnEvery {
			say(t)
			return
		}
		if armed {
			return
		}
		armed = true
		afterFunc(last.Add(overwriteWarnEvery).Sub(t), func() {
			mu.Lock()
			armed = false
			mu.Unlock()
			sayHeld()
		})
	}
	return warn, sayHeld
}

// staleTempAge is how old a routes file's temporary file must be for the
// start to remove it: a reuse_port predecessor still running may be
// writing a younger one, and even a 64 MiB table is written and renamed
// well within it.
const staleTempAge = time.Minute

// removeStaleTemps removes the temporary files that rewrites of the routes
// file interrupted by a crash left beside it. Only serve does: check
// changes nothing. A file that cannot be removed is logged, not fatal:
// the proxy works with it there.
func (a *app) removeStaleTemps() {
	removed, err := routing.RemoveStaleTemps(a.cfg.Routes, staleTempAge)
	for _, p := range removed {
		a.log.Info("stale temporary routes file removed (left by a write a crash interrupted)", "path", p)
	}
	if err != nil {
		a.log.Warn("stale temporary routes files left in place", "err", err)
	}
}

// loadRoutes opens the routes file; a missing file (the default path when
// run from elsewhere) starts with an empty table.
func loadRoutes(path string, log *slog.Logger) (*routing.MemoryStore, error) {
	if path == "" {
		return routing.NewMemoryStore(), nil
	}
	ms, err := routing.LoadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		// A relative path is taken in the working directory, which under
		// a service manager (systemd's is /) is seldom the one the
		// operator has in mind: the absolute path says where it looked.
		abs, aerr := filepath.Abs(path)
		if aerr != nil {
			abs = path
		}
		log.Warn("routes file not found; starting with an empty routing table", "setting", "routes", "path", path, "abs_path", abs)
		return routing.NewMemoryStoreOfMissingFile(path), nil
	}
	if err != nil {
		return nil, err
	}
	log.Info("routes loaded", "path", path, "count", len(ms.List()))
	return ms, nil
}

// run serves until ctx ends, then drains and stops everything in order.
func (a *app) run(ctx context.Context, ready listening) error {
	// build watches SIGHUP and SIGUSR1 (logrotate) from before the access
	// log opens, so that one sent while starting reaches the loop below.
	hup := a.signals
	defer signal.Stop(hup)
	errc := make(chan error, 4)
	// Every listener is the proxy's own before any serves (Server.Claim).
	a.server.Claim(a.httpLn, a.httpsLn, a.adminLn, a.metricsLn)
	if a.httpLn != nil {
		ln := a.httpLn
		if a.cfg.TLS.RedirectHTTP && a.httpsLn != nil {
			_, port, _ := net.SplitHostPort(a.httpsLn.Addr().String())
			if a.cfg.TLS.RedirectPort > 0 {
				// Behind a load balancer or port mapping clients reach
				// another port than the one the proxy listens on.
				port = strconv.Itoa(a.cfg.TLS.RedirectPort)
			}
			go func() { errc <- a.server.ServeRedirect(ln, port) }()
		} else {
			go func() { errc <- a.server.Serve(ln) }()
		}
	}
	if a.httpsLn != nil {
		go func() { errc <- a.server.ServeTLS(a.httpsLn, a.certs.TLSConfig()) }()
	}
	go func() { errc <- a.server.ServeAdmin(a.adminLn) }()
	if a.metricsLn != nil {
		go func() { errc <- a.server.ServeMetrics(a.metricsLn) }()
	}
	a.log.Info("cubeproxy listening",
		"http", addrOf(a.httpLn), "https", addrOf(a.httpsLn), "admin", addrOf(a.adminLn), "metrics", addrOf(a.metricsLn),
		"store", a.cfg.Store, "instance", a.instance, "version", appVersion())
	if ready != nil {
		ready(a)
	}
	// "cubeproxy listening" comes before the route store has answered (or,
	// with acme, before the wildcard is loaded): a takeover that stopped
	// the old process at that line, as earlier READMEs said, left a new one
	// with a wrong Redis password answering every request 503. What
	// /readyz checks is logged once as "cubeproxy ready".
	var readyTick <-chan time.Time
	if !a.sayReady() {
		t := time.NewTicker(readyPoll)
		defer t.Stop()
		readyTick = t.C
	}

	var err error
loop:
	for {
		select {
		case <-ctx.Done():
			break loop
		case <-readyTick:
			if a.sayReady() {
				readyTick = nil
			}
		case sig := <-hup:
			a.onSignal(sig)
		case err = <-errc:
			if err == nil {
				continue
			}
			a.log.Error("listener failed", "err", err)
			break loop
		}
	}
	// Watch for a second signal before saying the drain began: one sent
	// on seeing that line must not be lost.
	drainCtx, cutShort := a.cutDrainOnSignal()
	stopSignals := a.signalsDuringDrain(hup)
	a.log.Info("shutting down: draining", "timeout", a.server.Config().DrainTimeout.String())
	var certsClosed chan struct{}
	if a.certs != nil {
		// With the drain: a handshake waiting on an on-demand order
		// holds its connection, and the drain waited for it up to
		// drain_timeout. The listeners close now, so no handshake needs
		// a certificate the cache does not already hold. Beside the
		// drain, not before it: Close cancels the orders at once but
		// then waits (up to 5 s) for certmagic to release its storage
		// locks, and an order deleting its DNS-01 record does so on a
		// context of its own, so the listeners stayed open and /readyz
		// ready for those 5 s after the signal.
		certsClosed = make(chan struct{})
		go func() {
			defer close(certsClosed)
			if cerr := a.certs.Close(); cerr != nil {
				a.log.Warn("closing certificates", "err", cerr)
			}
		}()
	}
	if serr := a.server.Shutdown(drainCtx); serr != nil && err == nil {
		err = serr
	}
	if certsClosed != nil {
		<-certsClosed
	}
	cutShort()
	// Before close, which waits for the reopens: one begun during that
	// wait would race it, and open a file close never flushes.
	stopSignals()
	if a.flushOverwrites != nil {
		// The admin listener is closed: no write comes after this.
		a.flushOverwrites()
	}
	a.close()
	a.log.Info("stopped")
	return err
}

// onSignal acts on a SIGHUP, SIGUSR1 or SIGUSR2 (see run).
func (a *app) onSignal(sig os.Signal) {
	name := "SIGHUP"
	switch sig {
	case sigUpgrade:
		// nginx's binary upgrade. Silent, it let an operator go on to
		// SIGQUIT the old master: a stack dump here, every stream cut.
		a.log.Warn("SIGUSR2: no binary upgrade here (nginx's USR2); start the new binary beside this one with reuse_port, then SIGTERM this one (SIGQUIT is no graceful stop)")
		return
	case sigReopen:
		// nginx's reopen of its log files, what the logrotate
		// configurations of its packages send. No reload signal: no
		// configuration check.
		name = "SIGUSR1"
	default:
		a.recheckConfig()
	}
	if a.access == nil {
		return
	}
	if accesslog.NamesStdout(a.cfg.AccessLog.Path) {
		// No file to reopen: "access log reopened" said a rotation took
		// effect where nothing was done.
		a.log.Info(name + ": the access log writes to stdout: nothing to reopen")
		return
	}
	if !a.reopening.CompareAndSwap(false, true) {
		a.reopenAgain.Store(true)
		a.log.Warn(name + ": the access log's last reopen is still waiting for its writer (a stalled sink?); the file will be reopened again once it is done")
		return
	}
	// Reopen waits for the writer, which a stalled sink holds
	// indefinitely: waiting here would leave SIGTERM unheard.
	a.reopens.Go(a.reopenAccessLog)
}

// signalsDuringDrain goes on acting on sigs (SIGHUP, SIGUSR1, SIGUSR2)
// while the drain runs, and returns the function that stops, before
// close. logrotate does not wait for a drain: unheard, its signal left
// the drain's lines (up to drain_timeout of them, every cut stream's)
// in the renamed file, which a compress without delaycompress deletes,
// and no file at the configured path until the successor's own reopen.
func (a *app) signalsDuringDrain(sigs <-chan os.Signal) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case sig := <-sigs:
				a.onSignal(sig)
			case <-done:
				return
			}
		}
	})
	return func() {
		close(done)
		wg.Wait()
	}
}

// cutDrainOnSignal returns a context that a SIGTERM or SIGINT arriving
// during the drain cancels, and the function that stops watching. As in
// nginx's fast shutdown, signalling again means "stop now": the drain
// deadline comes at once, so what is still open is cut, answered and
// logged, and the access log and telemetry are flushed, which a SIGKILL
// would lose.
func (a *app) cutDrainOnSignal() (context.Context, func()) {
	ctx, cancel := context.WithCancel(context.Background())
	again := make(chan os.Signal, 1)
	signal.Notify(again, syscall.SIGTERM, os.Interrupt)
	done := make(chan struct{})
	go func() {
		defer close(done)
		select {
		case sig := <-again:
			a.log.Warn("signal during the drain: cutting the drain short", "signal", sig.String())
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, func() {
		signal.Stop(again)
		cancel()
		<-done
	}
}

// recheckConfig reads the configuration file again on SIGHUP, in a
// goroutine of its own, and says when a reload would have changed
// something: SIGHUP is nginx's reload signal, and here it reopens the
// access log and applies nothing else. Said nothing, an operator who
// edited the file and sent it (or ran nginx -s reload's equivalent) took
// "access log reopened" for a reload that never happened, and found out
// at the next restart, by then with settings unseen since the edit (or a
// file that no longer loads, failing that start). A pipe (--config
// <(...)) is read once, at start: it is not read again. The memory
// store's routes file is looked at too (checkRoutes), with or without a
// configuration file.
func (a *app) recheckConfig() {
	path := a.cfg.File()
	if a.loadConfig == nil || path == "" && a.routes == nil || a.rechecks.Add(1) > 1 {
		return
	}
	a.checking.Go(func() {
		for {
			n := a.rechecks.Load()
			if path != "" {
				a.checkConfig(path)
			}
			a.checkRoutes()
			if a.rechecks.CompareAndSwap(n, 0) {
				return
			}
		}
	})
}

// checkConfig is one of recheckConfig's checks of the file at path.
func (a *app) checkConfig(path string) {
	if fi, err := os.Stat(path); err == nil && !fi.Mode().IsRegular() {
		return
	}
	cfg, err := a.loadConfig()
	if err != nil {
		a.log.Warn("SIGHUP: the configuration file no longer loads, so a restart would fail; SIGHUP reloads nothing (it reopens the access log), the running configuration stays",
			"config", path, "err", err)
		return
	}
	if keys := a.cfg.Changed(cfg); len(keys) > 0 {
		a.log.Warn("SIGHUP: the configuration file changed since start; SIGHUP reloads nothing (it reopens the access log): restart, or start a reuse_port successor, to apply it",
			"config", path, "changed", keys)
	}
}

// checkRoutes is SIGHUP's look at the routes file (store: memory), as
// checkConfig's at the configuration file: the store reads it once, at
// start, so an operator who edited it and sent nginx's reload signal took
// silence for a reload, and with persist_routes the next admin change
// wrote the running table over the edit. It compares the file's inode,
// size and time with what the store loaded or last wrote, and its bytes
// only when those differ; it parses nothing (a table at the limit takes
// seconds and a gigabyte to parse).
func (a *app) checkRoutes() {
	if a.routes == nil {
		return
	}
	path, changed := a.routes.FileChanged()
	if !changed {
		return
	}
	msg := "SIGHUP: the routes file changed since this process loaded it; SIGHUP reloads nothing, so its routes are not served until a restart: change routes through the admin API"
	if a.cfg.PersistRoutes {
		msg = "SIGHUP: the routes file changed since this process loaded or last wrote it; SIGHUP reloads nothing, so its routes are not served, and the next admin route change writes the running table over it: change routes through the admin API"
	}
	a.log.Warn(msg, "routes", path)
}

// reopenAccessLog reopens the access log file (SIGHUP, after logrotate),
// and again while a signal came during the last reopen (reopenAgain).
func (a *app) reopenAccessLog() {
	for {
		a.reopenAgain.Store(false)
		if !a.reopenOnce() {
			a.reopening.Store(false)
			return
		}
		if a.reopenAgain.Load() {
			continue
		}
		a.reopening.Store(false)
		// A signal between the look above and the store joined this
		// goroutine as it ended: take it up, unless a new signal's
		// goroutine already did.
		if !a.reopenAgain.Load() || !a.reopening.CompareAndSwap(false, true) {
			return
		}
	}
}

// reopenOnce reopens the access log file once, and reports false when the
// log is closed (the stop came first: nothing failed, nothing to reopen).
func (a *app) reopenOnce() bool {
	err := a.access.Reopen()
	if errors.Is(err, accesslog.ErrClosed) {
		return false
	}
	if err != nil {
		a.tel.Metrics.AccessLogReopenFailed()
		a.log.Error("reopen access log", "err", err)
		return true
	}
	if a.reopened != nil {
		a.reopened()
	}
	a.log.Info("access log reopened")
	return true
}

// close stops everything build started, in dependency order.
func (a *app) close() {
	if a.signals != nil {
		signal.Stop(a.signals) // a start that failed never ran
	}
	if a.registry != nil {
		// One Redis command's budget of its own: a Redis that hangs must not
		// use up the time the access log and telemetry need below (go-redis
		// retries the pipeline until its context ends).
		rctx, rcancel := context.WithTimeout(context.Background(), a.cfg.Redis.WithDefaults().CommandTimeout)
		if err := a.registry.Stop(rctx); err != nil {
			a.log.Warn("registry cleanup", "err", err)
		}
		rcancel()
	}
	// The access log and telemetry's budget starts after the cleanup, or
	// a command timeout as long as it would leave them nothing.
	budget := a.flushBudget
	if budget == 0 {
		budget = defaultFlushBudget
	}
	ctx, cancel := context.WithTimeout(context.Background(), budget)
	defer cancel()
	if a.sub != nil {
		_ = a.sub.Close()
	}
	if a.stopBackground != nil {
		a.stopBackground()
	}
	if a.cache != nil {
		a.cache.Close()
	}
	if a.redis != nil {
		_ = a.redis.Close()
	}
	if a.certs != nil {
		_ = a.certs.Close()
	}
	if a.access != nil {
		done := make(chan struct{})
		go func() { _ = a.access.Close(); close(done) }()
		closed := true
		select {
		case <-done:
		case <-ctx.Done():
			a.log.Warn("access log sink stalled at shutdown; lines may be lost")
			// Its file is closed under the stalled write, so that the
			// writer ends rather than hold it and write to it after serve
			// returned. A second is plenty for a write that can be cut; a
			// write the kernel holds (a frozen file system) is not, and
			// Abandon says the access log's closing line itself then.
			closed = a.access.Abandon(time.Second)
			if closed {
				select {
				case <-done:
				case <-time.After(time.Second):
					closed = false
				}
			}
		}
		if closed {
			// A reopen still waiting was refused when the writer ended.
			a.reopens.Wait()
		}
	}
	if a.tel != nil {
		// Said at every shutdown: the export warnings are throttled, and
		// the last spans lost here would otherwise go unmentioned.
		if err := a.tel.Shutdown(ctx); err != nil {
			a.log.Warn("telemetry not flushed at shutdown; spans may be lost", "component", "telemetry", "err", err)
		}
	}
	for _, ln := range []net.Listener{a.httpLn, a.httpsLn, a.adminLn, a.metricsLn} {
		if ln != nil {
			ln.Close()
		}
	}
	// A check still reading the file logs to the process log, which
	// serve closes after this.
	a.checking.Wait()
}

func addrOf(ln net.Listener) string {
	if ln == nil {
		return ""
	}
	return ln.Addr().String()
}
