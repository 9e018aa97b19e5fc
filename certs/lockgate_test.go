package certs

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/caddyserver/certmagic"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// close refuses new locks at once and returns only when the held ones are
// released, or at its limit.
func TestLockGateClose(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		name     string
		lock     func(g *lockGate, name string) error
		release  bool // unlock while close waits
		wantIdle bool
	}{
		{"Lock released", func(g *lockGate, n string) error { return g.Lock(ctx, n) }, true, true},
		{"TryLock released", func(g *lockGate, n string) error {
			ok, err := g.TryLock(ctx, n)
			if err == nil && !ok {
				err = errors.New("TryLock on a free name: not taken")
			}
			return err
		}, true, true},
		{"held past the limit", func(g *lockGate, n string) error { return g.Lock(ctx, n) }, false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := &lockGate{Storage: &certmagic.FileStorage{Path: t.TempDir()}}
			if err := tt.lock(g, "held"); err != nil {
				t.Fatal(err)
			}
			limit := 30 * time.Second
			if !tt.release {
				limit = 100 * time.Millisecond
			}
			closed := make(chan bool, 1)
			go func() { closed <- g.close(limit) }()
			testenv.WaitFor(t, 10*time.Second, "a Lock refused after close", func() bool {
				err := g.Lock(ctx, "new")
				if err == nil {
					_ = g.Unlock(ctx, "new")
				}
				return errors.Is(err, errStorageClosed)
			})
			if ok, err := g.TryLock(ctx, "new"); ok || !errors.Is(err, errStorageClosed) {
				t.Fatalf("TryLock after close = %v, %v; want refused", ok, err)
			}
			if tt.release {
				select {
				case <-closed:
					t.Fatal("close returned while a lock was held")
				default:
				}
				if err := g.Unlock(ctx, "held"); err != nil {
					t.Fatal(err)
				}
			}
			select {
			case idle := <-closed:
				if idle != tt.wantIdle {
					t.Fatalf("close = %v, want %v", idle, tt.wantIdle)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("close did not return")
			}
			if !tt.release {
				_ = g.Unlock(ctx, "held")
			}
		})
	}
}

// TryLock names (certmagic's ARI refreshes) are granted at most once per
// tryLockSpacing each, whatever became of the lock: a refresh that failed
// is not tried again by the next handshake.
func TestLockGateSpacesTryLocks(t *testing.T) {
	g := &lockGate{}
	t0 := time.Now()
	steps := []struct {
		name string
		at   time.Duration
		want bool
	}{
		{"a", 0, true},
		{"a", time.Second, false},
		{"b", time.Second, true},
		{"a", tryLockSpacing - time.Second, false},
		{"a", tryLockSpacing, true},
		{"b", tryLockSpacing, false},
		{"b", tryLockSpacing + time.Second, true},
	}
	for i, st := range steps {
		if got := g.spaced(st.name, t0.Add(st.at)); got != st.want {
			t.Fatalf("step %d: %s at %v granted %v, want %v", i, st.name, st.at, got, st.want)
		}
	}
	if n := len(g.tried); n > 2 {
		t.Fatalf("%d names remembered, want at most 2", n)
	}
}
