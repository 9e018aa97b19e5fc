package certs

import (
	"context"
	"time"
)

// RenewNow runs the acme source's certificate maintenance once, as its
// ticker does every 10 minutes: tests cannot wait for it.
func RenewNow(ctx context.Context, m *Manager) error {
	return m.src.(*acmeSource).cache.RenewManagedCertificates(ctx)
}

// SweepNow runs the acme source's sweep of on-demand certificates once, as
// its hourly ticker does, and returns how many names it dropped.
func SweepNow(ctx context.Context, m *Manager) int {
	return m.src.(*acmeSource).sweep(ctx)
}

// CachedCertificates returns how many certificates for name (or a
// wildcard over it) the acme source holds in memory.
func CachedCertificates(m *Manager, name string) int {
	return len(m.src.(*acmeSource).cache.AllMatchingCertificates(name))
}

// CleanStorageNow runs the acme source's storage cleaning once with the
// given grace period after expiry.
func CleanStorageNow(ctx context.Context, m *Manager, grace time.Duration) error {
	return m.src.(*acmeSource).cleanStorage(ctx, grace)
}
