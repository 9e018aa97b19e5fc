package certs

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/caddyserver/certmagic"

	"github.com/cube-sandbox/cubeproxy/internal/loglimit"
)

// errStorageClosed refuses a certificate lock asked for after Close.
var errStorageClosed = errors.New("certificate manager closed")

// lockGate is certmagic's storage with the locks it takes counted, so that
// close can refuse new ones and wait for those held to be released.
//
// Cancelling certmagic's context does not stop its work at once: an
// obtain or renewal in flight unwinds and then removes its lock file, and
// a job queued before the cancel still starts and creates one. Without
// the gate, Close returned while that went on: a proxy exiting then left
// a lock file that a restarted proxy sharing the storage waits on (10 s
// for a file lock, longer for other storages), and a caller removing the
// storage directory after Close raced certmagic re-creating it.
type lockGate struct {
	certmagic.Storage
	// log receives a warning when a write fails (see Store); nil logs none.
	log *slog.Logger
	// storeFailures spaces those warnings out.
	storeFailures loglimit.Limit

	mu     sync.Mutex
	held   int
	closed bool
	idle   chan struct{} // closed once closed and held is 0; nil until waited on
	// tried holds when each TryLock name was last granted (see TryLock),
	// and pruned when names past their spacing were last forgotten.
	tried  map[string]time.Time
	pruned time.Time
}

// tryLockSpacing is how long a name granted by TryLock is refused after,
// held or not. certmagic takes TryLock only to refresh a certificate's
// renewal information (ARI) from the CA, which it then asks again only
// after the CA's Retry-After (6 hours at Let's Encrypt) — when the CA
// answered. An on-demand certificate's refresh is started by each
// handshake that serves it, and one that failed (the CA down) left the
// next handshake to try again: a busy sandbox host sent the CA in an
// outage a request, and the log two error lines, every few seconds, per
// certificate. Refreshes of a certificate are spaced by this, under the
// 10 minutes between maintenance passes (which refresh the managed ones),
// so those are never refused.
const tryLockSpacing = 5 * time.Minute

func (g *lockGate) enter() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return errStorageClosed
	}
	g.held++
	return nil
}

func (g *lockGate) leave() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.held > 0 { // an Unlock without its Lock must not wedge close
		g.held--
	}
	if g.closed && g.held == 0 && g.idle != nil {
		close(g.idle)
		g.idle = nil
	}
}

// Lock takes the storage lock unless the gate is closed.
func (g *lockGate) Lock(ctx context.Context, name string) error {
	if err := g.enter(); err != nil {
		return err
	}
	if err := g.Storage.Lock(ctx, name); err != nil {
		g.leave()
		return err
	}
	return nil
}

// TryLock keeps the storage's TryLock, which certmagic prefers for its
// ARI locks when the storage has one (FileStorage does).
func (g *lockGate) TryLock(ctx context.Context, name string) (bool, error) {
	if !g.spaced(name, time.Now()) {
		return false, nil // as taken: certmagic skips the refresh quietly
	}
	if err := g.enter(); err != nil {
		return false, err
	}
	tl, ok := g.Storage.(certmagic.TryLocker)
	if !ok {
		if err := g.Storage.Lock(ctx, name); err != nil {
			g.leave()
			return false, err
		}
		return true, nil
	}
	got, err := tl.TryLock(ctx, name)
	if !got || err != nil {
		g.leave()
	}
	return got, err
}

// spaced reports whether name was last granted by TryLock at least
// tryLockSpacing before now, and if so notes now as its grant.
func (g *lockGate) spaced(name string, now time.Time) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if last, ok := g.tried[name]; ok && now.Sub(last) < tryLockSpacing {
		return false
	}
	if g.tried == nil {
		g.tried = make(map[string]time.Time)
	}
	if now.Sub(g.pruned) >= tryLockSpacing {
		// Names are per certificate: forget those past their spacing,
		// so the map holds about the certificates refreshed lately.
		for n, last := range g.tried {
			if now.Sub(last) >= tryLockSpacing {
				delete(g.tried, n)
			}
		}
		g.pruned = now
	}
	g.tried[name] = now
	return true
}

// Unlock releases the storage lock.
func (g *lockGate) Unlock(ctx context.Context, name string) error {
	defer g.leave()
	return g.Storage.Unlock(ctx, name)
}

// close refuses new locks and waits up to limit for the held ones to be
// released; it reports whether they were.
func (g *lockGate) close(limit time.Duration) bool {
	g.mu.Lock()
	g.closed = true
	if g.held == 0 {
		g.mu.Unlock()
		return true
	}
	if g.idle == nil {
		g.idle = make(chan struct{})
	}
	idle := g.idle
	g.mu.Unlock()
	t := time.NewTimer(limit)
	defer t.Stop()
	select {
	case <-idle:
		return true
	case <-t.C:
		return false
	}
}

// storageWarnEvery is how often a failing certificate storage write is
// logged: certmagic retries it on every new name's handshake, so unlimited
// it would be a line per handshake, as its own per-handshake lines were.
const storageWarnEvery = 10 * time.Second

// Store stores value at key, and warns when the write fails, at most once
// every storageWarnEvery (with the count held back). certmagic checks
// that the storage takes a write before each on-demand order and hands a
// failure to the waiting handshake alone: a storage_dir that stopped
// taking writes after the start (a volume gone read-only or full) failed
// every new sandbox name's handshake with no line above debug level,
// while /readyz said ready.
func (g *lockGate) Store(ctx context.Context, key string, value []byte) error {
	err := g.Storage.Store(ctx, key, value)
	if err != nil && g.log != nil {
		if suppressed, ok := g.storeFailures.Admit(time.Now(), storageWarnEvery); ok {
			g.log.Warn("certificate storage write failed; certificates cannot be obtained or renewed until tls.acme.storage_dir takes writes (logged at most once every 10 s)",
				loglimit.WithSuppressed(suppressed, "key", key, "error", err)...)
		}
	}
	return err
}
