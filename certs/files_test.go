package certs_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/certs"
	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

func TestFilesSourceServesBySNIAndReloads(t *testing.T) {
	dir := t.TempDir()
	wild := certs.FilePair{CertFile: filepath.Join(dir, "wild.crt"), KeyFile: filepath.Join(dir, "wild.key")}
	other := certs.FilePair{CertFile: filepath.Join(dir, "other.crt"), KeyFile: filepath.Join(dir, "other.key")}
	ca := testenv.NewCA(t, "test CA")
	wildLeaf := ca.WritePair(t, wild.CertFile, wild.KeyFile, "cube.test", "*.cube.test")
	otherLeaf := ca.WritePair(t, other.CertFile, other.KeyFile, "api.other.test")

	m, err := certs.New(context.Background(), certs.Config{
		Source:         certs.SourceFiles,
		Files:          []certs.FilePair{wild, other},
		ReloadInterval: 20 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })
	srv := serveTLS(t, m)

	tests := []struct {
		name    string
		cfgSNI  string // "" sends no SNI
		host    string
		wantSNI string // what the server saw
		want    serial
	}{
		{"wildcard by SNI", "50005-abc.cube.test", "50005-abc.cube.test", "50005-abc.cube.test", serialOf(wildLeaf)},
		{"apex by SNI", "cube.test", "cube.test", "cube.test", serialOf(wildLeaf)},
		{"second pair by SNI", "api.other.test", "api.other.test", "api.other.test", serialOf(otherLeaf)},
		{"no SNI gets the first pair", "", "50005-abc.cube.test", "", serialOf(wildLeaf)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := sniConfig(ca.Pool(), tt.cfgSNI)
			if tt.cfgSNI == "" {
				cfg = noSNIConfig(ca.Pool(), tt.host)
			}
			leaf, err := fetch(t, srv.addr, cfg, tt.host)
			if err != nil {
				t.Fatal(err)
			}
			if got := serialOf(leaf); got != tt.want {
				t.Fatalf("served serial %s, want %s", got, tt.want)
			}
			if got := srv.lastSNI(); got != tt.wantSNI {
				t.Fatalf("server saw SNI %q, want %q", got, tt.wantSNI)
			}
		})
	}

	// An open connection made before the swap keeps working afterwards.
	open, err := dial(srv.addr, sniConfig(ca.Pool(), "50005-abc.cube.test"))
	if err != nil {
		t.Fatal(err)
	}
	defer open.close()

	// Replace the wildcard files with a certificate from another CA; no restart.
	ca2 := testenv.NewCA(t, "second CA")
	newLeaf := ca2.WritePair(t, wild.CertFile, wild.KeyFile, "cube.test", "*.cube.test")
	testenv.Eventually(t, 5*time.Second, func() error {
		leaf, err := fetch(t, srv.addr, sniConfig(ca2.Pool(), "50005-abc.cube.test"), "50005-abc.cube.test")
		if err != nil {
			return err
		}
		if serialOf(leaf) != serialOf(newLeaf) {
			return errString("old certificate still served")
		}
		return nil
	})
	leaf, err := fetch(t, srv.addr, noSNIConfig(ca2.Pool(), "50005-abc.cube.test"), "50005-abc.cube.test")
	if err != nil || serialOf(leaf) != serialOf(newLeaf) {
		t.Fatalf("no-SNI after reload: err %v", err)
	}
	if _, err := fetch(t, srv.addr, sniConfig(ca.Pool(), "api.other.test"), "api.other.test"); err != nil {
		t.Fatalf("untouched pair after reload: %v", err)
	}

	if _, err := open.get("50005-abc.cube.test"); err != nil {
		t.Fatalf("connection opened before the reload: %v", err)
	}
	if serialOf(open.leaf()) != serialOf(wildLeaf) {
		t.Fatal("open connection's certificate changed")
	}
}

type serial string

func serialOf(c *x509.Certificate) serial { return serial(c.SerialNumber.String()) }

type errString string

func (e errString) Error() string { return string(e) }

// validityWarning is what the files source logs for a certificate outside
// its validity period.
const validityWarning = "tls certificate is outside its validity period; clients will refuse it"

// A certificate file outside its validity still loads (refusing it would
// take HTTPS down over a renewal that went wrong), but the operator is
// warned at start and at reload: before, only an info line gave not_after.
func TestFilesWarnOutsideValidity(t *testing.T) {
	ca := testenv.NewCA(t, "test CA")
	now := time.Now()
	valid := [2]time.Time{now.Add(-time.Hour), now.Add(time.Hour)}
	tests := []struct {
		name        string
		validity    [2]time.Time
		wantWarning bool
	}{
		{"valid", valid, false},
		{"expired", [2]time.Time{now.Add(-48 * time.Hour), now.Add(-time.Hour)}, true},
		{"not yet valid", [2]time.Time{now.Add(time.Hour), now.Add(48 * time.Hour)}, true},
	}
	for _, tt := range tests {
		for _, atReload := range []bool{false, true} {
			if atReload && !tt.wantWarning {
				continue // a valid certificate is loaded first in every reload case
			}
			name := tt.name + " at start"
			if atReload {
				name = tt.name + " at reload"
			}
			t.Run(name, func(t *testing.T) {
				dir := t.TempDir()
				pair := certs.FilePair{CertFile: filepath.Join(dir, "c.pem"), KeyFile: filepath.Join(dir, "k.pem")}
				write := func(v [2]time.Time) {
					certPEM, keyPEM := ca.IssueValid(t, v[0], v[1], "*.cube.test")
					if err := os.WriteFile(pair.KeyFile, keyPEM, 0o600); err != nil {
						t.Fatal(err)
					}
					if err := os.WriteFile(pair.CertFile, certPEM, 0o600); err != nil {
						t.Fatal(err)
					}
				}
				first := tt.validity
				if atReload {
					first = valid
				}
				write(first)
				rec := &logRecorder{}
				m, err := certs.New(context.Background(), certs.Config{
					Source: certs.SourceFiles, Files: []certs.FilePair{pair},
					ReloadInterval: 10 * time.Millisecond, Logger: slog.New(rec),
				})
				if err != nil {
					t.Fatalf("a certificate outside its validity must still load: %v", err)
				}
				t.Cleanup(func() { _ = m.Close() })
				if !atReload {
					if got := slices.Contains(rec.warnings(), validityWarning); got != tt.wantWarning {
						t.Fatalf("warned %v, want %v (warnings %q)", got, tt.wantWarning, rec.warnings())
					}
					return
				}
				write(tt.validity)
				testenv.Eventually(t, 5*time.Second, func() error {
					if !slices.Contains(rec.warnings(), validityWarning) {
						return errString("no warning after the reload")
					}
					return nil
				})
			})
		}
	}
}

// A certificate that expires while it is served (the renewal pipeline
// broke, the file never changed) is warned about when it expires:
// before, a file was checked only when it was loaded, so a proxy up for
// months never said why every client started refusing it.
func TestFilesWarnWhenServedCertificateExpires(t *testing.T) {
	t.Parallel()
	now := time.Now()
	leaf, rec := servedFrom(t, now.Add(-time.Hour), now.Add(2*time.Second))
	testenv.Eventually(t, 10*time.Second, func() error {
		if !slices.Contains(rec.warnings(), validityWarning) {
			return errString("no warning after the certificate expired")
		}
		return nil
	})
	// Judged by the warning's own time, not by when the test looks: a
	// stalled test could otherwise look only after the expiry.
	if at := rec.firstAt(validityWarning); at.Before(leaf.NotAfter) {
		t.Fatalf("warned at %s, while the certificate was valid until %s", at, leaf.NotAfter)
	}
}

// servedFrom starts the files source on a pair for *.cube.test valid from
// notBefore to notAfter, logging to the recorder it returns with the
// pair's leaf.
func servedFrom(t *testing.T, notBefore, notAfter time.Time) (*x509.Certificate, *logRecorder) {
	t.Helper()
	ca := testenv.NewCA(t, "test CA")
	dir := t.TempDir()
	pair := certs.FilePair{CertFile: filepath.Join(dir, "c.pem"), KeyFile: filepath.Join(dir, "k.pem")}
	certPEM, keyPEM := ca.IssueValid(t, notBefore, notAfter, "*.cube.test")
	if err := os.WriteFile(pair.KeyFile, keyPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(pair.CertFile, certPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	leaf, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	rec := &logRecorder{}
	m, err := certs.New(context.Background(), certs.Config{
		Source: certs.SourceFiles, Files: []certs.FilePair{pair},
		ReloadInterval: 10 * time.Millisecond, Logger: slog.New(rec),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })
	return leaf.Leaf, rec
}

// A certificate loaded before its NotBefore (written by a CA whose clock
// runs ahead of the node's, or staged early) is warned about at load; its
// expiry must still be warned about when it comes. The warning at load
// counted as the expiry's, and the lapse went unlogged.
func TestFilesWarnAtExpiryOfCertificateLoadedEarly(t *testing.T) {
	t.Parallel()
	now := time.Now()
	// x509 keeps whole seconds, and the load must come before NotBefore
	// on a loaded machine too: 5 s ahead.
	leaf, rec := servedFrom(t, now.Add(5*time.Second), now.Add(6*time.Second))
	if at := rec.firstAt(validityWarning); at.IsZero() || !at.Before(leaf.NotBefore) {
		t.Fatalf("warned at %v, want a warning at load, before %s", at, leaf.NotBefore)
	}
	testenv.Eventually(t, 15*time.Second, func() error {
		if rec.count(validityWarning) < 2 {
			return errString("no warning after the certificate expired")
		}
		return nil
	})
}

// Several pairs may cover one name: an ECDSA and an RSA certificate for
// the same names (as nginx serves both), or a renewed certificate listed
// next to one that expired. The first listed always won: clients without
// ECDSA failed the handshake though an RSA pair was configured, and an
// expired pair shadowed a valid one. Now the first the client can use and
// that is within its validity wins; among equals, the first listed.
func TestFilesChooseAmongPairsForOneName(t *testing.T) {
	dir := t.TempDir()
	ca := testenv.NewCA(t, "test CA")
	write := func(name string, certPEM, keyPEM []byte) certs.FilePair {
		return writePair(t, dir, name, certPEM, keyPEM)
	}
	now := time.Now()
	ecdsaPEM, ecdsaKey := ca.Issue(t, "cube.test", "*.cube.test")
	rsaPEM, rsaKey := ca.IssueRSA(t, "cube.test", "*.cube.test")
	expiredPEM, expiredKey := ca.IssueValid(t, now.Add(-48*time.Hour), now.Add(-time.Hour), "api.cube.test")
	m, err := certs.New(context.Background(), certs.Config{
		Source: certs.SourceFiles,
		Files: []certs.FilePair{
			write("ecdsa", ecdsaPEM, ecdsaKey),
			write("rsa", rsaPEM, rsaKey),
			write("expired", expiredPEM, expiredKey),
		},
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })
	srv := serveTLS(t, m)

	tests := []struct {
		name    string
		sni     string
		edit    func(*tls.Config)
		wantKey x509.PublicKeyAlgorithm
		wantDNS string
	}{
		{"a modern client gets the first listed", "50005-abc.cube.test", nil, x509.ECDSA, "*.cube.test"},
		{"a client without ECDSA gets the RSA pair", "50005-abc.cube.test", rsaOnly, x509.RSA, "*.cube.test"},
		{"an expired exact pair does not shadow a valid wildcard", "api.cube.test", nil, x509.ECDSA, "*.cube.test"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := sniConfig(ca.Pool(), tt.sni)
			if tt.edit != nil {
				tt.edit(cfg)
			}
			leaf, err := fetch(t, srv.addr, cfg, tt.sni)
			if err != nil {
				t.Fatal(err)
			}
			if leaf.PublicKeyAlgorithm != tt.wantKey || !slices.Contains(leaf.DNSNames, tt.wantDNS) {
				t.Fatalf("served %v certificate for %v, want %v for %s", leaf.PublicKeyAlgorithm, leaf.DNSNames, tt.wantKey, tt.wantDNS)
			}
		})
	}
}

// EarliestExpiry follows the pairs as served: the soonest NotAfter among
// them, moved by a renewal once it loads, and not by a renewal that fails
// to load (the old pair is still what clients get: the date an alert must
// see).
func TestFilesEarliestExpiry(t *testing.T) {
	t.Parallel()
	ca := testenv.NewCA(t, "test CA")
	dir := t.TempDir()
	now := time.Now().Truncate(time.Second)
	write := func(p certs.FilePair, notAfter time.Time, name string) {
		t.Helper()
		certPEM, keyPEM := ca.IssueValid(t, now.Add(-time.Hour), notAfter, name)
		if err := os.WriteFile(p.KeyFile, keyPEM, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p.CertFile, certPEM, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	soon := certs.FilePair{CertFile: filepath.Join(dir, "a.crt"), KeyFile: filepath.Join(dir, "a.key")}
	later := certs.FilePair{CertFile: filepath.Join(dir, "b.crt"), KeyFile: filepath.Join(dir, "b.key")}
	write(soon, now.Add(48*time.Hour), "*.cube.test")
	write(later, now.Add(90*24*time.Hour), "api.other.test")
	rec := &logRecorder{}
	m, err := certs.New(context.Background(), certs.Config{
		Source: certs.SourceFiles, Files: []certs.FilePair{later, soon}, ReloadInterval: 10 * time.Millisecond,
		Logger: slog.New(rec),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })
	if got, want := m.EarliestExpiry(), now.Add(48*time.Hour); !got.Equal(want) {
		t.Fatalf("earliest expiry %v, want the second pair's %v", got, want)
	}

	// A renewal whose key is not written yet fails to load: unchanged.
	certPEM, _ := ca.IssueValid(t, now.Add(-time.Hour), now.Add(60*24*time.Hour), "*.cube.test")
	if err := os.WriteFile(soon.CertFile, certPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 5*time.Second, func() error {
		if rec.count("tls certificate reload failed; keeping the previous one") == 0 {
			return errString("the half-written renewal was not read")
		}
		return nil
	})
	if got, want := m.EarliestExpiry(), now.Add(48*time.Hour); !got.Equal(want) {
		t.Fatalf("after a renewal that did not load: %v, want the pair still served, %v", got, want)
	}
	// Whole: the first pair is now the one that expires first.
	write(soon, now.Add(120*24*time.Hour), "*.cube.test")
	testenv.Eventually(t, 5*time.Second, func() error {
		if got, want := m.EarliestExpiry(), now.Add(90*24*time.Hour); !got.Equal(want) {
			return fmt.Errorf("after the renewal: %v, want %v", got, want)
		}
		return nil
	})
}

// A client that sends no SNI (it dials the node's IP) or a name no pair
// covers gets the default certificate, the first pair's, and so must get
// the same choice among the pairs for the first pair's names as a client
// that names them: nginx chooses by the client among the certificates of
// its default server too. The first listed always won: behind an ECDSA
// pair with an RSA one for the same names, a client without ECDSA failed
// the handshake, and an expired pair listed before its renewal was served.
func TestFilesDefaultChoosesAmongPairsForTheFirstsNames(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ca := testenv.NewCA(t, "test CA")
	write := func(name string, certPEM, keyPEM []byte) certs.FilePair {
		return writePair(t, dir, name, certPEM, keyPEM)
	}
	now := time.Now()
	expiredPEM, expiredKey := ca.IssueValid(t, now.Add(-48*time.Hour), now.Add(-time.Hour), "cube.test", "*.cube.test")
	ecdsaPEM, ecdsaKey := ca.Issue(t, "cube.test", "*.cube.test")
	rsaPEM, rsaKey := ca.IssueRSA(t, "*.cube.test", "cube.test", "api.cube.test")
	otherPEM, otherKey := ca.IssueRSA(t, "api.other.test")
	m, err := certs.New(context.Background(), certs.Config{
		Source: certs.SourceFiles,
		Files: []certs.FilePair{
			write("expired", expiredPEM, expiredKey),
			write("ecdsa", ecdsaPEM, ecdsaKey),
			write("rsa", rsaPEM, rsaKey),
			write("other", otherPEM, otherKey),
		},
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })
	srv := serveTLS(t, m)

	tests := []struct {
		name    string
		cfg     *tls.Config
		edit    func(*tls.Config)
		wantKey x509.PublicKeyAlgorithm
	}{
		{"no SNI: the valid pair, not the expired one listed first", noSNIConfig(ca.Pool(), "50005-abc.cube.test"), nil, x509.ECDSA},
		{"no SNI, a client without ECDSA: the RSA pair", noSNIConfig(ca.Pool(), "50005-abc.cube.test"), rsaOnly, x509.RSA},
		{"a name no pair covers, a client without ECDSA: the RSA pair", noSNIConfig(ca.Pool(), "50005-abc.cube.test"), func(c *tls.Config) {
			rsaOnly(c)
			c.ServerName = "unknown.example"
		}, x509.RSA},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.edit != nil {
				tt.edit(tt.cfg)
			}
			leaf, err := fetch(t, srv.addr, tt.cfg, "50005-abc.cube.test")
			if err != nil {
				t.Fatal(err)
			}
			if leaf.PublicKeyAlgorithm != tt.wantKey || !slices.Contains(leaf.DNSNames, "*.cube.test") {
				t.Fatalf("served %v certificate for %v, want %v for *.cube.test", leaf.PublicKeyAlgorithm, leaf.DNSNames, tt.wantKey)
			}
		})
	}
}

// writePair writes a PEM pair into dir as name.crt and name.key.
func writePair(t *testing.T, dir, name string, certPEM, keyPEM []byte) certs.FilePair {
	t.Helper()
	p := certs.FilePair{CertFile: filepath.Join(dir, name+".crt"), KeyFile: filepath.Join(dir, name+".key")}
	if err := os.WriteFile(p.CertFile, certPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p.KeyFile, keyPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// rsaOnly makes a client that cannot use ECDSA: TLS 1.2 with an RSA suite
// alone (TLS 1.3 would negotiate by signature schemes, not suites).
func rsaOnly(c *tls.Config) {
	c.MaxVersion = tls.VersionTLS12
	c.CipherSuites = []uint16{tls.TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256}
}
