package certs_test

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/cube-sandbox/cubeproxy/certs"
	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

func TestTLSConfigProtocols(t *testing.T) {
	m, err := certs.New(context.Background(), certs.Config{Source: certs.SourceSelfSigned, Domain: "cube.test"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })
	if got := m.TLSConfig().NextProtos; !slices.Equal(got, []string{"http/1.1", "http/1.0"}) {
		t.Fatalf("NextProtos = %q, want exactly http/1.1 and http/1.0", got)
	}
	// TLS 1.2 suites with forward secrecy and AEAD only, as the README
	// promises: a CBC or RSA key exchange suite added to the list would
	// pass every handshake below (the clients there prefer better ones).
	for _, id := range m.TLSConfig().CipherSuites {
		name := tls.CipherSuiteName(id)
		if !strings.HasPrefix(name, "TLS_ECDHE_") || !strings.Contains(name, "_GCM_") && !strings.Contains(name, "_CHACHA20_POLY1305") {
			t.Errorf("cipher suite %s offered, want ECDHE with AEAD only", name)
		}
	}
	srv := serveTLS(t, m)

	tests := []struct {
		name      string
		protos    []string
		maxVer    uint16
		wantProto string
		wantErr   bool
	}{
		{"browser offers h2 and http/1.1", []string{"h2", "http/1.1"}, 0, "http/1.1", false},
		{"no ALPN", nil, 0, "", false},
		{"h2 only is refused", []string{"h2"}, 0, "", true},
		// curl --http1.0 offers http/1.0 alone; nginx accepts it, and
		// the handshake failed here with no_application_protocol.
		{"http/1.0 only", []string{"http/1.0"}, 0, "http/1.0", false},
		{"http/1.1 preferred to http/1.0", []string{"http/1.0", "http/1.1"}, 0, "http/1.1", false},
		{"TLS 1.2 accepted", []string{"http/1.1"}, tls.VersionTLS12, "http/1.1", false},
		{"TLS 1.1 refused", []string{"http/1.1"}, tls.VersionTLS11, "", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := dial(srv.addr, &tls.Config{
				InsecureSkipVerify: true,
				ServerName:         "x.cube.test",
				NextProtos:         tt.protos,
				MinVersion:         tls.VersionTLS10,
				MaxVersion:         tt.maxVer,
			})
			if tt.wantErr {
				if err == nil {
					c.close()
					t.Fatal("handshake succeeded, want failure")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer c.close()
			if got := c.conn.ConnectionState().NegotiatedProtocol; got != tt.wantProto {
				t.Fatalf("ALPN %q, want %q", got, tt.wantProto)
			}
			if _, err := c.get("x.cube.test"); err != nil {
				t.Fatal(err)
			}
		})
	}

	t.Run("session resumption", func(t *testing.T) {
		cfg := &tls.Config{InsecureSkipVerify: true, ServerName: "x.cube.test", ClientSessionCache: tls.NewLRUClientSessionCache(4)}
		for i, wantResumed := range []bool{false, true} {
			c, err := dial(srv.addr, cfg)
			if err != nil {
				t.Fatal(err)
			}
			// TLS 1.3 tickets arrive after the handshake; a request reads them.
			if _, err := c.get("x.cube.test"); err != nil {
				t.Fatal(err)
			}
			if got := c.conn.ConnectionState().DidResume; got != wantResumed {
				t.Fatalf("connection %d resumed = %v, want %v", i, got, wantResumed)
			}
			c.close()
		}
	})
}

func TestNewRejectsBadConfig(t *testing.T) {
	dir := t.TempDir()
	notPEM := filepath.Join(dir, "junk.pem")
	if err := os.WriteFile(notPEM, []byte("junk"), 0o600); err != nil {
		t.Fatal(err)
	}
	// readOnly is a directory this process cannot write, as the image's
	// non-root user finds / when storage_dir is no writable volume.
	readOnly := filepath.Join(dir, "ro")
	if err := os.Mkdir(readOnly, 0o500); err != nil {
		t.Fatal(err)
	}
	if os.Geteuid() == 0 {
		// Root writes there anyway; /proc takes no new file from anyone.
		readOnly = "/proc"
	}
	// acme starts from a valid configuration (it never gets to contact the
	// CA because each case breaks one thing) and applies edit.
	acme := func(edit func(c *certs.Config)) certs.Config {
		c := certs.Config{
			Source: certs.SourceACME,
			Domain: "cube.test",
			Allow:  func(context.Context, string) error { return nil },
			ACME: certs.ACMEConfig{
				Email:      "ops@cube.test",
				StorageDir: dir,
				DNS: certs.DNSConfig{Provider: "rfc2136", Options: map[string]string{
					"server": "127.0.0.1:53", "key_name": "k.", "key_secret": "c2VjcmV0",
				}},
			},
		}
		edit(&c)
		return c
	}
	files := func(pairs ...certs.FilePair) certs.Config {
		return certs.Config{Source: certs.SourceFiles, Files: pairs}
	}
	// A good pair listed first, and another pair's certificate: a bad
	// pair's error names its settings, tls.files[1] here.
	ca, pairs := testenv.NewCA(t, "ca"), t.TempDir() // dir is checked for what CheckACME leaves
	good := certs.FilePair{CertFile: filepath.Join(pairs, "good.crt"), KeyFile: filepath.Join(pairs, "good.key"), Setting: "tls"}
	ca.WritePair(t, good.CertFile, good.KeyFile, "cube.test")
	other := filepath.Join(pairs, "other.crt")
	ca.WritePair(t, other, filepath.Join(pairs, "other.key"), "other.test")
	missing := filepath.Join(pairs, "none.pem")
	second := func(cert, key string) certs.Config {
		return files(good, certs.FilePair{CertFile: cert, KeyFile: key, Setting: "tls.files[1]"})
	}
	tests := []struct {
		name    string
		cfg     certs.Config
		wantErr string
	}{
		{"unknown source", certs.Config{Source: "magic"}, "unknown source"},
		{"files without pairs", files(), "at least one"},
		{"missing file", files(certs.FilePair{CertFile: filepath.Join(dir, "x.crt"), KeyFile: filepath.Join(dir, "x.key")}), "cert_file: stat " + filepath.Join(dir, "x.crt")},
		{"bad PEM", files(certs.FilePair{CertFile: notPEM, KeyFile: notPEM}), "load"},
		// The path alone named neither the setting nor which pair.
		{"missing certificate file", second(missing, good.KeyFile), "tls certificates: tls.files[1].cert_file: stat " + missing + ": no such file"},
		{"missing key file", second(good.CertFile, missing), "tls certificates: tls.files[1].key_file: stat " + missing + ": no such file"},
		{"top-level pair", files(certs.FilePair{CertFile: missing, KeyFile: good.KeyFile, Setting: "tls"}), "tls certificates: tls.cert_file: stat " + missing},
		{"certificate not PEM", second(notPEM, good.KeyFile), "tls certificates: tls.files[1].cert_file + tls.files[1].key_file: load " + notPEM + " + " + good.KeyFile + ": "},
		{"key of another certificate", second(other, good.KeyFile), "tls certificates: tls.files[1].cert_file + tls.files[1].key_file: load " + other + " + " + good.KeyFile + ": tls: private key does not match public key"},
		{"acme without domain", acme(func(c *certs.Config) { c.Domain = "" }), "tls.domain is empty"},
		{"acme wildcard without DNS", acme(func(c *certs.Config) { c.ACME.DNS.Provider = "" }), "DNS-01"},
		{"acme nothing to manage", acme(func(c *certs.Config) { c.ACME.SkipWildcard = true }), "tls.acme.skip_wildcard is on but tls.acme.on_demand is off"},
		{"on-demand without Allow", acme(func(c *certs.Config) { c.ACME.OnDemand, c.Allow = true, nil }), "Allow"},
		{"acme without email", acme(func(c *certs.Config) { c.ACME.Email = "" }), "tls.acme.email is empty"},
		// The CA would refuse these contacts at the first order, after the
		// proxy listens; check passed them.
		{"acme email not an address", acme(func(c *certs.Config) { c.ACME.Email = "ops" }), `tls.acme.email "ops": want one bare address`},
		{"acme email with a scheme", acme(func(c *certs.Config) { c.ACME.Email = "mailto:ops@cube.test" }), `tls.acme.email "mailto:ops@cube.test"`},
		{"acme email with a name", acme(func(c *certs.Config) { c.ACME.Email = "Ops <ops@cube.test>" }), `tls.acme.email "Ops <ops@cube.test>"`},
		{"acme email list", acme(func(c *certs.Config) { c.ACME.Email = "ops@cube.test,dev@cube.test" }), "want one bare address"},
		{"acme without storage", acme(func(c *certs.Config) { c.ACME.StorageDir = "" }), "tls.acme.storage_dir is empty"},
		// certmagic would find these only at its first order, after the
		// proxy listens, and never retry: HTTPS without a certificate.
		{"acme storage is a file", acme(func(c *certs.Config) { c.ACME.StorageDir = notPEM }), "is not a directory"},
		{"acme storage under a file", acme(func(c *certs.Config) { c.ACME.StorageDir = filepath.Join(notPEM, "certmagic") }), "is not a directory"},
		{"acme storage not writable", acme(func(c *certs.Config) { c.ACME.StorageDir = filepath.Join(readOnly, "certmagic") }), "cannot be created in " + readOnly + " (certificates could not be stored): "},
		// An existing directory the process cannot write (a volume mounted
		// read-only, one owned by root) is named as such.
		{"acme storage exists, not writable", acme(func(c *certs.Config) { c.ACME.StorageDir = readOnly }), "tls.acme.storage_dir " + readOnly + " is not writable (certificates could not be stored): "},
		{"unknown DNS provider", acme(func(c *certs.Config) { c.ACME.DNS.Provider = "route66" }), `tls.acme.dns.provider "route66" is unknown (known: rfc2136)`},
		{"rfc2136 without server", acme(func(c *certs.Config) { delete(c.ACME.DNS.Options, "server") }), "server"},
		{"rfc2136 option typo", acme(func(c *certs.Config) { c.ACME.DNS.Options["keyname"] = "k." }), `tls.acme.dns.options: unknown option "keyname"`},
		{"rfc2136 bad algorithm", acme(func(c *certs.Config) { c.ACME.DNS.Options["key_alg"] = "md5" }), "algorithm"},
		{"rfc2136 missing secret file", acme(func(c *certs.Config) { c.ACME.DNS.Options["key_secret_file"] = filepath.Join(dir, "nope") }), "key_secret_file"},
		{"bad trusted roots", acme(func(c *certs.Config) { c.ACME.TrustedRootsFile = notPEM }), "tls.acme.trusted_roots_file: no certificate in"},
		// certmagic refuses these at every order, not at start.
		{"plain http CA", acme(func(c *certs.Config) { c.ACME.CA = "http://acme.example.com/directory" }), "requires https"},
		{"unparsable CA", acme(func(c *certs.Config) { c.ACME.CA = "https://acme.example.com:port/directory" }), "tls.acme.ca: "},
		// certmagic takes these, and every order then fails on "no Host
		// in request URL"; check passed them.
		{"CA without a host", acme(func(c *certs.Config) { c.ACME.CA = "https://" }), `tls.acme.ca "https://" names no host`},
		{"CA that is a path", acme(func(c *certs.Config) { c.ACME.CA = "/directory" }), `tls.acme.ca "/directory" names no host`},
		{"CA with a port alone", acme(func(c *certs.Config) { c.ACME.CA = "https://:14000/dir" }), "names no host"},
		// The updates would go unsigned, and the DNS server refuse them
		// at the first order, after the proxy listens.
		{"rfc2136 secret without key name", acme(func(c *certs.Config) { delete(c.ACME.DNS.Options, "key_name") }),
			"tls.acme.dns.options: key_secret is set but key_name is empty: the updates would go unsigned"},
		{"rfc2136 algorithm without key name", acme(func(c *certs.Config) {
			delete(c.ACME.DNS.Options, "key_name")
			delete(c.ACME.DNS.Options, "key_secret")
			c.ACME.DNS.Options["key_alg"] = "hmac-sha512"
		}), "tls.acme.dns.options: key_alg is set but key_name is empty"},
		{"rfc2136 negative timeout", acme(func(c *certs.Config) { c.ACME.DNS.Options["timeout"] = "-5s" }), "timeout must not be negative"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.cfg.Source == certs.SourceACME {
				// check must refuse what serve refuses.
				if err := certs.CheckACME(tt.cfg); err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("CheckACME: %v, want an error mentioning %q", err, tt.wantErr)
				}
			}
			m, err := certs.New(context.Background(), tt.cfg)
			if err == nil {
				_ = m.Close()
				t.Fatal("New succeeded")
			}
			if !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("error %q does not mention %q", err, tt.wantErr)
			}
			// The name of the probe file check tried would only puzzle.
			if strings.Contains(err.Error(), ".cubeproxy-storage-check") {
				t.Errorf("error %q names the probe file", err)
			}
		})
	}
	// A storage directory that does not exist yet is fine where it can be
	// created, and checking it creates nothing (check must leave no trace).
	fresh := filepath.Join(dir, "new", "certmagic")
	if err := certs.CheckACME(acme(func(c *certs.Config) { c.ACME.StorageDir = fresh })); err != nil {
		t.Errorf("CheckACME with a storage_dir still to create: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "new")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("CheckACME left %s behind (stat: %v)", filepath.Join(dir, "new"), err)
	}
	if entries, err := os.ReadDir(dir); err != nil || len(entries) != 2 {
		t.Errorf("CheckACME left files in %s: %v (%v)", dir, entries, err)
	}
	// The provider's words take any case, as tls.acme.dns.provider and
	// key_alg always did.
	for _, net := range []string{"TCP", "Udp"} {
		if err := certs.CheckACME(acme(func(c *certs.Config) { c.ACME.DNS.Provider, c.ACME.DNS.Options["net"] = "RFC2136", net })); err != nil {
			t.Errorf("CheckACME with provider RFC2136, net %s: %v", net, err)
		}
	}
	// Any other word is refused quoted as written, as every word setting
	// is (the README's promise), not in the lower case it was compared in.
	if err := certs.CheckACME(acme(func(c *certs.Config) { c.ACME.DNS.Options["net"] = "Sctp" })); err == nil || !strings.Contains(err.Error(), `net must be udp or tcp, got "Sctp"`) {
		t.Errorf("CheckACME with net Sctp: %v", err)
	}
	// What certmagic accepts stays accepted: a URL without a scheme
	// (https assumed), plain http to an internal CA.
	for _, ca := range []string{"acme.example.com/directory", "http://127.0.0.1:14000/dir", "http://10.0.0.5/dir", "http://localhost/dir"} {
		if err := certs.CheckACME(acme(func(c *certs.Config) { c.ACME.CA = ca })); err != nil {
			t.Errorf("CheckACME with ca %s: %v", ca, err)
		}
	}
}

// TestALPNRefusalLogged checks that a handshake refused for its ALPN list
// (a gRPC or other HTTP/2-only client: the alert no_application_protocol)
// leaves a debug line, as a refused server name does: without one an
// operator whose gRPC clients fail saw nothing in the log at any level.
func TestALPNRefusalLogged(t *testing.T) {
	rec := &logRecorder{}
	m, err := certs.New(context.Background(), certs.Config{Source: certs.SourceSelfSigned, Domain: "cube.test", Logger: slog.New(rec)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })
	srv := serveTLS(t, m)
	const msg = "tls handshake refused: the client offers no protocol the proxy speaks (HTTP/2 is not supported)"
	tests := []struct {
		protos  []string
		refused bool
	}{
		{[]string{"h2", "http/1.1"}, false},
		{nil, false},
		{[]string{"h2"}, true},
	}
	for _, tt := range tests {
		c, err := dial(srv.addr, &tls.Config{InsecureSkipVerify: true, ServerName: "x.cube.test", NextProtos: tt.protos})
		if err == nil {
			// TLS 1.3: the client's handshake ends before the server's
			// checks; a read shows the server's alert.
			_, err = c.get("x.cube.test")
			c.close()
		}
		if (err != nil) != tt.refused {
			t.Fatalf("ALPN %q: handshake error %v, want refused %v", tt.protos, err, tt.refused)
		}
		if logged := !rec.firstAt(msg).IsZero(); logged != tt.refused {
			t.Fatalf("ALPN %q: logged %q = %v, want %v", tt.protos, msg, logged, tt.refused)
		}
	}
	for _, r := range rec.records {
		if r.Message != msg {
			continue
		}
		var offered string
		r.Attrs(func(a slog.Attr) bool {
			if a.Key == "offered" {
				offered = a.Value.String()
			}
			return true
		})
		if r.Level != slog.LevelDebug || offered != "[h2]" {
			t.Fatalf("logged at %v with offered=%q, want DEBUG and [h2]", r.Level, offered)
		}
	}
}

// TestACMEChallengeHandshakeFromStranger checks that a ClientHello shaped
// as a TLS-ALPN-01 validation (ALPN acme-tls/1 alone) for a name no order
// is for is refused quietly. Before, any client got an error line per
// handshake, for any server name (certmagic looked the name up in the
// storage and logged its absence), even with DNS-01, which never uses
// TLS-ALPN-01: a log anyone could flood.
func TestACMEChallengeHandshakeFromStranger(t *testing.T) {
	tests := []struct {
		name    string
		dns     certs.DNSConfig
		wantErr string // the alert the client reads
	}{
		{"dns-01", certs.DNSConfig{Provider: "rfc2136", Options: map[string]string{"server": "127.0.0.1:53"}}, "no application protocol"},
		{"tls-alpn-01", certs.DNSConfig{}, "unrecognized name"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec := &logRecorder{}
			m, err := certs.New(context.Background(), certs.Config{
				Source: certs.SourceACME, Domain: "cube.test", Logger: slog.New(rec),
				Allow: func(_ context.Context, name string) error {
					return fmt.Errorf("%w: %s", certs.ErrUnknownName, name)
				},
				ACME: certs.ACMEConfig{
					CA: "https://127.0.0.1:1/dir", Email: "ops@cube.test", StorageDir: t.TempDir(),
					SkipWildcard: true, OnDemand: true, DNS: tt.dns,
				},
			})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = m.Close() })
			srv := serveTLS(t, m)
			for _, sni := range []string{"evil.example", "50005-nosuch.cube.test"} {
				c, err := dial(srv.addr, &tls.Config{InsecureSkipVerify: true, ServerName: sni, NextProtos: []string{"acme-tls/1"}})
				if err == nil {
					_, err = c.get(sni)
					c.close()
				}
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("SNI %s: handshake error %v, want %q", sni, err, tt.wantErr)
				}
			}
			if w := rec.warnings(); len(w) > 0 {
				t.Fatalf("a stranger's challenge handshakes logged %q", w)
			}
		})
	}
}

// TestACMEChallengeHandshakesForARealNameLogOnce checks that TLS-ALPN-01
// handshakes for a name on-demand accepts (a real sandbox's), while no
// order for it runs, log certmagic's "tls-alpn challenge" error once, not
// once each: any client can send them, and each wrote an ERROR line.
func TestACMEChallengeHandshakesForARealNameLogOnce(t *testing.T) {
	rec := &logRecorder{}
	m, err := certs.New(context.Background(), certs.Config{
		Source: certs.SourceACME, Domain: "cube.test", Logger: slog.New(rec),
		Allow: func(context.Context, string) error { return nil },
		ACME: certs.ACMEConfig{
			CA: "https://127.0.0.1:1/dir", Email: "ops@cube.test", StorageDir: t.TempDir(),
			SkipWildcard: true, OnDemand: true,
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })
	srv := serveTLS(t, m)
	const sni = "50005-real.cube.test"
	for range 20 {
		c, err := dial(srv.addr, &tls.Config{InsecureSkipVerify: true, ServerName: sni, NextProtos: []string{"acme-tls/1"}})
		if err == nil {
			_, err = c.get(sni)
			c.close()
		}
		if err == nil {
			t.Fatal("a challenge handshake with no order running was answered")
		}
	}
	if w := rec.warnings(); len(w) != 1 || w[0] != "tls-alpn challenge" {
		t.Fatalf("20 challenge handshakes logged %q, want one tls-alpn challenge line", w)
	}
}
