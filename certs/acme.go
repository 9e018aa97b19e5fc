package certs

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/mail"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/certmagic"
	"github.com/mholt/acmez/v3"
	"github.com/mholt/acmez/v3/acme"
	"go.uber.org/zap"
	"golang.org/x/net/idna"

	"github.com/cube-sandbox/cubeproxy/internal/namedfile"
)

// acmeSource wires certmagic with its own Cache and Configs (never the
// package globals). Two Configs share the cache and storage:
//
//   - managed obtains *.<domain> and <domain> at start and renews them from
//     the cache's background maintenance;
//   - onDemand (optional) obtains certificates during handshakes for names
//     the wildcard does not cover, after Config.Allow and the rate limiter
//     agreed; certmagic renews those when they are used.
//
// They are separate because certmagic defers every managed name of a Config
// with OnDemand set to handshakes, and because on-demand maintenance of the
// wildcard would be keyed by the client's hostname.
type acmeSource struct {
	log          *slog.Logger
	domain       string // lower-case, no trailing dot
	defaultName  string // "*.<domain>", or "" when the wildcard is skipped
	managedNames []string
	allow        func(ctx context.Context, name string) error
	limiter      *windowLimiter
	failures     *failureBackoff

	// ctx ends at close: handshakes waiting on an on-demand order (or on
	// certmagic's retry of a failed one) give up then, rather than hold
	// the connection, and with it the drain, for certmagic's 180 s.
	ctx context.Context

	// obtained is set once the default certificate was in memory.
	obtained atomic.Bool

	cache    *certmagic.Cache
	managed  *certmagic.Config
	onDemand *certmagic.Config // nil when on-demand is off
	locks    *lockGate
	cancel   context.CancelFunc

	// cached and sweeping: on-demand certificates in memory, and the
	// goroutine that drops those of names no longer a sandbox's.
	cached   cachedNames
	sweeping sync.WaitGroup
}

func newACMESource(ctx context.Context, cfg Config, log *slog.Logger) (*acmeSource, error) {
	a := cfg.ACME
	s := &acmeSource{
		log:    log,
		domain: strings.ToLower(strings.Trim(cfg.Domain, ".")),
		allow:  cfg.Allow,
	}
	if err := validateACME(cfg, s.domain); err != nil {
		return nil, err
	}
	if err := checkStorageDir(a.StorageDir); err != nil {
		return nil, err
	}
	if !a.SkipWildcard {
		s.defaultName = "*." + s.domain
		s.managedNames = []string{s.defaultName, s.domain}
	}
	rate := a.OnDemandRate
	if rate <= 0 {
		rate = DefaultOnDemandRate
	}
	s.limiter = newWindowLimiter(rate)
	s.failures = newFailureBackoff()

	zl := newZapLogger(log)
	issuer, err := issuerTemplate(a, cfg.ListenAddr, zl)
	if err != nil {
		return nil, err
	}
	bg, cancel := context.WithCancel(context.WithoutCancel(ctx))
	s.ctx, s.cancel = bg, cancel
	if issuer.DNS01Solver != nil {
		issuer.DNS01Solver = closingSolver{Solver: issuer.DNS01Solver, closed: bg}
	}
	s.cache = certmagic.NewCache(certmagic.CacheOptions{GetConfigForCert: s.configForCert, Logger: zl})
	base := certmagic.Config{
		Logger:  zl,
		Issuers: []certmagic.Issuer{}, // non-nil: keeps certmagic from building a default issuer
		OnEvent: s.onEvent,
		// The events onEvent acts on. certmagic documents that a false
		// skips OnEvent for the event (v0.25 consults it only for
		// tls_get_certificate, the one it sends per handshake), so every
		// event onEvent reads is listed, not only the one on a hot path.
		ShouldEmitFunc: func(event string) bool {
			return event == "cert_obtaining" || event == "cert_failed" || event == "cert_obtained" ||
				event == "cached_managed_cert"
		},
		// No OCSP stapling, as nginx's default (ssl_stapling off) and the
		// files source. certmagic fetches a staple with http.DefaultClient,
		// which has no timeout, each time it loads a certificate (after an
		// order, from storage, at a renewal, in an on-demand handshake) and
		// from the maintenance goroutine that also renews: a responder that
		// accepts and never answers kept a sync start from returning, and
		// stopped every later renewal and Close. Let's Encrypt certificates
		// name no responder since 2025.
		OCSP: certmagic.OCSPConfig{DisableStapling: true},
	}
	storage := certmagic.Default.Storage // certmagic's data directory
	if a.StorageDir != "" {
		storage = &certmagic.FileStorage{Path: a.StorageDir}
	}
	s.locks = &lockGate{Storage: storage, log: log}
	base.Storage = s.locks
	s.managed = newCertmagicConfig(s.cache, base, issuer)
	if a.OnDemand {
		base.OnDemand = &certmagic.OnDemandConfig{DecisionFunc: s.decide}
		s.onDemand = newCertmagicConfig(s.cache, base, issuer)
	}

	if s.onDemand != nil {
		s.sweeping.Go(func() { s.sweepLoop(bg) })
	}
	if len(s.managedNames) > 0 {
		if a.Sync {
			err = s.manageSync(ctx)
		} else {
			err = s.managed.ManageAsync(bg, s.managedNames)
		}
		if err != nil {
			_ = s.close()
			return nil, fmt.Errorf("acme: manage %v: %w", s.managedNames, err)
		}
	}
	log.Info("acme certificates configured", "ca", issuer.CA, "managed", s.managedNames,
		"on_demand", a.OnDemand, "dns_provider", a.DNS.Provider, "storage", a.StorageDir)
	return s, nil
}

// manageSync loads or obtains each managed name before New returns. A
// stored certificate that is still valid is enough to listen with: it is
// served at once, and when due for renewal it is renewed by the cache's
// maintenance (every 10 minutes), as every later renewal is. Renewed here
// first, a CA that accepted connections and never answered held the start
// 90 s per name (certmagic's 30 s per request, tried three times), and one
// that refused them logged a failed renewal and served the stored
// certificate anyway; a CA outage must never keep a restarted proxy down.
func (s *acmeSource) manageSync(ctx context.Context) error {
	for _, name := range s.managedNames {
		if _, err := s.managed.CacheManagedCertificate(ctx, name); err == nil {
			if s.cachedValid(name) {
				continue
			}
			// Expired: ManageSync leaves a certificate it finds in
			// memory to the maintenance, and this one must be renewed
			// before the proxy listens.
			s.cache.RemoveManaged([]certmagic.SubjectIssuer{{Subject: name}})
		}
		if err := s.managed.ManageSync(ctx, []string{name}); err != nil {
			return err
		}
	}
	return nil
}

// cachedValid reports whether a certificate for name that has not expired
// is in memory.
func (s *acmeSource) cachedValid(name string) bool {
	for _, c := range s.cache.AllMatchingCertificates(name) {
		if !c.Expired() {
			return true
		}
	}
	return false
}

// earliestExpiry is the soonest, over the managed names, of the latest
// NotAfter among the name's certificates in memory (the renewed one, once
// there); zero while a name has none.
func (s *acmeSource) earliestExpiry() time.Time {
	var earliest time.Time
	for _, name := range s.managedNames {
		var latest time.Time
		for _, c := range s.cache.AllMatchingCertificates(name) {
			if c.Leaf != nil && c.Leaf.NotAfter.After(latest) {
				latest = c.Leaf.NotAfter
			}
		}
		if latest.IsZero() {
			return time.Time{}
		}
		if earliest.IsZero() || latest.Before(earliest) {
			earliest = latest
		}
	}
	return earliest
}

// CheckACME reports what would keep New from starting the acme source
// cfg describes, short of talking to the CA or the DNS provider: a missing
// domain, email or storage directory, an unreadable trusted-roots file, a
// DNS provider that cannot be built from its options. `cubeproxy check`
// runs it where serve would start certmagic.
func CheckACME(cfg Config) error {
	if err := validateACME(cfg, strings.ToLower(strings.Trim(cfg.Domain, "."))); err != nil {
		return fmt.Errorf("tls certificates: %w", err)
	}
	if err := checkStorageDir(cfg.ACME.StorageDir); err != nil {
		return fmt.Errorf("tls certificates: %w", err)
	}
	if _, err := issuerTemplate(cfg.ACME, cfg.ListenAddr, zap.NewNop()); err != nil {
		return fmt.Errorf("tls certificates: %w", err)
	}
	return nil
}

// ACMECovers is what Covers of the Manager New would build from cfg
// (Source acme) reports for host, without building one: for check, which
// must not start certmagic.
func ACMECovers(cfg Config, host string) bool {
	if cfg.ACME.OnDemand {
		return true
	}
	if cfg.ACME.SkipWildcard {
		return false
	}
	domain := strings.ToLower(strings.Trim(cfg.Domain, "."))
	s := acmeSource{domain: domain, defaultName: "*." + domain}
	return s.covered(strings.ToLower(strings.TrimSuffix(host, ".")))
}

func validateACME(cfg Config, domain string) error {
	a := cfg.ACME
	switch {
	case !a.SkipWildcard && domain == "":
		return errors.New("tls.domain is empty: the acme source manages *.<tls.domain> and <tls.domain>; set tls.domain (CUBEPROXY_TLS_DOMAIN, for example cube.app), or set tls.acme.skip_wildcard with tls.acme.on_demand")
	case !a.SkipWildcard && a.DNS.Provider == "":
		return fmt.Errorf("tls.acme.dns.provider is empty: *.%s can only be validated with DNS-01; set tls.acme.dns.provider (CUBEPROXY_TLS_ACME_DNS_PROVIDER, rfc2136) and its tls.acme.dns.options, or set tls.acme.skip_wildcard with tls.acme.on_demand", domain)
	case a.SkipWildcard && !a.OnDemand:
		return errors.New("tls.acme.skip_wildcard is on but tls.acme.on_demand is off: no certificate would ever be obtained; set tls.acme.on_demand (CUBEPROXY_TLS_ACME_ON_DEMAND=true), or remove tls.acme.skip_wildcard")
	case a.OnDemand && cfg.Allow == nil:
		return errors.New("acme: on-demand issuance needs an Allow function")
	case a.Email == "":
		// certmagic would otherwise prompt for one on stdin the first time
		// it obtains a certificate synchronously.
		return errors.New("tls.acme.email is empty: the ACME account needs a contact address; set tls.acme.email (CUBEPROXY_TLS_ACME_EMAIL), for example ops@example.com")
	case !bareAddress(a.Email):
		// certmagic registers "mailto:"+email as it stands, and the CA
		// refuses a contact that is no address only at the first order,
		// after the proxy listens: check passed, HTTPS got no certificate.
		return fmt.Errorf("tls.acme.email %q: want one bare address, as ops@example.com", a.Email)
	case a.StorageDir == "":
		// certmagic would keep account and certificates under $HOME,
		// which a container loses at every restart: each restart would
		// then obtain the same certificates anew, and Let's Encrypt issues
		// at most 5 duplicates a week, after which HTTPS has none.
		return errors.New("tls.acme.storage_dir is empty: certificates must survive restarts; set tls.acme.storage_dir (CUBEPROXY_TLS_ACME_STORAGE_DIR) to a directory the proxy can write (in a container, mount a volume there; share it between replicas)")
	}
	return nil
}

// bareAddress reports whether email is one address and nothing else: no
// display name, list, scheme or surrounding space.
func bareAddress(email string) bool {
	addr, err := mail.ParseAddress(email)
	return err == nil && addr.Name == "" && addr.Address == email
}

// checkStorageDir reports whether certmagic can write under dir: create
// it (the nearest part of it that exists must be a directory this process
// can write) or add files to it. certmagic finds out only at its first
// order, in the background, after the proxy is listening: it logs one
// "failed storage check" and never retries, so HTTPS would fail every
// handshake for good behind a /readyz that says ready. A container's
// non-root user meets this with a storage_dir that is not a writable
// volume. The probe leaves nothing behind (no directory is created), so
// `cubeproxy check` can run it too.
func checkStorageDir(dir string) error {
	d := filepath.Clean(dir)
	for {
		fi, err := os.Stat(d)
		if err == nil {
			if !fi.IsDir() {
				return fmt.Errorf("tls.acme.storage_dir %s: %s is not a directory", dir, d)
			}
			break
		}
		// Missing, or under a file (ENOTDIR), or not searchable: the
		// probe in the nearest existing parent tells which.
		parent := filepath.Dir(d)
		if parent == d {
			break
		}
		d = parent
	}
	f, err := os.CreateTemp(d, ".cubeproxy-storage-check-*")
	if err != nil {
		var pe *fs.PathError // the probe's name would only puzzle
		if errors.As(err, &pe) {
			err = pe.Err
		}
		if d != filepath.Clean(dir) {
			return fmt.Errorf("tls.acme.storage_dir %s cannot be created in %s (certificates could not be stored): %w", dir, d, err)
		}
		return fmt.Errorf("tls.acme.storage_dir %s is not writable (certificates could not be stored): %w", dir, err)
	}
	name := f.Name()
	return errors.Join(f.Close(), os.Remove(name))
}

// issuerTemplate builds the ACMEIssuer settings shared by both Configs.
// listenAddr is the HTTPS listener's address (see Config.ListenAddr).
func issuerTemplate(a ACMEConfig, listenAddr string, zl *zap.Logger) (certmagic.ACMEIssuer, error) {
	if err := checkCA(a.CA); err != nil {
		return certmagic.ACMEIssuer{}, err
	}
	roots, err := trustedRoots(a)
	if err != nil {
		return certmagic.ACMEIssuer{}, err
	}
	host, port, err := listenHostPort(listenAddr)
	if err != nil {
		return certmagic.ACMEIssuer{}, err
	}
	issuer := certmagic.ACMEIssuer{
		CA:           a.CA,
		Email:        a.Email,
		Agreed:       true, // configuring a CA means accepting its terms
		TrustedRoots: roots,
		Logger:       zl,
		// HTTP-01 would need /.well-known/acme-challenge on the HTTP
		// listener; DNS-01 (or TLS-ALPN-01 on this TLS config) is used.
		DisableHTTPChallenge: true,
		// TLS-ALPN-01 (without a DNS provider) is answered by the HTTPS
		// listener through TLSConfig: its port is the one certmagic
		// finds taken and leaves alone. Left at 443, certmagic would
		// open a challenge listener of its own there (as a non-root
		// user: refused, and every issuance fails), which the CA reaches
		// only when nothing maps 443 to the proxy's port.
		ListenHost:     host,
		AltTLSALPNPort: port,
	}
	if issuer.CA == "" {
		issuer.CA = certmagic.LetsEncryptProductionCA
	}
	if a.DNS.Provider == "" {
		return issuer, nil
	}
	provider, err := newDNSProvider(a.DNS.Provider, a.DNS.Options)
	if err != nil {
		return certmagic.ACMEIssuer{}, err // names the setting
	}
	timeout := a.DNS.PropagationTimeout
	if timeout < 0 {
		timeout = -1 // certmagic's "skip the check"
	}
	issuer.DNS01Solver = &certmagic.DNS01Solver{DNSManager: certmagic.DNSManager{
		DNSProvider:        provider,
		TTL:                a.DNS.TTL,
		PropagationDelay:   a.DNS.PropagationDelay,
		PropagationTimeout: timeout,
		Resolvers:          a.DNS.Resolvers,
		Logger:             zl,
	}}
	return issuer, nil
}

// checkCA refuses a directory URL certmagic would refuse at every order
// (its newBasicACMEClient): unparsable, or plain http to a host that is
// not internal. Found only then, it let `check` pass and serve start, and
// without sync every handshake then failed for want of a certificate.
func checkCA(ca string) error {
	if ca == "" {
		return nil
	}
	written := ca
	if !strings.Contains(ca, "://") {
		ca = "https://" + ca // what certmagic assumes
	}
	u, err := url.Parse(ca)
	if err != nil {
		return fmt.Errorf("tls.acme.ca: %w", err)
	}
	if u.Scheme != "https" && !certmagic.SubjectIsInternal(u.Host) {
		return fmt.Errorf("tls.acme.ca %s: certmagic requires https for a CA that is not internal (loopback or private)", ca)
	}
	if u.Hostname() == "" {
		// certmagic takes it, and every order then fails on "no Host in
		// request URL", after the proxy listens: HTTPS without a
		// certificate, behind a check that passed.
		return fmt.Errorf("tls.acme.ca %q names no host; want the CA's directory URL, for example %s", written, certmagic.LetsEncryptProductionCA)
	}
	return nil
}

// listenHostPort splits the HTTPS listener's address for certmagic; an
// empty address, or port 0 (chosen at bind time), leaves its defaults.
func listenHostPort(addr string) (string, int, error) {
	if addr == "" {
		return "", 0, nil
	}
	host, p, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, fmt.Errorf("https_addr %q: %w", addr, err)
	}
	port, err := strconv.Atoi(p)
	if err != nil || port < 0 || port > 65535 {
		return "", 0, fmt.Errorf("https_addr %q: bad port", addr)
	}
	if port == 0 {
		return "", 0, nil
	}
	return host, port, nil
}

// closingSolver is the DNS-01 solver with its record's creation and the
// wait for it to propagate ended when closed ends (Close). certmagic gives
// an on-demand renewal run in the background (the certificate still
// served) a context of its own, which Close cannot end: a DNS server or
// propagation that took its time held the renewal's storage lock past
// Close, and the lock file was left to a restarted proxy. CleanUp keeps
// certmagic's context: it removes the record whatever happened.
type closingSolver struct {
	acmez.Solver
	closed context.Context
}

// errSourceClosed ends the DNS-01 work of an order at Close.
var errSourceClosed = errors.New("acme: certificate manager closed")

// bound returns ctx ending when closed does too.
func (c closingSolver) bound(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(ctx)
	stop := context.AfterFunc(c.closed, func() { cancel(errSourceClosed) })
	return ctx, func() { stop(); cancel(nil) }
}

// ended returns err, marked as no failure to retry once closed ended:
// certmagic retries a failed renewal after a minute, still holding its
// lock, unless told not to.
func (c closingSolver) ended(err error) error {
	if err != nil && c.closed.Err() != nil {
		return certmagic.ErrNoRetry{Err: fmt.Errorf("%w: %w", errSourceClosed, err)}
	}
	return err
}

// Present creates the challenge's TXT record.
func (c closingSolver) Present(ctx context.Context, chal acme.Challenge) error {
	ctx, done := c.bound(ctx)
	defer done()
	return c.ended(c.Solver.Present(ctx, chal))
}

// Wait waits for the record to propagate.
func (c closingSolver) Wait(ctx context.Context, chal acme.Challenge) error {
	w, ok := c.Solver.(acmez.Waiter)
	if !ok {
		return nil
	}
	ctx, done := c.bound(ctx)
	defer done()
	return c.ended(w.Wait(ctx, chal))
}

// newCertmagicConfig builds a Config with its own issuer: the issuer keeps a
// pointer to its Config, hence the two steps.
func newCertmagicConfig(cache *certmagic.Cache, base certmagic.Config, issuer certmagic.ACMEIssuer) *certmagic.Config {
	cfg := certmagic.New(cache, base)
	cfg.Issuers = []certmagic.Issuer{certmagic.NewACMEIssuer(cfg, issuer)}
	return cfg
}

func trustedRoots(a ACMEConfig) (*x509.CertPool, error) {
	if a.TrustedRoots != nil || a.TrustedRootsFile == "" {
		return a.TrustedRoots, nil
	}
	pemBytes, err := namedfile.Read(a.TrustedRootsFile, namedfile.MaxSmall)
	if err != nil {
		return nil, fmt.Errorf("tls.acme.trusted_roots_file: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pemBytes) {
		return nil, fmt.Errorf("tls.acme.trusted_roots_file: no certificate in %s", a.TrustedRootsFile)
	}
	return pool, nil
}

func (s *acmeSource) getCertificate(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
	// Decide on the name certmagic will use, not on the raw SNI: it maps
	// the SNI through IDNA (full-width and ideographic dots become '.',
	// spaces are trimmed), so "50005-abc。cube.app" would pass covered
	// below as a name the wildcard does not cover, reach Allow and be
	// served the wildcard through the on-demand Config, which renews it
	// in the renewal window: an order the client chose.
	if name := normalizeSNI(hello.ServerName); name != hello.ServerName {
		h := *hello
		h.ServerName = name
		hello = &h
	}
	if challengeHello(hello) {
		return s.challengeCertificate(hello)
	}
	if noSNI(hello.ServerName) {
		if s.defaultName == "" {
			return nil, errNoCertificate
		}
		// Serve the wildcard: asking certmagic with the wildcard as the
		// name keeps on-demand logic out of no-SNI handshakes.
		h := *hello
		h.ServerName = s.defaultName
		return s.managed.GetCertificate(&h)
	}
	// Names the wildcard covers never go through the on-demand Config: in
	// the renewal window it would "renew" the wildcard under the client's
	// hostname, or evict it from memory when Allow refuses that hostname.
	if s.onDemand != nil && !s.covered(hello.ServerName) {
		cert, err := s.onDemandCertificate(hello)
		if _, idnaErr := idna.Lookup.ToASCII(hello.ServerName); err != nil && idnaErr != nil {
			// certmagic refuses a name IDNA refuses ('_' in a
			// sandbox id) before Allow sees it: no CA could name it.
			err = fmt.Errorf("%w: %w", ErrUnknownName, err)
		}
		return cert, err
	}
	cert, err := s.managed.GetCertificate(hello)
	if err != nil && !s.covered(hello.ServerName) {
		// Not under the wildcard, and no on-demand to obtain one.
		err = fmt.Errorf("%w: %w", ErrUnknownName, err)
	}
	return cert, err
}

// challengeHello reports whether hello is a TLS-ALPN-01 validation, as
// certmagic tells one (RFC 8737: a server name and the ALPN protocol
// acme-tls/1 alone); certmagic answers it from its challenges, before any
// other lookup.
func challengeHello(hello *tls.ClientHelloInfo) bool {
	return hello.ServerName != "" && len(hello.SupportedProtos) == 1 && hello.SupportedProtos[0] == acmeTLS1
}

// challengeCertificate answers a TLS-ALPN-01 validation only for a name
// Allow accepts: the CA validates names on-demand ordered, which Allow
// accepted. certmagic looks any other name up in the storage (a replica
// sharing it may have placed the order) and logs its absence as an error,
// so any client that offered acme-tls/1 alone wrote an error line per
// handshake, for any server name, and an attacker could flood the log.
func (s *acmeSource) challengeCertificate(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
	if s.onDemand == nil {
		// Unreachable through TLSConfig: acme-tls/1 is offered only
		// without a DNS provider, which needs on-demand.
		return nil, fmt.Errorf("%w: no TLS-ALPN-01 challenge is ever answered here", ErrUnknownName)
	}
	ctx := hello.Context()
	if ctx == nil {
		ctx = s.ctx
	}
	if err := s.allow(ctx, hello.ServerName); err != nil {
		return nil, fmt.Errorf("tls-alpn-01 challenge for %s: %w", hello.ServerName, err)
	}
	return s.onDemand.GetCertificate(hello)
}

// abortKey holds, in the context of an on-demand handshake, the function
// that ends it (see onDemandCertificate).
type abortKey struct{}

// onDemandCertificate asks the on-demand Config under a context that ends
// when the source closes, and that a failed order ends too (onEvent's
// cert_failed). certmagic retries a failed order after a minute, then two,
// within its 180 s handshake timeout: the client's handshake was held
// that long (and concurrent ones for the name behind it), each retry was
// a new order against the budget, and a shutdown's drain waited for it.
func (s *acmeSource) onDemandCertificate(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
	ctx, cancel := context.WithCancelCause(s.ctx)
	defer cancel(nil)
	if hc := hello.Context(); hc != nil {
		stop := context.AfterFunc(hc, func() { cancel(context.Cause(hc)) })
		defer stop()
	}
	ctx = context.WithValue(ctx, abortKey{}, cancel)
	cert, err := s.onDemand.GetCertificateWithContext(ctx, hello)
	if err != nil && ctx.Err() != nil {
		// The cause (the order's failure, or the shutdown) says more
		// than "context canceled".
		err = fmt.Errorf("%w (%w)", err, context.Cause(ctx))
	}
	return cert, err
}

// normalizeSNI is the name certmagic looks a ClientHello up by: IDNA's
// lookup mapping (as its getNameFromClientHello does) or, for a name IDNA
// refuses, lower case without surrounding space (its cache lookup, which
// still serves the wildcard to 50005-a_b.<domain>: sandbox ids may hold
// '_', which IDNA's STD3 rules refuse).
func normalizeSNI(sni string) string {
	sni = strings.TrimSpace(sni)
	if name, err := idna.Lookup.ToASCII(sni); err == nil {
		return name
	}
	return strings.ToLower(sni)
}

// covers reports whether host can get a certificate: the managed ones
// name it, or on-demand may obtain one.
func (s *acmeSource) covers(host string) bool {
	return s.onDemand != nil || s.covered(host)
}

// covered reports whether the managed certificates serve name: the apex or
// exactly one label below it.
func (s *acmeSource) covered(name string) bool {
	if s.defaultName == "" {
		return false
	}
	name = strings.TrimSuffix(name, ".")
	if strings.EqualFold(name, s.domain) {
		return true
	}
	cut := len(name) - len(s.domain) - 1
	if cut <= 0 || name[cut] != '.' || !strings.EqualFold(name[cut+1:], s.domain) {
		return false
	}
	return strings.IndexByte(name[:cut], '.') < 0
}

// configForCert lets the cache's maintenance renew managed certificates
// with the managed Config; on-demand ones go to the on-demand Config, which
// renews them during handshakes (so certificates of deleted sandboxes lapse).
func (s *acmeSource) configForCert(cert certmagic.Certificate) (*certmagic.Config, error) {
	if s.onDemand == nil {
		return s.managed, nil
	}
	for _, n := range cert.Names {
		if s.isManagedName(n) {
			return s.managed, nil
		}
	}
	return s.onDemand, nil
}

func (s *acmeSource) isManagedName(name string) bool {
	for _, m := range s.managedNames {
		if strings.EqualFold(name, m) {
			return true
		}
	}
	return false
}

// decide is certmagic's on-demand DecisionFunc. It runs before certmagic
// reads storage or contacts the CA, for every handshake whose name has no
// certificate in memory, and before handshake-time renewals.
func (s *acmeSource) decide(ctx context.Context, name string) error {
	if err := s.allow(ctx, name); err != nil {
		// Manager.getCertificate logs a refusal of the name itself.
		if !errors.Is(err, ErrUnknownName) {
			s.log.Debug("on-demand certificate refused", "name", name, "error", err)
		}
		return err
	}
	if err := s.failures.check(name, time.Now()); err != nil {
		s.log.Debug("on-demand certificate refused", "name", name, "error", err)
		return err
	}
	if s.limiter.full() && !s.stored(ctx, name) {
		// Over the budget, a name with nothing stored to load would
		// only be refused at the order (onEvent): certmagic got there
		// through a storage check (a 10 KB file written, synced and
		// deleted), a lock file and five info lines, for every
		// handshake a client retried.
		err := s.refuseOverBudget(name)
		s.log.Debug("on-demand certificate refused", "name", name, "error", err)
		return err
	}
	return nil
}

// stored reports whether the storage holds a certificate for name that
// the on-demand Config would load (an error reading it counts as one:
// certmagic then decides, and the budget still guards the order).
func (s *acmeSource) stored(ctx context.Context, name string) bool {
	key := certmagic.StorageKeys.SiteCert(s.onDemand.Issuers[0].IssuerKey(), name)
	return s.locks.Exists(ctx, key)
}

// refuseOverBudget returns the refusal of an on-demand issuance for name
// over the budget, and logs the refusals at most once a window.
func (s *acmeSource) refuseOverBudget(name string) error {
	if n, ok := s.limiter.report(); ok {
		s.log.Warn("on-demand certificate issuance rate limit reached; refusing new certificates (logged at most once a minute)",
			"name", name, "per_minute", s.limiter.max, "refused", n)
	}
	return fmt.Errorf("on-demand issuance for %s: %w", name, errRateLimited)
}

// onEvent rate-limits new on-demand issuances and backs off names whose
// order failed. "cert_obtaining" fires only when a certificate is really
// requested from the CA (not when one is loaded from storage after a
// restart); renewals and the managed names are not limited. A name in
// its backoff is refused before it spends the budget: only attempts that
// reach the CA count, so names the CA refuses (its own rate limit, a
// domain the DNS provider cannot write) cost one order per backoff period
// and cannot use up the budget of the names that work. Renewals go to
// onRenewalEvent; "cached_managed_cert" notes the on-demand names in
// memory for the sweep (sweep.go).
func (s *acmeSource) onEvent(ctx context.Context, event string, data map[string]any) error {
	if event == "cached_managed_cert" {
		s.onCached(data)
		return nil
	}
	name, _ := data["identifier"].(string)
	if s.isManagedName(name) {
		return nil
	}
	if renewal, _ := data["renewal"].(bool); renewal {
		return s.onRenewalEvent(ctx, event, name, data)
	}
	switch event {
	case "cert_obtained":
		s.failures.forget(name)
		return nil
	case "cert_failed":
		err, _ := data["error"].(error)
		next := s.failures.record(name, time.Now())
		s.log.Warn("on-demand certificate order failed; the name waits before its next order",
			"name", name, "error", err, "next_attempt", next)
		// End the handshake now instead of after certmagic's retry.
		if abort, ok := ctx.Value(abortKey{}).(context.CancelCauseFunc); ok {
			abort(fmt.Errorf("on-demand order for %s failed: %w", name, err))
		}
		return nil
	case "cert_obtaining":
	default:
		return nil
	}
	if err := s.failures.check(name, time.Now()); err != nil {
		return certmagic.ErrNoRetry{Err: err}
	}
	if !s.limiter.allow() {
		// ErrNoRetry: certmagic would otherwise retry the refused issuance.
		return certmagic.ErrNoRetry{Err: s.refuseOverBudget(name)}
	}
	return nil
}

// onRenewalEvent handles the renewal of an on-demand certificate. One
// still valid is renewed in the background while it is served, and
// certmagic retries that on its own; nothing waits on it. One that expired
// is renewed inside the handshake (ctx then holds abortKey): a failure
// there (the CA or the DNS provider down) is a failed order like any
// other, so it ends the handshake now and backs the name off, rather than
// hold the handshake through certmagic's retries for up to 90 s and start
// another renewal at the next handshake. Renewals are not rate limited.
func (s *acmeSource) onRenewalEvent(ctx context.Context, event, name string, data map[string]any) error {
	switch event {
	case "cert_obtained":
		s.failures.forget(name)
	case "cert_failed":
		abort, waited := ctx.Value(abortKey{}).(context.CancelCauseFunc)
		if !waited {
			return nil
		}
		err, _ := data["error"].(error)
		next := s.failures.record(name, time.Now())
		s.log.Warn("renewal of an expired on-demand certificate failed; the name waits before its next order",
			"name", name, "error", err, "next_attempt", next)
		abort(fmt.Errorf("renewal of the expired certificate for %s failed: %w", name, err))
	}
	return nil
}

func (s *acmeSource) ready() error {
	if s.defaultName == "" || s.obtained.Load() {
		return nil
	}
	if !s.cachedValid(s.defaultName) {
		return fmt.Errorf("%w for %s", ErrCertificatePending, s.defaultName)
	}
	s.obtained.Store(true)
	return nil
}

// lockReleaseWait bounds how long close waits for certmagic to release
// its storage locks after the cancel: its requests end with the context,
// so this is met in milliseconds unless a storage or DNS call hangs.
const lockReleaseWait = 5 * time.Second

func (s *acmeSource) close() error {
	s.cancel()
	s.sweeping.Wait()
	s.cache.Stop()
	if s.locks != nil && !s.locks.close(lockReleaseWait) {
		return fmt.Errorf("acme: a certificate storage lock was still held %s after close; a restarted proxy may wait for it to go stale", lockReleaseWait)
	}
	return nil
}
