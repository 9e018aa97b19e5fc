package redisstore

import (
	"crypto/x509"
	"fmt"
	"log/slog"
	"sync"

	"github.com/cube-sandbox/cubeproxy/internal/namedfile"
)

// caBundle is redis.ca_file, the roots that verify the Redis servers and
// sentinels. It is read at start (a missing or empty bundle refuses the
// start) and read again at the next dial once the file's size or
// modification time changes, as clientPair is: servers moved to a
// certificate of a new CA are trusted once the bundle holds it, without a
// restart. Read once, a bundle updated ahead of such a move was not used
// until the proxy restarted, and after the move every new connection
// failed (a measured 280 of 280 cold lookups 503 through Sentinel, with
// /readyz 200). A bundle that does not load (caught while it is written)
// leaves the previous one in use, logged once per change.
type caBundle struct {
	file string
	log  *slog.Logger

	mu      sync.Mutex
	pool    *x509.CertPool
	loaded  fileStamp
	refused fileStamp
}

// newCABundle reads the bundle, or says why it cannot.
func newCABundle(file string, log *slog.Logger) (*caBundle, error) {
	b := &caBundle{file: file, log: log}
	stamp := stampOf(file)
	pool, err := b.read()
	if err != nil {
		return nil, err
	}
	b.pool, b.loaded = pool, stamp
	return b, nil
}

func (b *caBundle) read() (*x509.CertPool, error) {
	pem, err := namedfile.Read(b.file, namedfile.MaxSmall)
	if err != nil {
		return nil, fmt.Errorf("redis.ca_file: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("redis.ca_file %s: no PEM certificates", b.file)
	}
	return pool, nil
}

// get returns the current roots, read again first when the file changed.
func (b *caBundle) get() *x509.CertPool {
	b.mu.Lock()
	defer b.mu.Unlock()
	stamp := stampOf(b.file)
	if stamp == b.loaded {
		return b.pool
	}
	pool, err := b.read()
	if err != nil {
		if stamp != b.refused && b.log != nil {
			b.log.Warn("redis: the changed CA bundle does not load; the previous one is still used", "err", err)
		}
		b.refused = stamp
		return b.pool
	}
	b.pool, b.loaded, b.refused = pool, stamp, fileStamp{}
	if b.log != nil {
		b.log.Info("redis: CA bundle read again", "ca_file", b.file)
	}
	return b.pool
}
