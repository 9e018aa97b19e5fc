package certs

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/caddyserver/certmagic"
)

// sweepInterval is how often on-demand certificates of names that no
// longer belong to a sandbox are dropped from memory.
const sweepInterval = time.Hour

// Storage cleaning (on-demand only): certificates that expired more than
// expiredCertGrace ago are deleted from storage_dir, at most once every
// storageCleanInterval across the replicas sharing it (Caddy's defaults).
// Each on-demand name left 16 KB on disk (3 files) for good.
const (
	storageCleanInterval = 24 * time.Hour
	expiredCertGrace     = 14 * 24 * time.Hour
)

// cachedNames remembers the names of the on-demand certificates in
// certmagic's cache, which has no way to list them. certmagic's
// maintenance leaves on-demand certificates to the handshakes, so the
// certificate of a sandbox that was deleted (no handshake ever asks for
// it again) stayed in memory until the process ended: about 4.6 KB each,
// one per sandbox name served, up to tls.acme.on_demand_rate a minute.
type cachedNames struct {
	mu    sync.Mutex
	names map[string]struct{}
}

func (c *cachedNames) add(name string) {
	c.mu.Lock()
	if c.names == nil {
		c.names = make(map[string]struct{})
	}
	c.names[name] = struct{}{}
	c.mu.Unlock()
}

func (c *cachedNames) remove(name string) {
	c.mu.Lock()
	delete(c.names, name)
	c.mu.Unlock()
}

func (c *cachedNames) list() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]string, 0, len(c.names))
	for n := range c.names {
		out = append(out, n)
	}
	return out
}

// onCached notes the names of an on-demand certificate certmagic put in
// its cache (obtained, renewed or loaded from storage).
func (s *acmeSource) onCached(data map[string]any) {
	if s.onDemand == nil {
		return
	}
	sans, _ := data["sans"].([]string)
	for _, name := range sans {
		if !s.isManagedName(name) {
			s.cached.add(name)
		}
	}
}

// sweepLoop runs sweep every sweepInterval until ctx ends.
func (s *acmeSource) sweepLoop(ctx context.Context) {
	tick := time.NewTicker(sweepInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			s.sweep(ctx)
			if err := s.cleanStorage(ctx, expiredCertGrace); err != nil && ctx.Err() == nil {
				s.log.Warn("cleaning expired certificates from the storage failed; trying again in an hour", "error", err)
			}
		}
	}
}

// cleanStorage deletes from storage the certificates that expired more
// than grace ago, unless this or another replica did within
// storageCleanInterval. An on-demand certificate is stored for every name
// ever served, and a sandbox deleted leaves its files behind; one that
// expired is of no use (a handshake for its name would order anew).
func (s *acmeSource) cleanStorage(ctx context.Context, grace time.Duration) error {
	return certmagic.CleanStorage(ctx, s.locks, certmagic.CleanStorageOptions{
		Logger:                 newZapLogger(s.log),
		Interval:               storageCleanInterval,
		ExpiredCerts:           true,
		ExpiredCertGracePeriod: grace,
	})
}

// sweep drops from memory the on-demand certificates whose name Allow
// refuses as no sandbox's (ErrUnknownName), and returns how many names it
// dropped. A name Allow cannot decide now (the route store is down) is
// kept. The certificates stay in storage: a name that comes back loads
// its certificate from there, after Allow agreed, as after a restart.
func (s *acmeSource) sweep(ctx context.Context) int {
	var gone []certmagic.SubjectIssuer
	for _, name := range s.cached.list() {
		if ctx.Err() != nil {
			break // closing: Close waits for this loop
		}
		if err := s.allow(ctx, name); err != nil && errors.Is(err, ErrUnknownName) {
			gone = append(gone, certmagic.SubjectIssuer{Subject: name})
			s.cached.remove(name)
		}
	}
	if len(gone) > 0 {
		s.cache.RemoveManaged(gone)
		s.log.Info("dropped on-demand certificates of names that are no sandbox's from memory", "count", len(gone))
	}
	return len(gone)
}
