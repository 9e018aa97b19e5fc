package testenv

import (
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/letsencrypt/pebble/v2/ca"
	"github.com/letsencrypt/pebble/v2/db"
	"github.com/letsencrypt/pebble/v2/va"
	"github.com/letsencrypt/pebble/v2/wfe"
)

// newOrderPath is pebble v2.10.3's new-order endpoint (unexported in wfe).
const newOrderPath = "/order-plz"

// Pebble is an in-process ACME server (pebble's CA, validator and web front
// end behind an httptest TLS server).
type Pebble struct {
	// DirectoryURL is the ACME directory to give an ACME client.
	DirectoryURL string
	// ClientRootPool trusts the ACME server's own HTTPS certificate.
	ClientRootPool *x509.CertPool

	mgmt   http.Handler
	srv    *httptest.Server
	orders atomic.Int64
}

// PebbleOptions changes how StartPebbleWith's CA issues.
type PebbleOptions struct {
	// Validity is the lifetime of issued certificates; 0 is pebble's 90 days.
	Validity time.Duration
	// TLSPort is the port pebble's validator dials for TLS-ALPN-01 (on the
	// address the DNS server gives, 127.0.0.1); 0 is pebble's default.
	TLSPort int
	// OCSPResponderURL is written into every issued certificate as its
	// OCSP responder (pebble runs none: the test serves it, or not); ""
	// leaves it out, as Let's Encrypt does since 2025.
	OCSPResponderURL string
}

// pebbleEnv holds pebble's environment knobs for fast, deterministic runs:
// no validation sleeps, no rejected nonces, no authorization reuse. Pebble
// reads them only when StartPebbleWith builds its validator and front end.
var pebbleEnv = [][2]string{
	{"PEBBLE_VA_NOSLEEP", "1"},
	{"PEBBLE_WFE_NONCEREJECT", "0"},
	{"PEBBLE_AUTHZREUSE", "0"},
}

// SetPebbleEnv sets pebble's environment knobs for the whole test binary.
// A package whose tests start pebble in parallel calls it from TestMain,
// before any test runs: StartPebble then leaves the environment alone
// (t.Setenv panics in a parallel test, and would change it under the
// other tests).
func SetPebbleEnv() error {
	for _, kv := range pebbleEnv {
		if err := os.Setenv(kv[0], kv[1]); err != nil {
			return fmt.Errorf("set %s: %w", kv[0], err)
		}
	}
	return nil
}

// StartPebble starts pebble with its DNS-01 validator asking resolverAddr
// (over TCP), and stops it when the test ends. Unless SetPebbleEnv already
// set pebble's environment knobs, it sets them with t.Setenv, so the
// calling test cannot be parallel. Only DNS-01 can succeed: HTTP-01 and
// TLS-ALPN-01 would need fixed ports (StartPebbleWith's TLSPort names the
// one TLS-ALPN-01 dials).
func StartPebble(t testing.TB, resolverAddr string) *Pebble {
	t.Helper()
	return StartPebbleWith(t, resolverAddr, PebbleOptions{})
}

// StartPebbleWith is StartPebble with opts.
func StartPebbleWith(t testing.TB, resolverAddr string, opts PebbleOptions) *Pebble {
	t.Helper()
	for _, kv := range pebbleEnv {
		if os.Getenv(kv[0]) != kv[1] {
			t.Setenv(kv[0], kv[1])
		}
	}

	logger := log.New(io.Discard, "", 0)
	store := db.NewMemoryStore()
	authority := ca.New(logger, store, opts.OCSPResponderURL, "ecdsa", 0, 1, map[string]ca.Profile{
		"default": {Description: "default profile", ValidityPeriod: uint64(opts.Validity / time.Second)},
	})
	validator := va.New(logger, 0, opts.TLSPort, false, resolverAddr, store)
	front := wfe.New(logger, store, validator, authority, []string{"pebble.letsencrypt.org"}, false, false, 0, 0)

	p := &Pebble{mgmt: front.ManagementHandler()}
	acme := front.Handler()
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && r.URL.Path == newOrderPath {
			p.orders.Add(1)
		}
		acme.ServeHTTP(w, r)
	}))
	srv.Config.ErrorLog = logger
	srv.StartTLS()
	t.Cleanup(srv.Close)
	p.srv = srv

	p.DirectoryURL = srv.URL + wfe.DirectoryPath
	p.ClientRootPool = x509.NewCertPool()
	p.ClientRootPool.AddCert(srv.Certificate())
	return p
}

// Stop takes the ACME server down (a CA outage): its URL then refuses
// connections. The test's cleanup stopping it again is harmless.
func (p *Pebble) Stop() { p.srv.Close() }

// Orders returns how many new-order requests pebble has received.
func (p *Pebble) Orders() int64 { return p.orders.Load() }

// IssuerRootPool returns a pool holding the root that signs the certificates
// pebble issues (generated per run).
func (p *Pebble) IssuerRootPool(t testing.TB) *x509.CertPool {
	t.Helper()
	rec := httptest.NewRecorder()
	p.mgmt.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, wfe.RootCertPath+"0", nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("pebble root: status %d: %s", rec.Code, rec.Body.String())
	}
	block, _ := pem.Decode(rec.Body.Bytes())
	if block == nil {
		t.Fatalf("pebble root: no PEM in %q", rec.Body.String())
	}
	root, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatalf("pebble root: %v", err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(root)
	return pool
}
