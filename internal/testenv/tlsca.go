package testenv

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"testing"
	"time"
)

// CA is a throw-away certificate authority for tests that serve static
// certificate files (the `files` TLS source).
type CA struct {
	// Cert is the self-signed root.
	Cert *x509.Certificate
	key  *ecdsa.PrivateKey
}

// NewCA creates a root certificate named cn.
func NewCA(t testing.TB, cn string) *CA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatalf("ca key: %v", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          randomSerial(t),
		Subject:               pkix.Name{CommonName: cn},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatalf("ca cert: %v", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatalf("ca parse: %v", err)
	}
	return &CA{Cert: cert, key: key}
}

// Pool returns a pool that trusts only this CA.
func (ca *CA) Pool() *x509.CertPool {
	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	return pool
}

// Issue returns a PEM leaf certificate and PEM key for names (DNS names,
// wildcards or IP literals), signed by the CA.
func (ca *CA) Issue(t testing.TB, names ...string) (certPEM, keyPEM []byte) {
	t.Helper()
	return ca.IssueValid(t, time.Now().Add(-time.Hour), time.Now().Add(24*time.Hour), names...)
}

// Certificate is Issue's pair as a tls.Certificate, for a server's
// tls.Config.
func (ca *CA) Certificate(t testing.TB, names ...string) tls.Certificate {
	t.Helper()
	cert, err := tls.X509KeyPair(ca.Issue(t, names...))
	if err != nil {
		t.Fatal(err)
	}
	return cert
}

// IssueValid is Issue for a certificate valid from notBefore to notAfter
// (expired or not yet valid ones included).
func (ca *CA) IssueValid(t testing.TB, notBefore, notAfter time.Time, names ...string) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatalf("leaf key: %v", err)
	}
	return ca.issue(t, key, x509.ExtKeyUsageServerAuth, notBefore, notAfter, names...)
}

// IssueClient returns a PEM client certificate (extended key usage
// clientAuth, which OpenSSL servers such as redis-server require of one)
// named cn and its PEM key, valid from notBefore to notAfter.
func (ca *CA) IssueClient(t testing.TB, notBefore, notAfter time.Time, cn string) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatalf("client key: %v", err)
	}
	return ca.issue(t, key, x509.ExtKeyUsageClientAuth, notBefore, notAfter, cn)
}

// CertPEM returns the root certificate in PEM, as a CA file holds it.
func (ca *CA) CertPEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.Cert.Raw})
}

// IssueRSA is Issue with an RSA key, for clients that cannot use ECDSA.
func (ca *CA) IssueRSA(t testing.TB, names ...string) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatalf("leaf key: %v", err)
	}
	return ca.issue(t, key, x509.ExtKeyUsageServerAuth, time.Now().Add(-time.Hour), time.Now().Add(24*time.Hour), names...)
}

func (ca *CA) issue(t testing.TB, key crypto.Signer, usage x509.ExtKeyUsage, notBefore, notAfter time.Time, names ...string) (certPEM, keyPEM []byte) {
	t.Helper()
	tmpl := &x509.Certificate{
		SerialNumber: randomSerial(t),
		Subject:      pkix.Name{CommonName: names[0]},
		NotBefore:    notBefore,
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{usage},
	}
	for _, n := range names {
		if ip := net.ParseIP(n); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, n)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, key.Public(), ca.key)
	if err != nil {
		t.Fatalf("leaf cert: %v", err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatalf("leaf key: %v", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER})
}

// WritePair issues a certificate for names and writes it to certFile and
// keyFile (replacing them in place), returning the leaf.
func (ca *CA) WritePair(t testing.TB, certFile, keyFile string, names ...string) *x509.Certificate {
	t.Helper()
	certPEM, keyPEM := ca.Issue(t, names...)
	if err := os.WriteFile(certFile, certPEM, 0o600); err != nil {
		t.Fatalf("write %s: %v", certFile, err)
	}
	if err := os.WriteFile(keyFile, keyPEM, 0o600); err != nil {
		t.Fatalf("write %s: %v", keyFile, err)
	}
	block, _ := pem.Decode(certPEM)
	leaf, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatalf("parse issued cert: %v", err)
	}
	return leaf
}

func randomSerial(t testing.TB) *big.Int {
	t.Helper()
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	if err != nil {
		t.Fatalf("serial: %v", err)
	}
	return n
}
