package certs

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"log/slog"
	"math/big"
	"net"
	"strings"
	"time"
)

// selfSigned serves one in-memory certificate, regenerated at every start.
type selfSigned struct {
	cert *tls.Certificate
}

func newSelfSigned(domain string, log *slog.Logger) (*selfSigned, error) {
	names := []string{"localhost"}
	if d := strings.ToLower(strings.Trim(domain, ".")); d != "" {
		names = []string{d, "*." + d, "localhost"}
	}
	cert, err := selfSignedCert(names, []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback})
	if err != nil {
		return nil, fmt.Errorf("self-signed certificate: %w", err)
	}
	log.Warn("TLS uses a self-signed certificate for development only; clients must skip verification. Configure tls source files or acme for production",
		"names", names, "not_after", cert.Leaf.NotAfter)
	return &selfSigned{cert: cert}, nil
}

func (s *selfSigned) getCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	return s.cert, nil
}

func (s *selfSigned) earliestExpiry() time.Time { return s.cert.Leaf.NotAfter }

func (s *selfSigned) close() error { return nil }

// selfSignedCert creates an ECDSA P-256 certificate valid for a year.
func selfSignedCert(names []string, ips []net.IP) (*tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 126))
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: names[0], Organization: []string{"CubeProxy development"}},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.AddDate(1, 0, 0),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:     names,
		IPAddresses:  ips,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, nil
}
