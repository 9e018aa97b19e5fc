// Package certs provides the TLS configuration of the HTTPS listener and the
// certificates behind it, from one of three sources:
//
//   - files: cert/key PEM pairs chosen by SNI (among several for one name,
//     the first the client can use and that is within its validity) and
//     reloaded when they change;
//   - self_signed: an in-memory development certificate (the default);
//   - acme: certmagic obtaining and renewing *.<domain> and <domain> through
//     DNS-01 with a libdns provider, plus optional on-demand issuance for
//     hostnames the proxy knows.
//
// Certificates are chosen per TLS handshake, so a renewed or reloaded
// certificate applies to new connections while open ones (long streams,
// WebSockets) keep the session they negotiated and are never dropped.
//
// Clients that send no SNI, or an IP literal as SNI (clients that dial the
// node IP), get the default certificate: the first file pair (or a later
// one that names all it names, when the client can use only that one or
// the first is outside its validity), the wildcard for acme, the
// development certificate for self_signed.
//
// ALPN is "http/1.1" and "http/1.0" (plus "acme-tls/1" for acme
// validating by TLS-ALPN-01, on-demand without a DNS provider): fasthttp
// has no HTTP/2, and advertising "h2" would make clients speak HTTP/2 to an
// HTTP/1 parser.
package certs

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"
)

// Certificate sources accepted in Config.Source.
const (
	SourceFiles      = "files"
	SourceSelfSigned = "self_signed"
	SourceACME       = "acme"
)

// Defaults applied by New for zero-valued fields.
const (
	DefaultReloadInterval = 10 * time.Second
	DefaultOnDemandRate   = 10
)

// Config selects the certificate source and configures it. Its errors
// name each field by the cubeproxy setting that sets it (tls.acme.email
// for ACME.Email), and a missing one with its environment variable too:
// that is what the operator who reads them writes.
type Config struct {
	// Source is SourceFiles, SourceSelfSigned or SourceACME; "" means self_signed.
	Source string
	// Domain is the base domain ("cube.app"): self_signed covers it and its
	// wildcard; acme manages *.<Domain> and <Domain>.
	Domain string
	// Files are the PEM pairs of the files source; the first, with the
	// later ones that name all it names, is the default.
	Files []FilePair
	// ReloadInterval is how often the files are re-read (default 10 s).
	ReloadInterval time.Duration
	// ACME configures the acme source.
	ACME ACMEConfig
	// Allow decides on-demand issuance: it must return nil only when the
	// hostname belongs to an existing sandbox. It runs during TLS handshakes
	// for names without a certificate, so it must be fast. An error that
	// wraps ErrUnknownName (the name is no sandbox's) fails the handshake
	// with the unrecognized_name alert; any other (the route store is down)
	// with internal_error.
	Allow func(ctx context.Context, name string) error
	// ListenAddr is the HTTPS listener's address (host:port). TLS-ALPN-01
	// challenges (acme on-demand without a DNS provider) are answered
	// there, through TLSConfig; certmagic is told so, rather than opening
	// a challenge listener of its own on port 443.
	ListenAddr string
	// Logger receives certificate events; nil discards them.
	Logger *slog.Logger
}

// FilePair is one certificate chain and its private key, both PEM files.
type FilePair struct {
	CertFile string // certificate chain, leaf first
	KeyFile  string // the leaf's private key
	// Setting is the pair's name in the configuration, "tls" for
	// tls.cert_file and tls.key_file or "tls.files[2]" for a listed
	// pair: its errors name the setting that names the file, as an
	// operator looks for it in the config (the path alone did not say
	// which of the pairs, nor where it was set). Empty names them
	// cert_file and key_file.
	Setting string
}

// certKey and keyKey are the settings that name the pair's files.
func (p FilePair) certKey() string { return p.key("cert_file") }
func (p FilePair) keyKey() string  { return p.key("key_file") }

func (p FilePair) key(leaf string) string {
	if p.Setting == "" {
		return leaf
	}
	return p.Setting + "." + leaf
}

// pairKeys names both settings, for an error about the pair.
func (p FilePair) pairKeys() string { return p.certKey() + " + " + p.keyKey() }

// ACMEConfig configures certmagic for the acme source.
type ACMEConfig struct {
	// CA is the ACME directory URL; empty means Let's Encrypt production.
	CA string
	// Email is the ACME account contact.
	Email string
	// TrustedRootsFile is a PEM bundle trusted for the CA's own HTTPS
	// endpoint (private CAs); empty uses the system roots.
	TrustedRootsFile string
	// TrustedRoots is the same as a pool (tests); it wins over the file.
	TrustedRoots *x509.CertPool
	// StorageDir holds accounts, certificates and locks, so certificates
	// survive restarts. Replicas must share it (or each issues its own).
	// Required, and it must be writable (or creatable) by the process.
	StorageDir string
	// DNS configures the DNS-01 challenge; required for the wildcard.
	DNS DNSConfig
	// SkipWildcard disables managing *.<Domain> and <Domain> at start;
	// certificates then come only from on-demand issuance.
	SkipWildcard bool
	// OnDemand enables per-hostname issuance during handshakes for names the
	// wildcard does not cover, gated by Config.Allow and OnDemandRate.
	OnDemand bool
	// OnDemandRate caps new on-demand issuances per minute (default 10).
	OnDemandRate int
	// Sync makes New wait until the managed certificates are loaded or
	// obtained; otherwise they are obtained in the background. A stored
	// certificate that is still valid is served at once, and renewed in
	// the background when due: a CA that is down or never answers does
	// not hold the start.
	Sync bool
}

// DNSConfig selects the libdns provider used for DNS-01.
type DNSConfig struct {
	// Provider names the provider (see dnsprovider.go); "" disables DNS-01.
	Provider string
	// Options are the provider's settings (for rfc2136: server, key_name,
	// key_alg, key_secret or key_secret_file, net, timeout).
	Options map[string]string
	// Resolvers (host:port) are used to find the zone (SOA) and to check
	// propagation; empty uses the system resolvers.
	Resolvers []string
	// PropagationTimeout bounds the wait for the TXT record to be visible;
	// 0 means certmagic's default (2 min), negative disables the check.
	PropagationTimeout time.Duration
	// PropagationDelay is waited before the first propagation check.
	PropagationDelay time.Duration
	// TTL of the challenge records; 0 lets the provider decide.
	TTL time.Duration
}

// source is one way of producing certificates.
type source interface {
	getCertificate(hello *tls.ClientHelloInfo) (*tls.Certificate, error)
	// earliestExpiry is EarliestExpiry's answer for the source.
	earliestExpiry() time.Time
	close() error
}

// readySource is a source that may start without the certificate it
// serves by default (acme without sync).
type readySource interface {
	ready() error
}

// coveringSource is a source that can tell which host names its
// certificates name (self_signed is for development and serves one
// certificate whatever the name).
type coveringSource interface {
	covers(host string) bool
}

// ErrCertificatePending is Ready's error while the default certificate
// has not been obtained yet.
var ErrCertificatePending = errors.New("waiting for the first certificate")

// Manager owns the certificate source and builds the listener's tls.Config.
type Manager struct {
	src       source
	log       *slog.Logger
	protos    []string
	closeOnce sync.Once
	closeErr  error
}

// New validates cfg and starts the configured source: it loads the files and
// starts watching them, generates the development certificate, or sets up
// certmagic and starts obtaining the managed certificates (waiting for them
// when cfg.ACME.Sync is set). ctx bounds that start; background work runs
// until Close.
func New(ctx context.Context, cfg Config) (*Manager, error) {
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	log = log.With("component", "certs")

	// http/1.0 as nginx offers it: curl --http1.0 offers it alone, and
	// without it that client failed the handshake (no_application_protocol)
	// for requests the proxy serves. After http/1.1, which crypto/tls
	// then prefers (it picks in the server's order).
	m := &Manager{protos: []string{"http/1.1", "http/1.0"}, log: log}
	var err error
	switch cfg.Source {
	case SourceFiles:
		m.src, err = newFileSource(cfg.Files, cfg.ReloadInterval, log)
	case SourceSelfSigned, "":
		m.src, err = newSelfSigned(cfg.Domain, log)
	case SourceACME:
		if cfg.ACME.DNS.Provider == "" {
			// TLS-ALPN-01 is the challenge only without DNS-01 (certmagic
			// uses its DNS solver alone when it has one). Offered with
			// DNS-01, it let any client that asks for it alone reach
			// certmagic's challenge lookup: a storage read and an error
			// line per handshake, for any server name.
			m.protos = append(m.protos, acmeTLS1)
		}
		m.src, err = newACMESource(ctx, cfg, log)
	default:
		err = fmt.Errorf("unknown source %q (want %s, %s or %s)", cfg.Source, SourceFiles, SourceSelfSigned, SourceACME)
	}
	if err != nil {
		return nil, fmt.Errorf("tls certificates: %w", err)
	}
	return m, nil
}

// TLSConfig returns a new server tls.Config: TLS 1.2 minimum, AEAD cipher
// suites with forward secrecy, session tickets on, ALPN exactly "http/1.1"
// and "http/1.0" (plus "acme-tls/1" for acme without a DNS provider, for
// TLS-ALPN-01 challenges), never "h2".
func (m *Manager) TLSConfig() *tls.Config {
	return &tls.Config{
		MinVersion:     tls.VersionTLS12,
		CipherSuites:   cipherSuites(),
		NextProtos:     append([]string(nil), m.protos...),
		GetCertificate: m.getCertificate,
		// Only to log: crypto/tls refuses the ALPN list itself, before
		// it asks for a certificate.
		GetConfigForClient: m.noteProtocols,
	}
}

// maxLoggedProtos bounds the offered protocols a refusal's line names: a
// ClientHello may list thousands.
const maxLoggedProtos = 4

// noteProtocols logs, at debug, a handshake crypto/tls is about to refuse
// with the no_application_protocol alert: the client offers ALPN
// protocols and none of the proxy's (a gRPC client, or any that speaks
// only HTTP/2). Those clients report only the alert, and nothing told an
// operator why they failed. It returns no config: the listener's stays.
func (m *Manager) noteProtocols(hello *tls.ClientHelloInfo) (*tls.Config, error) {
	offered := hello.SupportedProtos
	if len(offered) == 0 || !m.log.Enabled(hello.Context(), slog.LevelDebug) {
		return nil, nil
	}
	for _, p := range offered {
		if slices.Contains(m.protos, p) {
			return nil, nil
		}
	}
	m.log.Debug("tls handshake refused: the client offers no protocol the proxy speaks (HTTP/2 is not supported)",
		"sni", hello.ServerName, "offered", offered[:min(len(offered), maxLoggedProtos)])
	return nil, nil
}

// getCertificate answers a name no certificate is for as crypto/tls's own
// "no certificate" case: (nil, nil) with no Certificates in the config,
// for which it sends the unrecognized_name alert that RFC 6066 §3 asks
// for. An error it would answer with internal_error, which tells a
// client (curl: "tlsv1 alert internal error") that the server is broken
// rather than that the name is wrong.
func (m *Manager) getCertificate(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
	cert, err := m.src.getCertificate(hello)
	if err != nil && errors.Is(err, ErrUnknownName) {
		m.log.Debug("tls handshake refused: no certificate for the server name", "sni", hello.ServerName, "error", err)
		return nil, nil
	}
	return cert, err
}

// Ready reports whether the listener can complete handshakes with the
// default certificate: always for files and self_signed (loaded by New),
// and for acme once *.<domain> is in memory — without sync, New returns
// before it is obtained, and until then every handshake for a sandbox
// name fails. The error wraps ErrCertificatePending. Once ready, Ready
// stays nil (a renewal that fails later still serves the valid
// certificate). With the wildcard skipped (on-demand only) there is no
// default certificate to wait for.
func (m *Manager) Ready() error {
	if r, ok := m.src.(readySource); ok {
		return r.ready()
	}
	return nil
}

// EarliestExpiry returns the NotAfter of the certificate that expires
// first among those the configuration names: every file pair as served
// now (a renewal that failed to load keeps the old one, and so its date),
// the development certificate, or for acme the managed wildcard and apex
// as held in memory. Zero when there is none yet (acme before its first
// certificate, or with the wildcard skipped): on-demand certificates are
// one per sandbox name and renewed as they are used, so not counted. It is
// what an alert on a renewal that stopped working watches.
func (m *Manager) EarliestExpiry() time.Time { return m.src.earliestExpiry() }

// Covers reports whether host gets a certificate that names it: a file
// pair's name or wildcard; for acme, the managed wildcard or apex, or any
// name with on-demand issuance (which Allow still decides). The
// development certificate covers every name, as its clients skip
// verification anyway.
func (m *Manager) Covers(host string) bool {
	if c, ok := m.src.(coveringSource); ok {
		return c.covers(strings.ToLower(strings.TrimSuffix(host, ".")))
	}
	return true
}

// Close stops the file watcher or certmagic's cache maintenance, and ends
// the handshakes still waiting on an on-demand order (they fail). Handshakes
// after Close are still served from the certificates in memory, and
// connections already established are not affected. With ACME, Close
// returns once certmagic released its storage locks (up to 5 s), so that
// no lock file outlives the process for a restarted proxy to wait on.
func (m *Manager) Close() error {
	m.closeOnce.Do(func() { m.closeErr = m.src.close() })
	return m.closeErr
}

// acmeTLS1 is the ALPN protocol of the TLS-ALPN-01 challenge (RFC 8737).
const acmeTLS1 = "acme-tls/1"

// cipherSuites lists the TLS 1.2 suites offered (TLS 1.3 suites are not
// configurable and all modern). All are ECDHE + AEAD.
func cipherSuites() []uint16 {
	return []uint16{
		tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
		tls.TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
		tls.TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
		tls.TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
		tls.TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
		tls.TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256,
	}
}

// ErrUnknownName is wrapped by a refusal of a TLS server name that no
// certificate is for and none may be obtained for (see Config.Allow).
var ErrUnknownName = errors.New("no certificate for this server name")

// errNoCertificate is returned during a handshake without SNI when there
// is no default certificate.
var errNoCertificate = fmt.Errorf("%w: no SNI and no default certificate", ErrUnknownName)
