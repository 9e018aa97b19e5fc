package redisstore

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/cube-sandbox/cubeproxy/internal/namedfile"
)

// clientPair is the client certificate (redis.cert_file and key_file) a
// Redis that asks for one gets in each TLS handshake. It is read at start
// (a missing or broken pair refuses the start, as a bad ca_file does) and
// read again at the next dial once either file's size or modification
// time changes: client certificates are short-lived (cert-manager renews
// a 90-day one every 60 days), and a pair read once would have been sent
// after its renewal until it expired, when every new connection would
// fail the handshake and the proxy would go dark, as Redis closes none
// of the connections already made. A pair that does not load (a renewal
// caught between its two writes) leaves the previous one in use, logged
// once per change, and is tried again at the next dial.
type clientPair struct {
	certFile, keyFile string
	log               *slog.Logger

	mu      sync.Mutex
	cert    *tls.Certificate
	loaded  [2]fileStamp // the files the cert was read from
	refused [2]fileStamp // the files that last failed to load, logged once
}

// fileStamp tells one version of a file from another without reading it.
type fileStamp struct {
	size int64
	mod  time.Time
}

func stampOf(path string) fileStamp {
	fi, err := os.Stat(path)
	if err != nil {
		return fileStamp{size: -1}
	}
	return fileStamp{size: fi.Size(), mod: fi.ModTime()}
}

// newClientPair reads the pair, or says why it cannot.
func newClientPair(certFile, keyFile string, log *slog.Logger) (*clientPair, error) {
	p := &clientPair{certFile: certFile, keyFile: keyFile, log: log}
	stamps := p.stamps()
	cert, err := p.read()
	if err != nil {
		return nil, err
	}
	p.cert, p.loaded = cert, stamps
	p.warnValidity(cert)
	return p, nil
}

// warnValidity logs a pair outside its validity: Redis refuses it, and
// under TLS 1.3 the proxy often sees only "connection reset by peer"
// (the client's handshake ends before the server has checked it).
func (p *clientPair) warnValidity(cert *tls.Certificate) {
	leaf := leafOf(cert)
	if p.log == nil || leaf == nil {
		return
	}
	if now := time.Now(); now.After(leaf.NotAfter) || now.Before(leaf.NotBefore) {
		p.log.Warn("redis: the client certificate is not valid now; Redis will refuse it (the error may read only \"connection reset by peer\")",
			"cert_file", p.certFile, "not_before", leaf.NotBefore, "not_after", leaf.NotAfter)
	}
}

func (p *clientPair) stamps() [2]fileStamp {
	return [2]fileStamp{stampOf(p.certFile), stampOf(p.keyFile)}
}

// read loads the pair from its files. Its errors name the files, never
// their contents (the key's).
func (p *clientPair) read() (*tls.Certificate, error) {
	certPEM, err := namedfile.Read(p.certFile, namedfile.MaxSmall)
	if err != nil {
		return nil, fmt.Errorf("redis.cert_file: %w", err)
	}
	keyPEM, err := namedfile.Read(p.keyFile, namedfile.MaxSmall)
	if err != nil {
		return nil, fmt.Errorf("redis.key_file: %w", err)
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("redis.cert_file %s with redis.key_file %s: %w", p.certFile, p.keyFile, err)
	}
	return &cert, nil
}

// get is the tls.Config's GetClientCertificate: the current pair, read
// again first when its files changed.
func (p *clientPair) get(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	stamps := p.stamps()
	if stamps == p.loaded {
		return p.cert, nil
	}
	cert, err := p.read()
	if err != nil {
		if stamps != p.refused && p.log != nil {
			p.log.Warn("redis: the changed client certificate does not load; the previous one is still sent", "err", err)
		}
		p.refused = stamps
		return p.cert, nil
	}
	p.cert, p.loaded, p.refused = cert, stamps, [2]fileStamp{}
	if p.log != nil {
		if leaf := leafOf(cert); leaf != nil {
			p.log.Info("redis: client certificate read again", "cert_file", p.certFile, "not_after", leaf.NotAfter)
		}
	}
	p.warnValidity(cert)
	return p.cert, nil
}

// leafOf is the pair's own certificate, nil when it does not parse.
func leafOf(cert *tls.Certificate) *x509.Certificate {
	if cert.Leaf != nil || len(cert.Certificate) == 0 {
		return cert.Leaf
	}
	leaf, _ := x509.ParseCertificate(cert.Certificate[0])
	return leaf
}
