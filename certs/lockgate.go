package certs

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/caddyserver/certmagic"
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

	mu     sync.Mutex
	held   int
	closed bool
	idle   chan struct{} // closed once closed and held is 0; nil until waited on
}

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
