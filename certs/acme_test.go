package certs_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/certmagic"

	"github.com/cube-sandbox/cubeproxy/certs"
	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// testLogger discards logs unless CERTS_TEST_LOG is set (then certmagic's
// messages go to the test log too).
func testLogger(t *testing.T) *slog.Logger {
	if os.Getenv("CERTS_TEST_LOG") == "" {
		return slog.New(slog.DiscardHandler)
	}
	return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type tWriter struct{ t *testing.T }

func (w tWriter) Write(p []byte) (int, error) { w.t.Log(string(p)); return len(p), nil }

// allowList is an Allow function over a fixed set of "existing sandboxes"
// that records every name it was asked about.
type allowList struct {
	mu    sync.Mutex
	ok    map[string]bool
	asked []string
}

func (a *allowList) allow(_ context.Context, name string) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.asked = append(a.asked, name)
	if a.ok[name] {
		return nil
	}
	return fmt.Errorf("no sandbox for %s", name)
}

func (a *allowList) wasAsked(name string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Contains(a.asked, name)
}

func (a *allowList) count() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.asked)
}

func acmeConfig(t *testing.T, dnsSrv *testenv.DNSServer, pebble *testenv.Pebble, storage string) certs.Config {
	return certs.Config{
		Source: certs.SourceACME,
		Domain: "cube.test",
		Logger: testLogger(t),
		ACME: certs.ACMEConfig{
			CA:           pebble.DirectoryURL,
			Email:        "ops@cube.test",
			TrustedRoots: pebble.ClientRootPool,
			StorageDir:   storage,
			Sync:         true,
			DNS: certs.DNSConfig{
				Provider: "rfc2136",
				Options: map[string]string{
					"server":     dnsSrv.Addr,
					"key_name":   dnsSrv.KeyName,
					"key_alg":    dnsSrv.KeyAlg,
					"key_secret": dnsSrv.KeySecret,
				},
				Resolvers: []string{dnsSrv.Addr},
				// Checks on: certmagic must see the TXT records over DNS.
				PropagationTimeout: 20 * time.Second,
			},
		},
	}
}

// onDemandConfig is acmeConfig for on-demand issuance alone: no wildcard
// ordered at start, no DNS propagation checks (TestACMEWildcardThroughDNS01
// covers those).
func onDemandConfig(t *testing.T, dnsSrv *testenv.DNSServer, pebble *testenv.Pebble, storage string) certs.Config {
	t.Helper()
	cfg := acmeConfig(t, dnsSrv, pebble, storage)
	cfg.ACME.SkipWildcard = true
	cfg.ACME.OnDemand = true
	cfg.ACME.DNS.PropagationTimeout = -1
	return cfg
}

// startManager starts a certificate manager on cfg, closed when the test
// ends.
func startManager(t *testing.T, cfg certs.Config) *certs.Manager {
	t.Helper()
	m, err := certs.New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })
	return m
}

// Most ACME tests run in parallel, each with its own pebble, DNS server
// and storage. certmagic keeps some state per process, keyed by name: the
// waits that make concurrent handshakes for a name share one obtain or
// load, and the renewal jobs of the cache's maintenance. So each test
// uses on-demand names no other test uses, and only
// TestACMEManagedRenewalKeepsOpenConnections renews through the
// maintenance; obtaining *.cube.test and cube.test at start (ManageSync)
// keys nothing process-wide. A test that sets certmagic's package
// variables stays serial.
func TestACMEWildcardThroughDNS01(t *testing.T) {
	t.Parallel()
	dnsSrv := testenv.StartDNS(t, "cube.test")
	pebble := testenv.StartPebble(t, dnsSrv.Addr)
	storage := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	allow := &allowList{}
	cfg := acmeConfig(t, dnsSrv, pebble, storage)
	cfg.ACME.OnDemand = true // covered names must still never reach Allow
	cfg.Allow = allow.allow
	start := time.Now()
	m, err := certs.New(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("wildcard + apex obtained in %v", time.Since(start))
	orders := pebble.Orders()
	if orders < 1 || dnsSrv.Updates() < 2 {
		t.Fatalf("orders %d, DNS updates %d: the certificates did not come through DNS-01", orders, dnsSrv.Updates())
	}
	testenv.Eventually(t, 5*time.Second, func() error {
		if v := dnsSrv.TXT("_acme-challenge.cube.test"); len(v) != 0 {
			return fmt.Errorf("challenge records not cleaned up: %q", v)
		}
		return nil
	})

	roots := pebble.IssuerRootPool(t)
	srv := serveTLS(t, m)
	tests := []struct {
		name string
		sni  string
		host string
	}{
		{"sandbox host via wildcard", "50005-abc.cube.test", "50005-abc.cube.test"},
		{"apex", "cube.test", "cube.test"},
		{"no SNI gets the wildcard", "", "50005-abc.cube.test"},
		// certmagic maps the SNI through IDNA: these are the names above,
		// and must take the same path (not on-demand, which would ask
		// Allow and renew the wildcard under the client's name).
		{"ideographic full stop", "50005-abc\u3002cube.test", "50005-abc.cube.test"},
		{"full-width full stop and upper case", "50005-ABC\uff0ecube.test", "50005-abc.cube.test"},
		{"trailing space", "50005-abc.cube.test ", "50005-abc.cube.test"},
		// Sandbox ids may hold '_', which IDNA refuses: still the wildcard.
		{"underscore", "50005-a_b.cube.test", "50005-a_b.cube.test"},
		{"underscore, upper case and trailing space", "50005-A_B.cube.test ", "50005-a_b.cube.test"},
		{"apex with ideographic full stop", "cube\u3002test", "cube.test"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := sniConfig(roots, tt.sni)
			if tt.sni != tt.host {
				// The chain is verified for the host the SNI spells.
				cfg = noSNIConfig(roots, tt.host)
				cfg.ServerName = tt.sni
			}
			if _, err := fetch(t, srv.addr, cfg, tt.host); err != nil {
				t.Fatal(err)
			}
			if got := srv.lastSNI(); got != tt.sni {
				t.Fatalf("server saw SNI %q, want %q", got, tt.sni)
			}
		})
	}
	if n := allow.count(); n != 0 {
		t.Fatalf("Allow was consulted %d times for names the wildcard covers: %q", n, allow.asked)
	}
	// A name the wildcard cannot cover goes to on-demand, which asks Allow.
	if _, err := fetch(t, srv.addr, sniConfig(roots, "a.b.cube.test"), "a.b.cube.test"); err == nil {
		t.Fatal("handshake for a refused deep name succeeded")
	}
	if !allow.wasAsked("a.b.cube.test") || pebble.Orders() != orders {
		t.Fatalf("deep name: asked=%v, orders %d -> %d", allow.wasAsked("a.b.cube.test"), orders, pebble.Orders())
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}

	// A restart loads the certificates from storage: no new order.
	m2, err := certs.New(ctx, acmeConfig(t, dnsSrv, pebble, storage))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m2.Close() })
	srv2 := serveTLS(t, m2)
	if _, err := fetch(t, srv2.addr, sniConfig(roots, "50005-abc.cube.test"), "50005-abc.cube.test"); err != nil {
		t.Fatalf("after restart: %v", err)
	}
	if got := pebble.Orders(); got != orders {
		t.Fatalf("restart placed %d new orders; storage did not survive", got-orders)
	}
}

func TestACMEOnDemand(t *testing.T) {
	t.Parallel()
	dnsSrv := testenv.StartDNS(t, "cube.test")
	pebble := testenv.StartPebble(t, dnsSrv.Addr)
	allow := &allowList{ok: map[string]bool{"50005-ok.cube.test": true, "50005-ok2.cube.test": true}}

	cfg := onDemandConfig(t, dnsSrv, pebble, t.TempDir())
	cfg.ACME.OnDemandRate = 1
	cfg.Allow = allow.allow
	m := startManager(t, cfg)
	if pebble.Orders() != 0 {
		t.Fatal("on-demand only: orders placed at start")
	}
	roots := pebble.IssuerRootPool(t)
	srv := serveTLS(t, m)

	tests := []struct {
		name       string
		sni        string
		wantOK     bool
		wantOrders int64 // orders placed by this handshake
	}{
		{"existing sandbox gets a certificate", "50005-ok.cube.test", true, 1},
		{"unknown sandbox is refused without contacting the CA", "50005-unknown.cube.test", false, 0},
		{"second issuance in the minute is rate limited", "50005-ok2.cube.test", false, 0},
		{"issued certificate is served from memory", "50005-ok.cube.test", true, 0},
		{"no SNI has no default certificate", "", false, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := pebble.Orders()
			cfg := sniConfig(roots, tt.sni)
			if tt.sni == "" {
				cfg = noSNIConfig(roots, "50005-ok.cube.test")
			}
			_, err := fetch(t, srv.addr, cfg, "50005-ok.cube.test")
			if tt.wantOK && err != nil {
				t.Fatalf("handshake failed: %v", err)
			}
			if !tt.wantOK && err == nil {
				t.Fatal("handshake succeeded, want refusal")
			}
			if got := pebble.Orders() - before; got != tt.wantOrders {
				t.Fatalf("pebble received %d new orders, want %d", got, tt.wantOrders)
			}
			if tt.sni != "" && !allow.wasAsked(tt.sni) && tt.wantOrders > 0 {
				t.Fatalf("Allow was not consulted for %s", tt.sni)
			}
		})
	}
	for _, name := range []string{"50005-unknown.cube.test", "50005-ok2.cube.test"} {
		if !allow.wasAsked(name) {
			t.Errorf("Allow was not consulted for %s", name)
		}
	}
}

// A CA outage must not stop a proxy with sync set from starting when its
// stored certificates are still valid: a restart inside the renewal
// window (here: always, with 30-minute certificates) used to fail because
// the synchronous renewal could not reach the CA. With nothing stored,
// sync still refuses to start without a certificate.
func TestACMESyncStartDuringCAOutage(t *testing.T) {
	t.Parallel()
	dnsSrv := testenv.StartDNS(t, "cube.test")
	pebble := testenv.StartPebbleWith(t, dnsSrv.Addr, testenv.PebbleOptions{Validity: 30 * time.Minute})
	storage := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	cfg := acmeConfig(t, dnsSrv, pebble, storage)
	cfg.ACME.DNS.PropagationTimeout = -1 // propagation checks are covered above
	m, err := certs.New(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	roots := pebble.IssuerRootPool(t)
	issued, err := fetch(t, serveTLS(t, m).addr, sniConfig(roots, "50005-abc.cube.test"), "50005-abc.cube.test")
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	pebble.Stop()

	tests := []struct {
		name    string
		storage string
		wantErr bool
	}{
		{"valid stored certificates are served", storage, false},
		{"nothing stored: no certificate, no start", t.TempDir(), true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, err := certs.New(ctx, acmeConfig(t, dnsSrv, pebble, tt.storage))
			if tt.wantErr {
				if err == nil {
					_ = m.Close()
					t.Fatal("started with no certificate and the CA down")
				}
				return
			}
			if err != nil {
				t.Fatalf("restart during a CA outage: %v", err)
			}
			t.Cleanup(func() { _ = m.Close() })
			for _, cfg := range []*tls.Config{sniConfig(roots, "50005-abc.cube.test"), noSNIConfig(roots, "50005-abc.cube.test")} {
				leaf, err := fetch(t, serveTLS(t, m).addr, cfg, "50005-abc.cube.test")
				if err != nil {
					t.Fatal(err)
				}
				if leaf.SerialNumber.Cmp(issued.SerialNumber) != 0 {
					t.Fatalf("served serial %v, want the stored %v", leaf.SerialNumber, issued.SerialNumber)
				}
			}
		})
	}
}

// A CA that accepts connections and never answers (a firewall or load
// balancer in front of it holding them) must not hold a sync start either
// while the stored certificates are valid: they are served at once and
// renewed in the background. The start renewed them first, and certmagic
// gives each request 30 s, three times: 90 s per certificate, three
// minutes of a restarted proxy without listeners (measured), long enough
// for a startup probe to kill it and start over.
func TestACMESyncStartDuringSilentCA(t *testing.T) {
	t.Parallel()
	dnsSrv := testenv.StartDNS(t, "cube.test")
	pebble := testenv.StartPebbleWith(t, dnsSrv.Addr, testenv.PebbleOptions{Validity: 30 * time.Minute})
	upstream := strings.TrimSuffix(strings.TrimPrefix(pebble.DirectoryURL, "https://"), "/dir")
	var silent atomic.Bool
	relay := testenv.ServeTCP(t, func(c net.Conn) {
		if silent.Load() {
			return // held open until the test ends, never answered
		}
		up, err := net.Dial("tcp", upstream)
		if err != nil {
			_ = c.Close()
			return
		}
		go func() { _, _ = io.Copy(up, c); _ = up.Close() }()
		_, _ = io.Copy(c, up)
		_ = c.Close()
	})
	storage := t.TempDir()
	cfg := acmeConfig(t, dnsSrv, pebble, storage)
	cfg.ACME.CA = "https://" + relay.Addr().String() + "/dir"
	cfg.ACME.DNS.PropagationTimeout = -1 // propagation checks are covered above
	m, err := certs.New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	roots := pebble.IssuerRootPool(t)
	issued, err := fetch(t, serveTLS(t, m).addr, sniConfig(roots, "50005-abc.cube.test"), "50005-abc.cube.test")
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}

	silent.Store(true)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	start := time.Now()
	m, err = certs.New(ctx, cfg)
	took := time.Since(start)
	if err != nil {
		t.Fatalf("restart with a silent CA: %v after %v", err, took)
	}
	t.Cleanup(func() { _ = m.Close() })
	if took > 5*time.Second {
		t.Fatalf("restart with valid stored certificates and a silent CA took %v", took)
	}
	leaf, err := fetch(t, serveTLS(t, m).addr, sniConfig(roots, "50005-abc.cube.test"), "50005-abc.cube.test")
	if err != nil {
		t.Fatal(err)
	}
	if leaf.SerialNumber.Cmp(issued.SerialNumber) != 0 {
		t.Fatalf("served serial %v, want the stored %v", leaf.SerialNumber, issued.SerialNumber)
	}
}

// A stored certificate that expired is no reason to start: a sync start
// renews it before listening, or fails when the CA is down, as with
// nothing stored.
func TestACMESyncStartWithExpiredStoredCertificate(t *testing.T) {
	t.Parallel()
	for _, caDown := range []bool{false, true} {
		t.Run(fmt.Sprintf("CA down %v", caDown), func(t *testing.T) {
			t.Parallel()
			dnsSrv := testenv.StartDNS(t, "cube.test")
			// NotAfter 2 s after issue (see TestACMEOnDemandExpiredRenewalDuringCAOutage).
			pebble := testenv.StartPebbleWith(t, dnsSrv.Addr, testenv.PebbleOptions{Validity: 3 * time.Second})
			cfg := acmeConfig(t, dnsSrv, pebble, t.TempDir())
			cfg.ACME.DNS.PropagationTimeout = -1 // propagation checks are covered above
			m, err := certs.New(context.Background(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			c, err := dial(serveTLS(t, m).addr, &tls.Config{ServerName: "50005-abc.cube.test", InsecureSkipVerify: true, NextProtos: []string{"http/1.1"}})
			if err != nil {
				t.Fatal(err)
			}
			first := c.leaf()
			c.close()
			if err := m.Close(); err != nil {
				t.Fatal(err)
			}
			time.Sleep(time.Until(first.NotAfter) + time.Second)
			if caDown {
				pebble.Stop()
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			m, err = certs.New(ctx, cfg)
			if caDown {
				if err == nil {
					_ = m.Close()
					t.Fatal("started with an expired certificate and the CA down")
				}
				return
			}
			if err != nil {
				t.Fatalf("restart with an expired stored certificate: %v", err)
			}
			t.Cleanup(func() { _ = m.Close() })
			c, err = dial(serveTLS(t, m).addr, &tls.Config{ServerName: "50005-abc.cube.test", InsecureSkipVerify: true, NextProtos: []string{"http/1.1"}})
			if err != nil {
				t.Fatal(err)
			}
			defer c.close()
			if c.leaf().SerialNumber.Cmp(first.SerialNumber) == 0 {
				t.Fatal("served the expired certificate, want it renewed at start")
			}
		})
	}
}

// On-demand issuance without a DNS provider (skip_wildcard) validates by
// TLS-ALPN-01, which the CA checks on port 443 of the name: the proxy's
// HTTPS listener behind a TCP port mapping (the platform listens on :8080).
// The challenge must be answered there, by the listener's own TLS config.
// certmagic otherwise opens a challenge server of its own on port 443 (a
// listener the operator never configured; as the image's non-root user a
// "permission denied" that fails every issuance) or, finding the port
// taken, dials whatever holds it and assumes that answers the challenge.
// The test puts a recorder on certmagic's challenge port: nothing may
// touch it, and the certificate must come through the HTTPS listener.
func TestACMEOnDemandTLSALPNOnTheHTTPSListener(t *testing.T) {
	dnsSrv := testenv.StartDNS(t, "cube.test")
	var touched atomic.Int32
	recorder := testenv.ServeTCP(t, func(c net.Conn) {
		touched.Add(1)
		_ = c.Close()
	})
	old := certmagic.HTTPSPort
	certmagic.HTTPSPort = recorder.Addr().(*net.TCPAddr).Port
	t.Cleanup(func() { certmagic.HTTPSPort = old })

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	pebble := testenv.StartPebbleWith(t, dnsSrv.Addr, testenv.PebbleOptions{TLSPort: ln.Addr().(*net.TCPAddr).Port})
	allow := &allowList{ok: map[string]bool{"50005-alpn.cube.test": true}}
	cfg := acmeConfig(t, dnsSrv, pebble, t.TempDir())
	cfg.ACME.DNS = certs.DNSConfig{}
	cfg.ACME.SkipWildcard = true
	cfg.ACME.OnDemand = true
	cfg.Allow = allow.allow
	cfg.ListenAddr = ln.Addr().String()
	m := startManager(t, cfg)
	srv := serveTLSOn(t, m, ln)

	leaf, err := fetch(t, srv.addr, sniConfig(pebble.IssuerRootPool(t), "50005-alpn.cube.test"), "50005-alpn.cube.test")
	if err != nil {
		t.Fatalf("on-demand certificate through TLS-ALPN-01: %v", err)
	}
	if !slices.Equal(leaf.DNSNames, []string{"50005-alpn.cube.test"}) {
		t.Fatalf("certificate names %v", leaf.DNSNames)
	}
	if n := touched.Load(); n != 0 {
		t.Fatalf("certmagic reached for its own challenge port %d times: the challenge must be answered on the HTTPS listener", n)
	}
}

// An order the CA refuses (here: DNS-01 for a domain the DNS provider
// cannot write) fails the handshake at once, and the name then waits
// before its next order. Before, certmagic retried inside the handshake
// (a minute, then two, within 180 s): the client's handshake and every
// other one for the name hung that long, each retry spent the on-demand
// budget, and handshakes for the name kept placing orders the moment the
// last one gave up, starving the names that work.
func TestACMEOnDemandFailedOrderBacksOff(t *testing.T) {
	t.Parallel()
	dnsSrv := testenv.StartDNS(t, "cube.test")
	pebble := testenv.StartPebble(t, dnsSrv.Addr)
	allow := &allowList{ok: map[string]bool{"50005-bad.nozone.test": true, "50005-good.cube.test": true}}
	cfg := onDemandConfig(t, dnsSrv, pebble, t.TempDir())
	cfg.ACME.OnDemandRate = 2
	cfg.Allow = allow.allow
	m := startManager(t, cfg)
	roots := pebble.IssuerRootPool(t)
	srv := serveTLS(t, m)

	tests := []struct {
		name       string
		sni        string
		wantOK     bool
		wantOrders int64
	}{
		{"failing name: one order, handshake fails at once", "50005-bad.nozone.test", false, 1},
		{"failing name again: refused without an order", "50005-bad.nozone.test", false, 0},
		{"and again", "50005-bad.nozone.test", false, 0},
		{"a working name still has budget", "50005-good.cube.test", true, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := pebble.Orders()
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			d := tls.Dialer{Config: sniConfig(roots, tt.sni)}
			c, err := d.DialContext(ctx, "tcp", srv.addr)
			if ctx.Err() != nil {
				t.Fatalf("handshake held for %v: the failed order is being retried inside it", 20*time.Second)
			}
			if c != nil {
				_ = c.Close()
			}
			if (err == nil) != tt.wantOK {
				t.Fatalf("handshake error %v, want success %v", err, tt.wantOK)
			}
			if got := pebble.Orders() - before; got != tt.wantOrders {
				t.Fatalf("pebble received %d new orders, want %d", got, tt.wantOrders)
			}
		})
	}
}

// Closing the source ends a handshake waiting on an on-demand order: the
// proxy's shutdown closes it before the drain, which otherwise waited for
// the order (certmagic bounds one at 180 s, retries included) up to
// drain_timeout. The CA here accepts connections and never answers.
func TestACMECloseEndsPendingOrder(t *testing.T) {
	ca := testenv.StartSilentServer(t)
	allow := &allowList{ok: map[string]bool{"50005-pending.cube.test": true}}
	m, err := certs.New(context.Background(), certs.Config{
		Source: certs.SourceACME,
		Domain: "cube.test",
		Logger: testLogger(t),
		Allow:  allow.allow,
		ACME: certs.ACMEConfig{
			CA:           "http://" + ca.Addr + "/dir",
			Email:        "ops@cube.test",
			StorageDir:   t.TempDir(),
			SkipWildcard: true,
			OnDemand:     true,
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })
	srv := serveTLS(t, m)

	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		d := tls.Dialer{Config: &tls.Config{ServerName: "50005-pending.cube.test", InsecureSkipVerify: true}}
		c, err := d.DialContext(ctx, "tcp", srv.addr)
		if err == nil {
			_ = c.Close()
		}
		if ctx.Err() != nil {
			err = ctx.Err()
		}
		done <- err
	}()
	select {
	case <-ca.Reached:
	case err := <-done:
		t.Fatalf("handshake ended before the order reached the CA: %v", err)
	case <-time.After(20 * time.Second):
		t.Fatal("the on-demand order never reached the CA")
	}
	closed := time.Now()
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err == nil || errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("handshake after Close: %v, want refused", err)
		}
		t.Logf("handshake refused %v after Close: %v", time.Since(closed), err)
	case <-time.After(10 * time.Second):
		t.Fatal("Close left the handshake waiting on the order")
	}
}

// With the wildcard skipped (on-demand only) there is no default
// certificate to wait for: Ready is nil from the start, even while the CA
// never answers, or /readyz would hold such a proxy at 503
// certificate_pending for good.
func TestACMEReadyWithoutWildcard(t *testing.T) {
	ca := testenv.StartSilentServer(t)
	m, err := certs.New(context.Background(), certs.Config{
		Source: certs.SourceACME,
		Domain: "cube.test",
		Logger: testLogger(t),
		Allow:  (&allowList{ok: map[string]bool{}}).allow,
		ACME: certs.ACMEConfig{
			CA:           "http://" + ca.Addr + "/dir",
			Email:        "ops@cube.test",
			StorageDir:   t.TempDir(),
			SkipWildcard: true,
			OnDemand:     true,
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })
	if err := m.Ready(); err != nil {
		t.Fatalf("Ready = %v; want nil (no wildcard to wait for)", err)
	}
	if at := m.EarliestExpiry(); !at.IsZero() {
		t.Fatalf("EarliestExpiry = %v with no managed certificate; want none", at)
	}
}

// Close returns after certmagic let go of its storage lock: an obtain in
// flight at shutdown used to go on unwinding after Close, so a proxy
// exiting then left a lock file behind that a restarted proxy sharing the
// storage waited on, and a job queued before the cancel could create one
// after Close. The CA here accepts connections and never answers, so the
// managed obtain holds its lock until Close.
func TestACMECloseReleasesStorageLock(t *testing.T) {
	ca := testenv.StartSilentServer(t)
	storage := t.TempDir()
	m, err := certs.New(context.Background(), certs.Config{
		Source: certs.SourceACME,
		Domain: "cube.test",
		Logger: testLogger(t),
		ACME: certs.ACMEConfig{
			CA:         "http://" + ca.Addr + "/dir",
			Email:      "ops@cube.test",
			StorageDir: storage,
			DNS:        certs.DNSConfig{Provider: "rfc2136", Options: map[string]string{"server": "127.0.0.1:53"}},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })
	select {
	case <-ca.Reached:
	case <-time.After(20 * time.Second):
		t.Fatal("the managed order never reached the CA")
	}
	lockFiles := func() []string {
		files, _ := filepath.Glob(filepath.Join(storage, "locks", "*.lock"))
		return files
	}
	if len(lockFiles()) == 0 {
		t.Fatal("no lock file while the order is in flight: the test no longer sees what it checks")
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	if files := lockFiles(); len(files) != 0 {
		t.Fatalf("lock files left after Close: %v", files)
	}
}

// A certificate whose OCSP responder accepts connections and never
// answers (a private CA's responder that hangs) must not hold up the
// start, the handshakes or the shutdown. certmagic fetched the staple
// with http.DefaultClient, which has no timeout, whenever it loaded a
// certificate (after an order, from storage, at a renewal) and from the
// maintenance goroutine that also runs the renewals: a sync start never
// returned, and a hung fetch in maintenance stopped every later renewal
// and then Close, which waits for that goroutine.
func TestACMEHungOCSPResponder(t *testing.T) {
	t.Parallel()
	ocsp := testenv.StartSilentServer(t)
	dnsSrv := testenv.StartDNS(t, "cube.test")
	pebble := testenv.StartPebbleWith(t, dnsSrv.Addr, testenv.PebbleOptions{OCSPResponderURL: "http://" + ocsp.Addr + "/"})
	cfg := acmeConfig(t, dnsSrv, pebble, t.TempDir())
	cfg.ACME.DNS.PropagationTimeout = -1 // propagation checks are covered above

	type result struct {
		m   *certs.Manager
		err error
	}
	started := make(chan result, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		m, err := certs.New(ctx, cfg)
		started <- result{m, err}
	}()
	var m *certs.Manager
	select {
	case r := <-started:
		if r.err != nil {
			t.Fatal(r.err)
		}
		m = r.m
	case <-time.After(30 * time.Second):
		reached := "no"
		select {
		case <-ocsp.Reached:
			reached = "yes"
		default:
		}
		t.Fatalf("sync start still blocked after 30 s (OCSP responder reached: %s)", reached)
	}
	leaf, err := fetch(t, serveTLS(t, m).addr, sniConfig(pebble.IssuerRootPool(t), "50005-abc.cube.test"), "50005-abc.cube.test")
	if err != nil {
		t.Fatal(err)
	}
	if len(leaf.OCSPServer) == 0 {
		t.Fatal("issued certificate names no OCSP responder: the test no longer sees what it checks")
	}
	closed := make(chan error, 1)
	go func() { closed <- m.Close() }()
	select {
	case err := <-closed:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Close still blocked after 10 s")
	}
}

// An on-demand certificate that expired (its sandbox saw no handshake in
// its renewal window: paused for days, with short-lived certificates) is
// renewed during the next handshake, which waits for it. With the CA down,
// that renewal failing held the handshake up to certmagic's 90 s (and
// handshakes behind it up to 2 minutes), and the next handshake started
// another renewal against the CA at once. It must fail the handshake at
// once and back the name off, as a failed new order does; with the CA up,
// the handshake gets the renewed certificate.
func TestACMEOnDemandExpiredRenewalDuringCAOutage(t *testing.T) {
	t.Parallel()
	dnsSrv := testenv.StartDNS(t, "cube.test")
	// The test waits out two certificates, so they are short: NotAfter 2 s
	// after issue (6 s took 12 s of waiting). The checks tell them apart
	// by serial, expired or not.
	pebble := testenv.StartPebbleWith(t, dnsSrv.Addr, testenv.PebbleOptions{Validity: 3 * time.Second})
	allow := &allowList{ok: map[string]bool{"50005-expiring.cube.test": true}}
	cfg := onDemandConfig(t, dnsSrv, pebble, t.TempDir())
	cfg.Allow = allow.allow
	m := startManager(t, cfg)
	srv := serveTLS(t, m)
	// Expired certificates fail verification: the serial tells them apart.
	cfgTLS := &tls.Config{ServerName: "50005-expiring.cube.test", InsecureSkipVerify: true, NextProtos: []string{"http/1.1"}}
	handshake := func() (*tls.Conn, time.Duration, error) {
		start := time.Now()
		c, err := dial(srv.addr, cfgTLS)
		if err != nil {
			return nil, time.Since(start), err
		}
		c.close()
		return c.conn, time.Since(start), nil
	}
	c, _, err := handshake()
	if err != nil {
		t.Fatal(err)
	}
	first := c.ConnectionState().PeerCertificates[0]

	time.Sleep(time.Until(first.NotAfter) + time.Second)
	c, took, err := handshake()
	if err != nil {
		t.Fatalf("expired certificate, CA up: %v", err)
	}
	renewed := c.ConnectionState().PeerCertificates[0]
	if renewed.SerialNumber.Cmp(first.SerialNumber) == 0 {
		t.Fatal("expired certificate, CA up: served the expired one, want it renewed")
	}
	t.Logf("expired certificate renewed in the handshake in %v", took)

	time.Sleep(time.Until(renewed.NotAfter) + time.Second)
	pebble.Stop()
	for i := range 2 {
		c, took, err := handshake()
		if err == nil {
			t.Fatalf("handshake %d with the CA down: served serial %v (expired %v)", i, c.ConnectionState().PeerCertificates[0].SerialNumber, renewed.NotAfter)
		}
		if took > 10*time.Second {
			t.Fatalf("handshake %d with the CA down held %v: %v", i, took, err)
		}
		t.Logf("handshake %d with the CA down refused after %v: %v", i, took, err)
	}
}

// The managed certificates are renewed by the cache's maintenance (every
// 10 minutes; RenewNow runs one pass) while connections stay open: the
// open ones keep their session and go on serving, new handshakes get the
// renewed certificate. A renewal that fails (CA down) keeps the current
// certificate served and is logged for the operator.
//
// The 30-minute certificates are due for renewal as soon as they are
// issued: certmagic renews any with less than five maintenance intervals
// (50 minutes) left, whatever its ARI window or renewal ratio say. The
// test used to sleep into a third of a 15 s lifetime, twice (20 s).
//
// certmagic remembers a failed maintenance renewal process-wide, keyed by
// the certificate's name ("renew_*.cube.test"), and skips the name for a
// minute: a second run in the same process (-count=2) found its renewal
// skipped and failed. Each run manages a domain of its own.
func TestACMEManagedRenewalKeepsOpenConnections(t *testing.T) {
	t.Parallel()
	const validity = 30 * time.Minute
	domain := fmt.Sprintf("r%x.cube.test", rand.Uint64())
	dnsSrv := testenv.StartDNS(t, domain)
	pebble := testenv.StartPebbleWith(t, dnsSrv.Addr, testenv.PebbleOptions{Validity: validity})
	cfg := acmeConfig(t, dnsSrv, pebble, t.TempDir())
	cfg.Domain = domain
	cfg.ACME.DNS.PropagationTimeout = -1 // propagation checks are covered above
	logs := &logRecorder{}
	cfg.Logger = slog.New(logs)
	ctx := t.Context()
	m, err := certs.New(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })
	roots := pebble.IssuerRootPool(t)
	srv := serveTLS(t, m)
	host := "50005-abc." + domain
	var open []*client
	for range 20 {
		c, err := dial(srv.addr, sniConfig(roots, host))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(c.close)
		open = append(open, c)
	}
	first := open[0].leaf()
	apex, err := fetch(t, srv.addr, sniConfig(roots, domain), domain)
	if err != nil {
		t.Fatal(err)
	}
	// The alert's date: the managed certificate that expires first.
	earliest := func(a, b *x509.Certificate) time.Time {
		if a.NotAfter.Before(b.NotAfter) {
			return a.NotAfter
		}
		return b.NotAfter
	}
	if got, want := m.EarliestExpiry(), earliest(first, apex); !got.Equal(want) {
		t.Fatalf("EarliestExpiry %v, want %v (wildcard %v, apex %v)", got, want, first.NotAfter, apex.NotAfter)
	}

	if err := certs.RenewNow(ctx, m); err != nil {
		t.Fatal(err)
	}
	var renewed *x509.Certificate
	// Generous: the renewal runs in certmagic's job queue, on a machine
	// the parallel tests load.
	testenv.Eventually(t, 15*time.Second, func() error {
		leaf, err := fetch(t, srv.addr, sniConfig(roots, host), host)
		if err != nil {
			return err
		}
		if leaf.SerialNumber.Cmp(first.SerialNumber) == 0 {
			return errors.New("new handshakes still get the first certificate")
		}
		renewed = leaf
		return nil
	})
	for i, c := range open {
		if _, err := c.get(host); err != nil {
			t.Fatalf("connection %d opened before the renewal: %v", i, err)
		}
	}
	// Moved by the renewal (of the apex too, renewed in the same pass).
	testenv.Eventually(t, 15*time.Second, func() error {
		apex, err := fetch(t, srv.addr, sniConfig(roots, domain), domain)
		if err != nil {
			return err
		}
		if got, want := m.EarliestExpiry(), earliest(renewed, apex); !got.Equal(want) {
			return fmt.Errorf("EarliestExpiry after the renewal %v, want %v", got, want)
		}
		return nil
	})

	pebble.Stop()
	// certmagic queues one renewal job per name: a pass right after the
	// renewal above may find its job not quite returned and skip the
	// name. Pass again until the failure is logged: the line certmagic's
	// renewal (logger "renew") writes for the CA's failure, naming the
	// certificate that serves host, the wildcard. Any error line passed
	// before, whatever had failed.
	const failed = "could not get certificate from issuer"
	wildcard := "*." + domain
	passes := 0
	testenv.Eventually(t, 15*time.Second, func() error {
		passes++
		if err := certs.RenewNow(ctx, m); err != nil {
			return err
		}
		if !logs.has(slog.LevelError, failed, map[string]string{"logger": "renew", "identifier": wildcard}) {
			return fmt.Errorf("no error %q (logger renew, identifier %s) was logged for the failed renewal", failed, wildcard)
		}
		t.Logf("logged after %d maintenance passes", passes)
		return nil
	})
	leaf, err := fetch(t, srv.addr, sniConfig(roots, host), host)
	if err != nil {
		t.Fatalf("after a failed renewal: %v", err)
	}
	if leaf.SerialNumber.Cmp(renewed.SerialNumber) != 0 {
		t.Fatalf("after a failed renewal: serial %v, want the current %v", leaf.SerialNumber, renewed.SerialNumber)
	}
}

// certmagic's maintenance leaves on-demand certificates to the handshakes,
// so the certificate of a sandbox that was deleted stayed in memory until
// the process ended (4.6 KB each measured, up to on_demand_rate a minute).
// The hourly sweep drops those whose name Allow refuses as no sandbox's,
// whether obtained or loaded from storage, and keeps the others; a name
// that comes back loads its certificate from storage without an order.
func TestACMEOnDemandSweepDropsDeletedSandboxes(t *testing.T) {
	t.Parallel()
	dnsSrv := testenv.StartDNS(t, "cube.test")
	pebble := testenv.StartPebble(t, dnsSrv.Addr)
	var sandboxes sync.Map
	const a, b = "50005-a.cube.test", "50005-b.cube.test"
	sandboxes.Store(a, true)
	sandboxes.Store(b, true)
	cfg := onDemandConfig(t, dnsSrv, pebble, t.TempDir())
	cfg.Allow = func(_ context.Context, name string) error {
		if _, ok := sandboxes.Load(name); !ok {
			return fmt.Errorf("%w: no sandbox for %s", certs.ErrUnknownName, name)
		}
		return nil
	}
	m := startManager(t, cfg)
	srv := serveTLS(t, m)
	roots := pebble.IssuerRootPool(t)
	for _, name := range []string{a, b} {
		if _, err := fetch(t, srv.addr, sniConfig(roots, name), name); err != nil {
			t.Fatal(err)
		}
	}
	orders := pebble.Orders()

	steps := []struct {
		name        string
		deleted     bool   // a is deleted before the sweep
		handshake   bool   // a handshake for a before the sweep
		wantDropped int    // by the sweep
		wantCached  [2]int // a, b after the sweep
	}{
		{"every name is a sandbox's", false, false, 0, [2]int{1, 1}},
		{"a deleted", true, false, 1, [2]int{0, 1}},
		{"a back: loaded from storage, kept", false, true, 0, [2]int{1, 1}},
		{"a deleted again: the loaded one is dropped too", true, false, 1, [2]int{0, 1}},
	}
	for _, st := range steps {
		if st.deleted {
			sandboxes.Delete(a)
		} else {
			sandboxes.Store(a, true)
		}
		if st.handshake {
			if _, err := fetch(t, srv.addr, sniConfig(roots, a), a); err != nil {
				t.Fatalf("%s: %v", st.name, err)
			}
		}
		if got := certs.SweepNow(t.Context(), m); got != st.wantDropped {
			t.Errorf("%s: sweep dropped %d names, want %d", st.name, got, st.wantDropped)
		}
		for i, name := range []string{a, b} {
			if got := certs.CachedCertificates(m, name); got != st.wantCached[i] {
				t.Errorf("%s: %d certificates for %s in memory, want %d", st.name, got, name, st.wantCached[i])
			}
		}
	}
	if got := pebble.Orders(); got != orders {
		t.Fatalf("%d new orders: a name back from the sweep must load its certificate from storage", got-orders)
	}
}

// Every on-demand name served leaves its certificate, key and metadata in
// storage_dir (16 KB on disk), and nothing deleted them: the directory
// grew with every sandbox. Storage cleaning deletes the certificates that
// expired more than the grace period ago (14 days in production, 0 here)
// and keeps the valid ones.
func TestACMEOnDemandStorageCleaning(t *testing.T) {
	t.Parallel()
	const validity = 4 * time.Second
	dnsSrv := testenv.StartDNS(t, "cube.test")
	pebble := testenv.StartPebbleWith(t, dnsSrv.Addr, testenv.PebbleOptions{Validity: validity})
	storage := t.TempDir()
	cfg := onDemandConfig(t, dnsSrv, pebble, storage)
	cfg.Allow = func(context.Context, string) error { return nil }
	m := startManager(t, cfg)
	srv := serveTLS(t, m)
	insecure := func(name string) *tls.Config {
		return &tls.Config{ServerName: name, InsecureSkipVerify: true, NextProtos: []string{"http/1.1"}}
	}
	stored := func(name string) []string {
		files, _ := filepath.Glob(filepath.Join(storage, "certificates", "*", name, "*"))
		return files
	}
	const expired, valid = "50005-old.cube.test", "50005-new.cube.test"
	c, err := dial(srv.addr, insecure(expired))
	if err != nil {
		t.Fatal(err)
	}
	c.close()
	time.Sleep(time.Until(c.leaf().NotAfter) + time.Second)
	if c, err = dial(srv.addr, insecure(valid)); err != nil {
		t.Fatal(err)
	}
	c.close()
	if len(stored(expired)) == 0 || len(stored(valid)) == 0 {
		t.Fatalf("stored before cleaning: %q, %q; want both certificates", stored(expired), stored(valid))
	}
	if err := certs.CleanStorageNow(t.Context(), m, 0); err != nil {
		t.Fatal(err)
	}
	if files := stored(expired); len(files) != 0 {
		t.Errorf("expired certificate still stored: %q", files)
	}
	if files := stored(valid); len(files) != 3 {
		t.Errorf("valid certificate: stored %q, want its certificate, key and metadata", files)
	}
}

// Close ends an on-demand renewal running in the background (a handshake
// found the certificate in its renewal window and was served it), as it
// ends every other order: certmagic gives that renewal a context of its
// own (5 minutes, not the handshake's), so Close waited out its 5 s for
// the storage lock, reported it still held, and left the lock file (and
// the challenge's TXT record) to a restarted proxy. Here the DNS server
// the renewal must write its TXT record to never answers.
func TestACMECloseEndsBackgroundOnDemandRenewal(t *testing.T) {
	t.Parallel()
	dnsSrv := testenv.StartDNS(t, "cube.test")
	// 30-minute certificates are due for renewal as soon as issued.
	pebble := testenv.StartPebbleWith(t, dnsSrv.Addr, testenv.PebbleOptions{Validity: 30 * time.Minute})
	storage := t.TempDir()
	// certmagic keys renewals in flight process-wide by name: one of its
	// own per run (-count=2).
	name := fmt.Sprintf("50005-bgrenew%x.cube.test", rand.Uint32())
	allow := &allowList{ok: map[string]bool{name: true}}
	cfg := onDemandConfig(t, dnsSrv, pebble, storage)
	cfg.Allow = allow.allow
	tlsCfg := &tls.Config{ServerName: name, InsecureSkipVerify: true, NextProtos: []string{"http/1.1"}}

	// A first process obtains the certificate into the storage.
	first, err := certs.New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	c, err := dial(serveTLS(t, first).addr, tlsCfg)
	if err != nil {
		t.Fatal(err)
	}
	c.close()
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}

	// A second one, whose DNS provider hangs, loads it and renews it in
	// the background.
	silent, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = silent.Close() })
	cfg.ACME.DNS.Options = maps.Clone(cfg.ACME.DNS.Options)
	cfg.ACME.DNS.Options["server"] = silent.LocalAddr().String()
	m, err := certs.New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })
	c, err = dial(serveTLS(t, m).addr, tlsCfg)
	if err != nil {
		t.Fatalf("handshake during the background renewal: %v", err)
	}
	c.close()
	lockFiles := func() []string {
		files, _ := filepath.Glob(filepath.Join(storage, "locks", "*.lock"))
		return files
	}
	deadline := time.Now().Add(20 * time.Second)
	for len(lockFiles()) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no renewal took its lock: the test no longer sees what it checks")
		}
		time.Sleep(10 * time.Millisecond)
	}
	start := time.Now()
	if err := m.Close(); err != nil {
		t.Fatalf("Close after %v: %v", time.Since(start), err)
	}
	if files := lockFiles(); len(files) != 0 {
		t.Fatalf("lock files left after Close: %v", files)
	}
}

// An on-demand certificate in memory whose renewal information (ARI) is
// due for a refresh (certmagic asks the CA every Retry-After, 6 hours at
// Let's Encrypt) is refreshed from the handshakes that serve it: each one
// starts a refresh in the background unless one runs. With the CA down,
// the first handshake after a failed refresh started another (about 8 s
// of retries, nine connections to the CA and some fourteen warning and
// error lines each): a busy sandbox host kept a CA in an outage busy and
// flooded the log. Refreshes of a certificate are spaced out; the
// handshakes go on being served.
func TestACMEOnDemandARIRefreshDuringCAOutage(t *testing.T) {
	t.Parallel()
	dnsSrv := testenv.StartDNS(t, "cube.test")
	pebble := testenv.StartPebble(t, dnsSrv.Addr)
	storage := t.TempDir()
	// certmagic keys work in flight process-wide by name (-count=2).
	name := fmt.Sprintf("50005-ari%x.cube.test", rand.Uint32())
	cfg := onDemandConfig(t, dnsSrv, pebble, storage)
	cfg.Allow = (&allowList{ok: map[string]bool{name: true}}).allow
	tlsCfg := &tls.Config{ServerName: name, InsecureSkipVerify: true, NextProtos: []string{"http/1.1"}}

	first, err := certs.New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	c, err := dial(serveTLS(t, first).addr, tlsCfg)
	if err != nil {
		t.Fatal(err)
	}
	c.close()
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}

	// The stored renewal information is due for a refresh, as it is
	// every 6 hours.
	metas, _ := filepath.Glob(filepath.Join(storage, "certificates", "*", name, name+".json"))
	if len(metas) != 1 {
		t.Fatalf("stored metadata: %q", metas)
	}
	meta, err := os.ReadFile(metas[0])
	if err != nil {
		t.Fatal(err)
	}
	var res struct {
		SANs       []string       `json:"sans"`
		IssuerData map[string]any `json:"issuer_data"`
	}
	if err := json.Unmarshal(meta, &res); err != nil {
		t.Fatal(err)
	}
	ari, ok := res.IssuerData["renewal_info"].(map[string]any)
	if !ok {
		t.Fatalf("no renewal information stored: %s", meta)
	}
	ari["_retryAfter"] = time.Now().Add(-time.Minute).Format(time.RFC3339)
	if meta, err = json.Marshal(res); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(metas[0], meta, 0o600); err != nil {
		t.Fatal(err)
	}

	pebble.Stop()
	logs := &logRecorder{}
	cfg.Logger = slog.New(logs)
	m := startManager(t, cfg)
	srv := serveTLS(t, m)
	// Each handshake's refresh ends in one of these lines: it failed, or
	// it found the refresh taken (by another, or spaced out). Each
	// handshake waits for the refresh of the one before it to end.
	const failed, taken = "updating ARI", "attempted to obtain ARI lock but it was already taken"
	const handshakes = 3
	for i := range handshakes {
		c, err := dial(srv.addr, tlsCfg)
		if err != nil {
			t.Fatalf("handshake %d with the CA down: %v", i, err)
		}
		c.close()
		testenv.Eventually(t, 30*time.Second, func() error {
			if n := logs.count(failed) + logs.count(taken); n <= i {
				return fmt.Errorf("the refresh of handshake %d did not end", i)
			}
			return nil
		})
	}
	if n := logs.count(failed); n != 1 {
		t.Fatalf("%d handshakes asked the CA that is down for renewal information, want 1", n)
	}
}

// A handshake over the on-demand budget for a name Allow accepts fails at
// once, and the refusals are logged as one warning a minute (README). It
// went as far as certmagic's order before the budget refused it: a storage
// check (a 10 KB file written, synced and deleted) and a lock file in
// storage_dir, and five info lines (obtaining twice, acquiring the lock,
// lock acquired, releasing it), for every handshake a client retried. A name
// whose certificate is stored still loads it over the budget.
func TestACMEOnDemandOverBudgetRefusedBeforeTheOrder(t *testing.T) {
	t.Parallel()
	dnsSrv := testenv.StartDNS(t, "cube.test")
	pebble := testenv.StartPebble(t, dnsSrv.Addr)
	// certmagic keys work in flight process-wide by name (-count=2).
	id := rand.Uint32()
	first, over := fmt.Sprintf("50005-first%x.cube.test", id), fmt.Sprintf("50005-over%x.cube.test", id)
	var sandboxes sync.Map
	sandboxes.Store(first, true)
	sandboxes.Store(over, true)
	cfg := onDemandConfig(t, dnsSrv, pebble, t.TempDir())
	cfg.ACME.OnDemandRate = 1
	cfg.Allow = func(_ context.Context, name string) error {
		if _, ok := sandboxes.Load(name); !ok {
			return fmt.Errorf("%w: no sandbox for %s", certs.ErrUnknownName, name)
		}
		return nil
	}
	logs := &logRecorder{}
	cfg.Logger = slog.New(logs)
	m := startManager(t, cfg)
	srv := serveTLS(t, m)
	insecure := func(name string) *tls.Config {
		return &tls.Config{ServerName: name, InsecureSkipVerify: true, NextProtos: []string{"http/1.1"}}
	}
	c, err := dial(srv.addr, insecure(first))
	if err != nil {
		t.Fatal(err)
	}
	c.close()

	logs.reset()
	const handshakes = 5
	for i := range handshakes {
		if c, err := dial(srv.addr, insecure(over)); err == nil {
			c.close()
			t.Fatalf("handshake %d over the budget succeeded", i)
		}
	}
	var lines []string
	for _, rec := range logs.all() {
		if rec.Level >= slog.LevelInfo {
			lines = append(lines, rec.Level.String()+" "+rec.Message)
		}
	}
	want := []string{"WARN on-demand certificate issuance rate limit reached; refusing new certificates (logged at most once a minute)"}
	if !slices.Equal(lines, want) {
		t.Fatalf("%d handshakes over the budget logged %q, want %q", handshakes, lines, want)
	}

	// first's certificate leaves memory (its sandbox gone at a sweep) and
	// comes back from storage, still over the budget.
	sandboxes.Delete(first)
	if got := certs.SweepNow(t.Context(), m); got != 1 {
		t.Fatalf("sweep dropped %d names, want 1", got)
	}
	sandboxes.Store(first, true)
	orders := pebble.Orders()
	if c, err = dial(srv.addr, insecure(first)); err != nil {
		t.Fatalf("stored certificate over the budget: %v", err)
	}
	c.close()
	if got := pebble.Orders(); got != orders {
		t.Fatalf("%d new orders: the stored certificate must be loaded", got-orders)
	}
}
