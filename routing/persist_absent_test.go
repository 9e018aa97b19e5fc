package routing

import (
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// A Remove of an id that has no route, and whose delete is not still to
// be written, changes nothing: it neither writes the file nor waits for a
// write of another change under way (seconds at 100k routes), as the
// admin API's meta/delete of an unknown sandbox did. A Remove that
// follows the id's own delete still returns only once that is on disk.
func TestPersistRemoveOfAbsentIDDoesNotWait(t *testing.T) {
	path := filepath.Join(t.TempDir(), "routes.yaml")
	s := NewMemoryStore()
	if err := s.Put(mustRoute(t, "gone")); err != nil {
		t.Fatal(err)
	}
	s.SetPersistPath(path)

	release := make(chan struct{})
	var writes atomic.Int64
	s.beforeWrite = func(uint64) {
		if writes.Add(1) == 1 {
			<-release // the first write is slow
		}
	}
	putDone := make(chan error, 1)
	go func() { putDone <- s.Put(mustRoute(t, "slow")) }()
	testenv.WaitFor(t, 5*time.Second, "the first write to start", func() bool { return writes.Load() == 1 })

	absent := make(chan error, 1)
	go func() {
		ok, err := s.Remove("never-there")
		if ok {
			t.Error("Remove found a route that was never there")
		}
		absent <- err
	}()
	select {
	case err := <-absent:
		if err != nil {
			t.Fatalf("Remove of an absent id: %v", err)
		}
	case <-time.After(10 * time.Second): // a failure bound, not a synchronisation
		close(release)
		t.Fatal("Remove of an absent id waited for another change's write")
	}

	// The id's own delete, queued behind the slow write, and its retry.
	first, retry := make(chan error, 1), make(chan error, 1)
	go func() { _, err := s.Remove("gone"); first <- err }()
	testenv.WaitFor(t, 5*time.Second, "the delete made", func() bool { _, ok := s.Get("gone"); return !ok })
	go func() { _, err := s.Remove("gone"); retry <- err }()
	close(release)
	for _, ch := range []chan error{putDone, first, retry} {
		if err := <-ch; err != nil {
			t.Fatal(err)
		}
	}
	reloaded, err := LoadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := reloaded.Get("gone"); ok {
		t.Error("the file still holds the deleted route")
	}
	if n := writes.Load(); n != 2 {
		t.Errorf("%d writes, want 2 (the slow one, then the delete's)", n)
	}
}
