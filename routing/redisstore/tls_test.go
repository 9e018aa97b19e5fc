package redisstore_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
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
			s := openStoreCfg(t, redisstore.Config{Addr: r.OtherAddr(), TLS: true, CAFile: caFile, PoolSize: 12})
			// Fill the pool: concurrent lookups each hold a connection.
			var wg sync.WaitGroup
			for range 48 {
				wg.Go(func() { _, _ = s.Lookup(context.Background(), "sbx") })
			}
			wg.Wait()
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
