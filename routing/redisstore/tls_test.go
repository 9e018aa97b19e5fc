package redisstore_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"log/slog"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
	"github.com/cube-sandbox/cubeproxy/routing/redisstore"
)

// writeTLSFiles creates a CA and a server certificate for 127.0.0.1 and
// returns the PEM file paths.
func writeTLSFiles(t *testing.T) (caFile, certFile, keyFile string) {
	t.Helper()
	dir := t.TempDir()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "redis"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		KeyUsage: x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, _ := x509.MarshalECPrivateKey(key)
	write := func(name, typ string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: b}), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	return write("ca.pem", "CERTIFICATE", caDER), write("cert.pem", "CERTIFICATE", der), write("key.pem", "EC PRIVATE KEY", keyDER)
}

func TestTLS(t *testing.T) {
	caFile, certFile, keyFile := writeTLSFiles(t)
	r := testenv.StartRedis(t, "--tls-port", testenv.AnotherPort, "--tls-cert-file", certFile,
		"--tls-key-file", keyFile, "--tls-ca-cert-file", caFile, "--tls-auth-clients", "no")
	tlsAddr := r.OtherAddr()
	hset(t, r, redisstore.DefaultKeyPrefix+"sbx", "HostIP", "10.0.0.1")
	// A sentinel that speaks TLS and watches the master's TLS port: the
	// store dials both itself (see sentinelDialer).
	sentinel := testenv.StartSentinel(t, "tlsmaster", tlsAddr, "--tls-port", testenv.AnotherPort, "--tls-cert-file", certFile,
		"--tls-key-file", keyFile, "--tls-ca-cert-file", caFile, "--tls-auth-clients", "no", "--tls-replication", "yes")
	sentinelTLSAddr := sentinel.OtherAddr()
	viaSentinel := redisstore.SentinelConfig{MasterName: "tlsmaster", Addrs: []string{sentinelTLSAddr}}

	tests := []struct {
		name string
		cfg  redisstore.Config
		ok   bool
	}{
		{"ca file", redisstore.Config{Addr: tlsAddr, TLS: true, CAFile: caFile}, true},
		{"rediss url with ca file", redisstore.Config{URL: "rediss://" + tlsAddr, CAFile: caFile}, true},
		{"rediss url in capitals with ca file", redisstore.Config{URL: "REDISS://" + tlsAddr, CAFile: caFile}, true},
		{"insecure", redisstore.Config{Addr: tlsAddr, TLS: true, InsecureSkipVerify: true}, true},
		{"unknown CA is rejected", redisstore.Config{Addr: tlsAddr, TLS: true}, false},
		{"plain client on TLS port fails", redisstore.Config{Addr: tlsAddr}, false},
		{"sentinel", redisstore.Config{Sentinel: viaSentinel, TLS: true, CAFile: caFile}, true},
		{"sentinel with an unknown CA is rejected", redisstore.Config{Sentinel: viaSentinel, TLS: true}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := openStoreCfg(t, tc.cfg)
			_, err := s.Lookup(context.Background(), "sbx")
			if (err == nil) != tc.ok {
				t.Fatalf("lookup err = %v, want ok=%v", err, tc.ok)
			}
		})
	}
}

// TestTLSPoolDropsClosedConnections: pooled TLS connections the server
// closed while they sat idle (Redis restarted, or its `timeout` setting
// closed them) are found closed before reuse, as plain TCP ones are, and
// dialed again: go-redis checks only a connection that exposes its socket,
// and a *tls.Conn does not. Lookups failed with EOF, three dead connections
// each (the retries), for about a third of the pool after every restart.
func TestTLSPoolDropsClosedConnections(t *testing.T) {
	caFile, certFile, keyFile := writeTLSFiles(t)
	tests := []struct {
		name  string
		args  []string
		close func(r *testenv.Redis)
	}{
		{"redis restarted", nil, func(r *testenv.Redis) {
			r.Restart()
			hset(t, r, redisstore.DefaultKeyPrefix+"sbx", "HostIP", "10.0.0.1")
		}},
		{"idle connections timed out", []string{"--timeout", "1"}, func(r *testenv.Redis) {
			testenv.WaitFor(t, 10*time.Second, "the server to close the idle connections", func() bool {
				clients, err := r.Client().ClientList(context.Background()).Result()
				return err == nil && !strings.Contains(clients, "name=cubeproxy")
			})
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := testenv.StartRedis(t, append([]string{"--tls-port", testenv.AnotherPort, "--tls-cert-file", certFile,
				"--tls-key-file", keyFile, "--tls-ca-cert-file", caFile, "--tls-auth-clients", "no"}, tc.args...)...)
			hset(t, r, redisstore.DefaultKeyPrefix+"sbx", "HostIP", "10.0.0.1")
			// The budget is generous, and every lookup that fills the pool
			// must succeed: one that gives up (its TLS handshake slow
			// under -race on a loaded machine) leaves its dial running in
			// go-redis, which hands the connection to a later lookup
			// without checking it, and counts the dial's failure (killed
			// with the server). A connection dialed to the old server, or
			// PoolSize failed dials, which make go-redis answer every
			// dial with the last error ("connection reset by peer")
			// until a probe (one a second) succeeds, failed lookup 0.
			s := openStoreCfg(t, redisstore.Config{Addr: r.OtherAddr(), TLS: true, CAFile: caFile, PoolSize: 12, CommandTimeout: 30 * time.Second})
			// Fill the pool: concurrent lookups each hold a connection.
			var wg sync.WaitGroup
			for range 48 {
				wg.Go(func() {
					if _, err := s.Lookup(context.Background(), "sbx"); err != nil {
						t.Errorf("lookup filling the pool: %v", err)
					}
				})
			}
			wg.Wait()
			if t.Failed() {
				t.FailNow()
			}
			if n := s.Client().PoolStats().IdleConns; n < 4 {
				t.Fatalf("%d idle connections in the pool, want several", n)
			}
			tc.close(r)
			for i := range 12 {
				if _, err := s.Lookup(context.Background(), "sbx"); err != nil {
					t.Fatalf("lookup %d after the server closed the pooled connections: %v", i, err)
				}
			}
		})
	}
}

// mtlsFiles is a CA, a redis-server certificate it signed for 127.0.0.1,
// and client pairs, written to files for redis-server and the store.
type mtlsFiles struct {
	dir, ca, serverCert, serverKey string
	authority                      *testenv.CA
}

func newMTLSFiles(t *testing.T) mtlsFiles {
	t.Helper()
	f := mtlsFiles{dir: t.TempDir(), authority: testenv.NewCA(t, "redis test CA")}
	f.ca = f.write(t, "ca.pem", f.authority.CertPEM())
	f.serverCert, f.serverKey = filepath.Join(f.dir, "server.pem"), filepath.Join(f.dir, "server.key")
	f.authority.WritePair(t, f.serverCert, f.serverKey, "127.0.0.1")
	return f
}

func (f mtlsFiles) write(t *testing.T, name string, b []byte) string {
	t.Helper()
	p := filepath.Join(f.dir, name)
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// client writes a client pair of ca valid from notBefore to notAfter as
// name.pem and name.key.
func (f mtlsFiles) client(t *testing.T, ca *testenv.CA, name string, notBefore, notAfter time.Time) (certFile, keyFile string) {
	t.Helper()
	certPEM, keyPEM := ca.IssueClient(t, notBefore, notAfter, "cubeproxy")
	return f.write(t, name+".pem", certPEM), f.write(t, name+".key", keyPEM)
}

// serverArgs are redis-server's TLS arguments: the TLS port is
// AnotherPort, and tls-auth-clients is left at its default (yes: a
// client must present a certificate the CA signed).
func (f mtlsFiles) serverArgs() []string {
	return []string{"--tls-port", testenv.AnotherPort, "--tls-cert-file", f.serverCert, "--tls-key-file", f.serverKey, "--tls-ca-cert-file", f.ca}
}

// TestTLSClientCertificate: a Redis with tls-auth-clients on (its
// default) is reached with redis.cert_file and key_file, standalone (addr
// or a rediss:// URL), through a sentinel that asks for a certificate
// too, and in a Cluster; without one, or with one expired or of another
// CA, the lookup fails (with the handshake's reason, or, as TLS 1.3 ends
// the client's handshake before the server has checked its certificate,
// a reset: which one comes first is a race). The proxy had no
// client certificate setting: every lookup against such a Redis failed
// with "remote error: tls: certificate required" (503, /readyz 503).
func TestTLSClientCertificate(t *testing.T) {
	f := newMTLSFiles(t)
	now := time.Now()
	cert, key := f.client(t, f.authority, "client", now.Add(-time.Hour), now.Add(time.Hour))
	expiredCert, expiredKey := f.client(t, f.authority, "expired", now.Add(-48*time.Hour), now.Add(-24*time.Hour))
	otherCert, otherKey := f.client(t, testenv.NewCA(t, "another CA"), "other", now.Add(-time.Hour), now.Add(time.Hour))

	r := testenv.StartRedis(t, f.serverArgs()...)
	hset(t, r, redisstore.DefaultKeyPrefix+"sbx", "HostIP", "10.0.0.1")
	// The sentinel's own TLS port asks for a certificate too, and it
	// presents the client pair to the master's.
	sentinel := testenv.StartSentinel(t, "mtls", r.OtherAddr(), append(f.serverArgs(), "--tls-replication", "yes",
		"--tls-client-cert-file", cert, "--tls-client-key-file", key)...)
	// A node alone in its cluster knows no address of its own (CLUSTER
	// SLOTS names it ""): the client then has no name to verify.
	cluster := startOneNodeCluster(t, append(f.serverArgs(), "--tls-cluster", "yes", "--cluster-announce-ip", "127.0.0.1")...)
	hset(t, cluster, redisstore.DefaultKeyPrefix+"sbx", "HostIP", "10.0.0.1")

	tests := []struct {
		name string
		cfg  redisstore.Config
		ok   bool
	}{
		{"no client certificate", redisstore.Config{Addr: r.OtherAddr(), TLS: true, CAFile: f.ca}, false},
		{"addr", redisstore.Config{Addr: r.OtherAddr(), TLS: true, CAFile: f.ca, CertFile: cert, KeyFile: key}, true},
		{"rediss url", redisstore.Config{URL: "rediss://" + r.OtherAddr(), CAFile: f.ca, CertFile: cert, KeyFile: key}, true},
		{"sentinel", redisstore.Config{Sentinel: redisstore.SentinelConfig{MasterName: "mtls", Addrs: []string{sentinel.OtherAddr()}},
			TLS: true, CAFile: f.ca, CertFile: cert, KeyFile: key}, true},
		{"cluster", redisstore.Config{Cluster: redisstore.ClusterConfig{Addrs: []string{cluster.OtherAddr()}},
			TLS: true, CAFile: f.ca, CertFile: cert, KeyFile: key}, true},
		{"expired client certificate", redisstore.Config{Addr: r.OtherAddr(), TLS: true, CAFile: f.ca, CertFile: expiredCert, KeyFile: expiredKey}, false},
		{"client certificate of another CA", redisstore.Config{Addr: r.OtherAddr(), TLS: true, CAFile: f.ca, CertFile: otherCert, KeyFile: otherKey}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var logs testenv.LogBuffer
			tc.cfg.Logger = slog.New(slog.NewJSONHandler(&logs, nil))
			_, err := openStoreCfg(t, tc.cfg).Lookup(context.Background(), "sbx")
			if (err == nil) != tc.ok {
				t.Fatalf("lookup err = %v, want ok=%v", err, tc.ok)
			}
			// TLS 1.3 may show the refusal as a reset alone: the expired
			// pair is named at start.
			if warned := strings.Contains(logs.String(), "client certificate is not valid now"); warned != (tc.cfg.CertFile == expiredCert) {
				t.Errorf("validity warning %v, log: %s", warned, logs.String())
			}
		})
	}
}

// TestTLSClientCertificateRenewed: a client certificate renewed in place
// (its files rewritten, as cert-manager or a renewal job does) is sent by
// the next connection, without a restart. Read once at start, the old
// one was sent until it expired: then every new connection failed the
// handshake, while the connections made before kept working (Redis
// closes none), so the proxy went dark as its pool turned over.
func TestTLSClientCertificateRenewed(t *testing.T) {
	f := newMTLSFiles(t)
	now := time.Now()
	cert, key := f.client(t, f.authority, "client", now.Add(-time.Hour), now.Add(time.Hour))
	r := testenv.StartRedis(t, f.serverArgs()...)
	hset(t, r, redisstore.DefaultKeyPrefix+"sbx", "HostIP", "10.0.0.1")
	var logs testenv.LogBuffer
	s := openStoreCfg(t, redisstore.Config{Addr: r.OtherAddr(), TLS: true, CAFile: f.ca, CertFile: cert, KeyFile: key,
		Logger: slog.New(slog.NewJSONHandler(&logs, nil))})
	if _, err := s.Lookup(context.Background(), "sbx"); err != nil {
		t.Fatalf("lookup with the first certificate: %v", err)
	}

	// Redis now trusts only client certificates of a new CA (its own
	// certificate stays), and drops the connections made so far.
	renewedCA := testenv.NewCA(t, "renewed client CA")
	bundle := f.write(t, "clients.pem", renewedCA.CertPEM())
	ctx := context.Background()
	if err := r.Client().ConfigSet(ctx, "tls-ca-cert-file", bundle).Err(); err != nil {
		t.Fatalf("config set tls-ca-cert-file: %v", err)
	}
	if err := r.Client().Do(ctx, "CLIENT", "KILL", "TYPE", "normal").Err(); err != nil {
		t.Fatalf("client kill: %v", err)
	}
	if _, err := s.Lookup(ctx, "sbx"); err == nil {
		t.Fatal("lookup with a certificate Redis no longer trusts succeeded")
	}

	// A renewal caught between its two writes (the new certificate, the
	// old key) is not used: the previous pair still is, and it is said.
	newCert, newKey := renewedCA.IssueClient(t, now.Add(-time.Hour), now.Add(time.Hour), "cubeproxy")
	if err := os.WriteFile(cert, newCert, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Lookup(ctx, "sbx"); err == nil || !strings.Contains(logs.String(), "does not load") {
		t.Fatalf("lookup with a half-written pair: err %v, log %s", err, logs.String())
	}
	if err := os.WriteFile(key, newKey, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Lookup(ctx, "sbx"); err != nil {
		t.Fatalf("lookup after the certificate was renewed: %v", err)
	}
	if !strings.Contains(logs.String(), "client certificate read again") {
		t.Errorf("the renewal was not logged: %s", logs.String())
	}
}

// TestTLSHandshakeErrorNamesServer: a TLS handshake refused through
// Sentinel names the server it was with, and whether that was a sentinel
// or the master the sentinels named. The error was the handshake's alone
// ("tls: failed to verify certificate: x509: certificate signed by
// unknown authority"), the same whether the sentinels' certificate or the
// master's was the one not trusted, and it named no address (a refused
// TCP dial names it): in /readyz's detail and the log, an operator could
// not tell which server's certificate to fix.
func TestTLSHandshakeErrorNamesServer(t *testing.T) {
	trusted := newMTLSFiles(t)
	other := testenv.NewCA(t, "a CA the proxy does not trust")
	otherCert, otherKey := filepath.Join(trusted.dir, "other.pem"), filepath.Join(trusted.dir, "other.key")
	other.WritePair(t, otherCert, otherKey, "127.0.0.1")
	// The servers trust both CAs, so the sentinel reaches the master
	// either way; only the proxy trusts one.
	bundle := trusted.write(t, "both.pem", append(trusted.authority.CertPEM(), other.CertPEM()...))
	tlsArgs := func(cert, key string) []string {
		return []string{"--tls-port", testenv.AnotherPort, "--tls-cert-file", cert, "--tls-key-file", key,
			"--tls-ca-cert-file", bundle, "--tls-auth-clients", "no", "--tls-replication", "yes"}
	}
	tests := []struct {
		name                     string
		masterCert, masterKey    string
		sentinelCert, sentinelKy string
		want                     func(master, sentinel string) string
	}{
		{"sentinel certificate not trusted", trusted.serverCert, trusted.serverKey, otherCert, otherKey,
			func(_, sentinel string) string {
				return "sentinel: TLS handshake with " + sentinel + ": tls: failed to verify certificate"
			}},
		{"master certificate not trusted", otherCert, otherKey, trusted.serverCert, trusted.serverKey,
			func(master, _ string) string {
				return "TLS handshake with " + master + ": tls: failed to verify certificate"
			}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			master := testenv.StartRedis(t, tlsArgs(tc.masterCert, tc.masterKey)...)
			sentinel := testenv.StartSentinel(t, "named", master.OtherAddr(), tlsArgs(tc.sentinelCert, tc.sentinelKy)...)
			s := openStoreCfg(t, redisstore.Config{Sentinel: redisstore.SentinelConfig{MasterName: "named", Addrs: []string{sentinel.OtherAddr()}},
				TLS: true, CAFile: trusted.ca})
			_, err := s.Lookup(context.Background(), "sbx")
			if want := tc.want(master.OtherAddr(), sentinel.OtherAddr()); err == nil || !strings.Contains(err.Error(), want) {
				t.Fatalf("lookup err = %v, want it to hold %q", err, want)
			}
		})
	}
}

// TestTLSCABundleRenewed: redis.ca_file rewritten to hold a new CA (the
// servers are about to move to it, or have) is used by the next
// connection, without a restart. Read once at start, the new CA was not
// trusted until the proxy restarted: once the server presented a
// certificate of it, every new connection failed the handshake.
func TestTLSCABundleRenewed(t *testing.T) {
	f := newMTLSFiles(t)
	r := testenv.StartRedis(t, append(f.serverArgs(), "--tls-auth-clients", "no")...)
	hset(t, r, redisstore.DefaultKeyPrefix+"sbx", "HostIP", "10.0.0.1")
	var logs testenv.LogBuffer
	s := openStoreCfg(t, redisstore.Config{Addr: r.OtherAddr(), TLS: true, CAFile: f.ca, Logger: slog.New(slog.NewJSONHandler(&logs, nil))})
	ctx := context.Background()
	if _, err := s.Lookup(ctx, "sbx"); err != nil {
		t.Fatalf("lookup with the first CA: %v", err)
	}

	// The server moves to a certificate of a new CA, and drops the
	// connections made so far.
	newCA := testenv.NewCA(t, "new server CA")
	newCert, newKey := filepath.Join(f.dir, "new.pem"), filepath.Join(f.dir, "new.key")
	newCA.WritePair(t, newCert, newKey, "127.0.0.1")
	if err := r.Client().Do(ctx, "CONFIG", "SET", "tls-cert-file", newCert, "tls-key-file", newKey).Err(); err != nil {
		t.Fatalf("config set tls-cert-file and tls-key-file: %v", err)
	}
	if err := r.Client().Do(ctx, "CLIENT", "KILL", "TYPE", "normal").Err(); err != nil {
		t.Fatalf("client kill: %v", err)
	}
	if _, err := s.Lookup(ctx, "sbx"); err == nil || !strings.Contains(err.Error(), "certificate signed by unknown authority") {
		t.Fatalf("lookup with a bundle without the server's CA: %v, want an unknown authority", err)
	}

	// A bundle caught while it is written does not load: the previous
	// one is still used, and it is said.
	if err := os.WriteFile(f.ca, []byte("-----BEGIN CERT"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Lookup(ctx, "sbx"); err == nil || !strings.Contains(logs.String(), "CA bundle does not load") {
		t.Fatalf("lookup with a half-written bundle: err %v, log %s", err, logs.String())
	}
	if err := os.WriteFile(f.ca, append(f.authority.CertPEM(), newCA.CertPEM()...), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Lookup(ctx, "sbx"); err != nil {
		t.Fatalf("lookup after the bundle gained the new CA: %v", err)
	}
	if !strings.Contains(logs.String(), "CA bundle read again") {
		t.Errorf("the new bundle was not logged: %s", logs.String())
	}
}

// TestTLSClientCertificateRefusalNamed: a Redis that asks for a client
// certificate and refuses the proxy's (none set, another CA's, expired)
// is named as such, the same words at every try. With TLS 1.3 the server
// checks the certificate after the client's handshake has ended, and the
// lookup failed with the alert ("remote error: tls: certificate
// required") or, when the server had already closed, "write tcp
// 127.0.0.1:<port>->...: write: connection reset by peer", nothing said
// of a certificate: which one was a race, and /readyz's reason and the
// log alternated between them, the reset a new reason at every try.
func TestTLSClientCertificateRefusalNamed(t *testing.T) {
	f := newMTLSFiles(t)
	now := time.Now()
	expiredCert, expiredKey := f.client(t, f.authority, "expired", now.Add(-48*time.Hour), now.Add(-24*time.Hour))
	otherCert, otherKey := f.client(t, testenv.NewCA(t, "another CA"), "other", now.Add(-time.Hour), now.Add(time.Hour))
	r := testenv.StartRedis(t, f.serverArgs()...)

	tests := []struct {
		name      string
		cert, key string
		want      string
	}{
		{"no client certificate", "", "", "none is set (redis.cert_file"},
		{"client certificate of another CA", otherCert, otherKey, "refused redis.cert_file's"},
		{"expired client certificate", expiredCert, expiredKey, "refused redis.cert_file's"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := openStoreCfg(t, redisstore.Config{Addr: r.OtherAddr(), TLS: true, CAFile: f.ca, CertFile: tc.cert, KeyFile: tc.key})
			first := ""
			for i := range 8 {
				_, err := s.Lookup(context.Background(), "sbx")
				if err == nil {
					t.Fatal("lookup succeeded")
				}
				msg := err.Error()
				if !strings.Contains(msg, tc.want) || !strings.Contains(msg, r.OtherAddr()) {
					t.Fatalf("lookup %d: err %q, want it to name %q and the server", i, msg, tc.want)
				}
				if first == "" {
					first = msg
				} else if msg != first {
					t.Fatalf("lookup %d: err %q differs from the first %q", i, msg, first)
				}
			}
		})
	}
}
