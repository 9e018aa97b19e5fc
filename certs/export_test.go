package certs

import "context"

// RenewNow runs the acme source's certificate maintenance once, as its
// ticker does every 10 minutes: tests cannot wait for it.
func RenewNow(ctx context.Context, m *Manager) error {
	return m.src.(*acmeSource).cache.RenewManagedCertificates(ctx)
}
