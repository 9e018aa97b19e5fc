package certs

import (
	"crypto/tls"
	"crypto/x509"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// pick weighs, in this order, whether the client can use a pair and then
// whether it is within its validity: a pair the client cannot use fails
// the handshake outright, where an expired one fails only a client that
// verifies; and a pair not yet valid is as unusable as an expired one.
func TestPickWeighsUsabilityThenValidity(t *testing.T) {
	ca := testenv.NewCA(t, "test CA")
	now := time.Now()
	pair := func(certPEM, keyPEM []byte, notBefore, notAfter time.Time) *tls.Certificate {
		c, err := tls.X509KeyPair(certPEM, keyPEM)
		if err != nil {
			t.Fatal(err)
		}
		// pick reads the validity from Leaf: set it rather than sign a
		// certificate per case.
		leaf := *c.Leaf
		leaf.NotBefore, leaf.NotAfter = notBefore, notAfter
		c.Leaf = &leaf
		return &c
	}
	valid := func(certPEM, keyPEM []byte) *tls.Certificate {
		return pair(certPEM, keyPEM, now.Add(-time.Hour), now.Add(time.Hour))
	}
	ecdsaValid := valid(ca.Issue(t, "a.test"))
	ecdsaValid2 := valid(ca.Issue(t, "a.test"))
	ecdsaCert, ecdsaKey := ca.Issue(t, "a.test")
	ecdsaExpired := pair(ecdsaCert, ecdsaKey, now.Add(-2*time.Hour), now.Add(-time.Hour))
	ecdsaNotYet := pair(ecdsaCert, ecdsaKey, now.Add(time.Hour), now.Add(2*time.Hour))
	rsaCert, rsaKey := ca.IssueRSA(t, "a.test")
	rsaExpired := pair(rsaCert, rsaKey, now.Add(-2*time.Hour), now.Add(-time.Hour))

	modern := &tls.ClientHelloInfo{
		SupportedVersions: []uint16{tls.VersionTLS13, tls.VersionTLS12},
		CipherSuites:      []uint16{tls.TLS_AES_128_GCM_SHA256, tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256, tls.TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256},
		SignatureSchemes:  []tls.SignatureScheme{tls.ECDSAWithP256AndSHA256, tls.PSSWithSHA256, tls.PKCS1WithSHA256},
		SupportedCurves:   []tls.CurveID{tls.X25519, tls.CurveP256},
		SupportedPoints:   []uint8{0},
	}
	rsaOnly := &tls.ClientHelloInfo{
		SupportedVersions: []uint16{tls.VersionTLS12},
		CipherSuites:      []uint16{tls.TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256},
		SignatureSchemes:  []tls.SignatureScheme{tls.PSSWithSHA256, tls.PKCS1WithSHA256},
		SupportedCurves:   []tls.CurveID{tls.X25519, tls.CurveP256},
		SupportedPoints:   []uint8{0},
	}
	if rsaOnly.SupportsCertificate(ecdsaValid) == nil || rsaOnly.SupportsCertificate(rsaExpired) != nil {
		t.Fatal("the RSA-only hello does not tell the key types apart")
	}
	for _, tc := range []struct {
		name  string
		hello *tls.ClientHelloInfo
		list  []*tls.Certificate
		want  *tls.Certificate
	}{
		{"an expired pair gives way to a valid one", modern, []*tls.Certificate{ecdsaExpired, ecdsaValid}, ecdsaValid},
		{"a pair not yet valid gives way to a valid one", modern, []*tls.Certificate{ecdsaNotYet, ecdsaValid}, ecdsaValid},
		{"a usable expired pair beats an unusable valid one", rsaOnly, []*tls.Certificate{ecdsaValid, rsaExpired}, rsaExpired},
		{"none usable: the first listed", rsaOnly, []*tls.Certificate{ecdsaValid, ecdsaValid2}, ecdsaValid},
		{"equals: the first listed", modern, []*tls.Certificate{ecdsaValid, ecdsaValid2}, ecdsaValid},
	} {
		if got := pick(tc.hello, tc.list); got != tc.want {
			t.Errorf("%s: picked %v (%v..%v)", tc.name, got.Leaf.PublicKeyAlgorithm, got.Leaf.NotBefore, got.Leaf.NotAfter)
		}
	}
}

// A certificate's names match in any case: DNS names are case-insensitive
// and SNI is looked up lower-cased, so a SAN written "API.Example.Test"
// must still be chosen for api.example.test, not the default pair.
func TestIndexLowerCasesCertificateNames(t *testing.T) {
	first := &tls.Certificate{Leaf: &x509.Certificate{DNSNames: []string{"cube.test"}}}
	upper := &tls.Certificate{Leaf: &x509.Certificate{DNSNames: []string{"API.Example.Test", "*.WILD.Test"}}}
	s := &fileSource{loaded: []loadedPair{{cert: first}, {cert: upper}}}
	s.index.Store(s.buildIndex())
	for _, sni := range []string{"api.example.test", "API.EXAMPLE.TEST", "x.wild.test"} {
		got, err := s.getCertificate(&tls.ClientHelloInfo{ServerName: sni})
		if err != nil || got != upper {
			t.Errorf("SNI %s: got %v (%v), want the pair naming it", sni, got.Leaf.DNSNames, err)
		}
	}
	for _, host := range []string{"api.example.test", "x.wild.test"} {
		if !s.covers(host) {
			t.Errorf("covers(%s) = false, want true", host)
		}
	}
}
