package routing

import (
	"context"
	"fmt"
	"path/filepath"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// Changes that arrive while the routes file is being written share the
// next write: each rewrite encodes the whole table (seconds at 100k
// routes), so a write per change would hold a burst of admin calls for
// minutes. Lookups and reads go on while a write is in progress.
func TestPersistCoalescesQueuedChanges(t *testing.T) {
	path := filepath.Join(t.TempDir(), "routes.yaml")
	s := NewMemoryStore()
	s.SetPersistPath(path)

	release := make(chan struct{})
	var mu sync.Mutex
	var writes []uint64
	s.beforeWrite = func(seq uint64) {
		mu.Lock()
		writes = append(writes, seq)
		first := len(writes) == 1
		mu.Unlock()
		if first {
			<-release // the first write is slow
		}
	}

	const queued = 7
	errs := make(chan error, queued+1)
	go func() { errs <- s.Put(mustRoute(t, "first")) }()
	testenv.WaitFor(t, 5*time.Second, "the first write to start", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(writes) == 1
	})
	// The write holds no lock that reads need.
	if _, err := s.Lookup(context.Background(), "first"); err != nil {
		t.Fatalf("Lookup during a write: %v", err)
	}
	if n := len(s.List()); n != 1 {
		t.Fatalf("List during a write: %d routes, want 1", n)
	}

	for i := range queued {
		go func() { errs <- s.Put(mustRoute(t, fmt.Sprintf("queued-%d", i))) }()
	}
	testenv.WaitFor(t, 5*time.Second, "every queued change made", func() bool {
		s.mu.RLock()
		defer s.mu.RUnlock()
		return s.seq == queued+1
	})
	close(release)
	for range queued + 1 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}

	mu.Lock()
	got := append([]uint64(nil), writes...)
	mu.Unlock()
	if want := []uint64{1, queued + 1}; !reflect.DeepEqual(got, want) {
		t.Errorf("writes of changes %v, want %v: the queued changes share one write", got, want)
	}
	reloaded, err := LoadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(reloaded.List(), s.List()) {
		t.Fatalf("file holds %d routes, memory %d", len(reloaded.List()), len(s.List()))
	}
}
