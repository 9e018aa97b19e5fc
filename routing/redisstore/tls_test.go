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
	"strconv"
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
	tlsPort := testenv.FreePort(t)
	r := testenv.StartRedis(t, "--tls-port", strconv.Itoa(tlsPort), "--tls-cert-file", certFile,
		"--tls-key-file", keyFile, "--tls-ca-cert-file", caFile, "--tls-auth-clients", "no")
	tlsAddr := net.JoinHostPort("127.0.0.1", strconv.Itoa(tlsPort))
	hset(t, r, redisstore.DefaultKeyPrefix+"sbx", "HostIP", "10.0.0.1")
	// A sentinel that speaks TLS and watches the master's TLS port: the
	// store dials both itself (see sentinelDialer).
	sentinelTLSPort := testenv.FreePort(t)
	testenv.StartSentinel(t, "tlsmaster", tlsAddr, "--tls-port", strconv.Itoa(sentinelTLSPort), "--tls-cert-file", certFile,
		"--tls-key-file", keyFile, "--tls-ca-cert-file", caFile, "--tls-auth-clients", "no", "--tls-replication", "yes")
	sentinelTLSAddr := net.JoinHostPort("127.0.0.1", strconv.Itoa(sentinelTLSPort))
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
