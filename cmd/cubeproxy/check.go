package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"strings"
	"syscall"

	"github.com/cube-sandbox/cubeproxy/accesslog"
	"github.com/cube-sandbox/cubeproxy/certs"
	"github.com/cube-sandbox/cubeproxy/config"
	"github.com/cube-sandbox/cubeproxy/routing"
	"github.com/cube-sandbox/cubeproxy/routing/redisstore"
	"go.opentelemetry.io/otel"
)

// redacted stands in for a secret in check's output.
const redacted = "REDACTED"

// check implements `cubeproxy check`, the proxy's `nginx -t`: it loads
// the configuration as serve does (file, environment, flags: the same
// flags, hence a subcommand that takes serve's rather than a flag of
// serve's own), refuses what serve would refuse at startup, loads the
// routes file and the TLS files named, and prints the effective
// configuration, secrets redacted, on stdout. It opens no listener and
// talks to neither Redis nor an ACME CA: run before a restart, it must
// not disturb the proxy that is running.
func check(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	cfg, err := config.LoadCommand("cubeproxy check", shownDefaults(), args, getenv, stderr)
	if err != nil {
		return err
	}
	// What the OTel SDK reports while the settings are read (a bad percent
	// escape in OTEL_RESOURCE_ATTRIBUTES) is said as check's other notes
	// are: its default handler printed a bare, time-stamped line.
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
		fmt.Fprintf(stderr, "cubeproxy: note: telemetry: %v (serve logs this as a warning and starts)\n", err)
	}))
	summary, instance, err := checkSettings(ctx, cfg, getenv, stderr)
	if err != nil {
		return cfg.NameOrigins(err)
	}
	eff := effective(cfg, getenv)
	eff.InstanceID = instance // the hostname when unset
	out, err := redact(eff).NotedYAML(checkNotes(cfg, getenv))
	if err != nil {
		return fmt.Errorf("print configuration: %w", err)
	}
	if _, err := stdout.Write(out); err != nil {
		return err
	}
	fmt.Fprintf(stderr, "cubeproxy check: configuration ok; %s\n", strings.Join(summary, "; "))
	// serve would log these as warnings; a failed check has run() note them.
	noteUnknownEnv(stderr, os.Environ())
	if v := pushedMetricsExporter(getenv); v != "" {
		fmt.Fprintf(stderr, "cubeproxy: note: %s (OTEL_METRICS_EXPORTER=%s; serve logs this as a warning and starts)\n", metricsExporterWarning, v)
	}
	return nil
}

// checkNotes are the comments check writes beside a setting it prints that
// does not apply, keyed by the setting: traces off (the default, or
// OTEL_TRACES_SAMPLER=always_off), telemetry.trace_sample_ratio still read
// 0.01 as if 1 % of requests were traced.
func checkNotes(cfg *config.Config, getenv func(string) string) map[string]string {
	notes := map[string]string{}
	if why := telemetryConfig(cfg, getenv).TracesOff(); why != "" {
		notes["telemetry.trace_sample_ratio"] = "not used: traces are off (" + why + ")"
	}
	return notes
}

// checkSettings runs what build runs up to the first side effect that
// matters to a running proxy: a listener, a Redis connection, an ACME
// order. Its log (a missing routes file's warning) goes to logOut. It
// returns one line per thing it loaded, and the instance id in effect.
func checkSettings(ctx context.Context, cfg *config.Config, getenv func(string) string, logOut io.Writer) (summary []string, instance string, err error) {
	ps, err := parseSettings(cfg, logOut)
	if err != nil {
		return nil, "", err
	}
	if err := telemetryConfig(cfg, getenv).Check(); err != nil {
		return nil, "", fmt.Errorf("telemetry: %w", err)
	}
	if err := checkAccessLogFormat(cfg.AccessLog.Format); err != nil {
		return nil, "", err
	}
	if cfg.AccessLog.Format != "off" {
		if err := accesslog.CheckPath(cfg.AccessLog.Path); err != nil {
			return nil, "", err
		}
	}
	var lookupTimeout = routing.DefaultLookupTimeout
	switch cfg.Store {
	case "memory", "":
		routes, err := openRoutes(cfg, ps.log)
		if err != nil {
			return nil, "", err
		}
		summary = append(summary, fmt.Sprintf("%d routes in %q", len(routes.List()), cfg.Routes))
	case "redis":
		// go-redis connects on the first command: building the client
		// checks the settings and reads ca_file without reaching Redis.
		rcfg := redisConfig(cfg)
		client, err := redisstore.NewClient(rcfg)
		if err != nil {
			return nil, "", fmt.Errorf("open Redis: %w", err) // as serve says it
		}
		_ = client.Close()
		lookupTimeout = rcfg.WithDefaults().CommandTimeout
		summary = append(summary, "redis store (not contacted)")
	default:
		return nil, "", fmt.Errorf("store %q: want memory or redis", cfg.Store)
	}
	if _, err := routing.NewCache(routing.NewMemoryStore(), cacheConfig(cfg, lookupTimeout)); err != nil {
		return nil, "", err
	}
	if err := checkListeners(cfg); err != nil {
		return nil, "", err
	}
	if err := checkListenHosts(cfg); err != nil {
		return nil, "", err
	}
	if cfg.HTTPSAddr != "" {
		line, err := checkCerts(ctx, &app{cfg: cfg, log: ps.log})
		if err != nil {
			return nil, "", err
		}
		summary = append(summary, line)
	}
	return summary, ps.instance, nil
}

// checkCerts loads the certificates the HTTPS listener would serve: the
// files, or a self-signed one. ACME is checked short of the CA. A domain
// no certificate names is warned about as serve warns at start.
func checkCerts(ctx context.Context, a *app) (string, error) {
	ccfg := a.certsConfig()
	if ccfg.Source == certs.SourceACME {
		if err := certs.CheckACME(ccfg); err != nil {
			return "", err // certs names itself ("tls certificates: ...")
		}
		a.warnUncoveredDomains(func(host string) bool { return certs.ACMECovers(ccfg, host) })
		return "acme (CA not contacted)", nil
	}
	m, err := certs.New(ctx, ccfg)
	if err != nil {
		return "", err // certs names itself ("tls certificates: ...")
	}
	a.warnUncoveredDomains(m.Covers)
	_ = m.Close()
	if ccfg.Source == certs.SourceFiles {
		return fmt.Sprintf("%d certificate files loaded", len(ccfg.Files)), nil
	}
	return "self-signed certificate", nil
}

// redact returns a copy of cfg whose secrets read REDACTED: the admin
// token, signing keys, Redis passwords (the URL's too) and the DNS
// provider's secret options. check's output goes to terminals and CI logs.
func redact(cfg *config.Config) *config.Config {
	out := *cfg
	c := &out
	if c.AdminToken != "" {
		c.AdminToken = redacted
	}
	if len(c.Auth.SigningKeys) > 0 {
		keys := make([]string, len(c.Auth.SigningKeys))
		for i := range keys {
			keys[i] = redacted
		}
		c.Auth.SigningKeys = keys
	}
	if c.Redis.Password != "" {
		c.Redis.Password = redacted
	}
	if c.Redis.Sentinel.Password != "" {
		c.Redis.Sentinel.Password = redacted
	}
	if c.Redis.URL != "" {
		if u, err := url.Parse(c.Redis.URL); err == nil {
			if _, ok := u.User.Password(); ok {
				u.User = url.UserPassword(u.User.Username(), redacted)
			} else if u.User != nil {
				// A lone name: redis-cli -u reads it as the password.
				u.User = url.User(redacted)
			}
			c.Redis.URL = u.String()
		} else {
			c.Redis.URL = redacted // unparsable: it may hold anything
		}
	}
	if opts := c.TLS.ACME.DNS.Options; len(opts) > 0 {
		c.TLS.ACME.DNS.Options = make(map[string]string, len(opts))
		for k, v := range opts {
			if secretOption(k) {
				v = redacted
			}
			c.TLS.ACME.DNS.Options[k] = v
		}
	}
	return c
}

// secretOption reports whether a DNS provider option holds a credential
// (rfc2136's key_secret; a file's path is not one).
func secretOption(key string) bool {
	k := strings.ToLower(key)
	if strings.HasSuffix(k, "_file") {
		return false
	}
	for _, w := range []string{"secret", "password", "token", "key"} {
		if strings.Contains(k, w) && k != "key_name" && k != "key_alg" {
			return true
		}
	}
	return false
}

// checkListenHosts refuses a listener address whose host serve's bind
// would refuse: a name that does not resolve, or an address this machine
// does not have (a node's http_addr copied to another node's file). It
// takes the address Listen would take and binds a UDP socket to port 0 of
// it, which the kernel refuses for the same reasons, so no TCP listener is
// opened and no port taken: a port in use is still found only by serve.
func checkListenHosts(cfg *config.Config) error {
	for _, l := range []struct{ key, addr string }{
		{"http_addr", cfg.HTTPAddr}, {"https_addr", cfg.HTTPSAddr}, {"admin_addr", cfg.AdminAddr},
		{"metrics_addr", cfg.MetricsAddr},
	} {
		host, _, err := net.SplitHostPort(l.addr)
		if err != nil {
			continue // empty (off); Validate judged the form
		}
		ta, err := net.ResolveTCPAddr("tcp", l.addr)
		if err != nil {
			return fmt.Errorf("%s %q: %w", l.key, l.addr, err)
		}
		if host != "" { // a wildcard is every machine's
			c, err := net.ListenUDP("udp", &net.UDPAddr{IP: ta.IP, Zone: ta.Zone})
			if err != nil {
				var oe *net.OpError // "listen udp" would only puzzle
				if errors.As(err, &oe) {
					err = oe.Err
				}
				return fmt.Errorf("%s %q: %s cannot be bound on this machine (is it one of its addresses?): %w", l.key, l.addr, ta.IP, err)
			}
			_ = c.Close()
		}
		if err := checkPortAllowed(l.key, l.addr, ta); err != nil {
			return err
		}
	}
	return nil
}

// checkPortAllowed refuses a privileged port (below
// net.ipv4.ip_unprivileged_port_start, 1024 by default) that this process
// may not bind, as serve's bind would: a non-root user with http_addr :80
// passed check and then failed to start (and :1500 did, under a sysctl
// raised to 2000, while check looked below 1024 only). The kernel applies one rule to
// TCP and UDP, so binding the UDP port tells without taking the TCP one;
// only EACCES counts, since something else may well use the UDP port
// (QUIC on 443) while the TCP port is free.
func checkPortAllowed(key, addr string, ta *net.TCPAddr) error {
	if ta.Port == 0 || ta.Port >= unprivilegedPortStart(unprivilegedPortFile) {
		return nil
	}
	c, err := net.ListenUDP("udp", &net.UDPAddr{IP: ta.IP, Port: ta.Port, Zone: ta.Zone})
	if err == nil {
		return c.Close()
	}
	if !errors.Is(err, syscall.EACCES) {
		return nil // in use, or anything else: found by serve's bind
	}
	// Worded as serve's failed bind, hint included.
	return listenError(key, addr, false, &net.OpError{Op: "listen", Net: "tcp", Addr: ta, Err: os.NewSyscallError("bind", syscall.EACCES)})
}
