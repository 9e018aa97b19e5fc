package routing

import (
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// waitingForWrite reports whether a goroutine is in Remove's persist,
// waiting for persistMu: for a write under way to end. It is how a test
// tells, without a sleep, that a call waits rather than has yet to run.
func waitingForWrite() bool {
	for _, g := range testenv.Stacks() {
		if strings.Contains(g, "routing.(*MemoryStore).Remove(") && strings.Contains(g, "routing.(*MemoryStore).persist(") &&
			(strings.Contains(g, "sync.(*Mutex).Lock") || strings.Contains(g, "sync.(*Mutex).lockSlow")) {
			return true
		}
	}
	return false
}

// heldWrite makes the store's next write wait in beforeWrite: held is
// closed once it waits, and it goes on once release is closed. Later
// writes do not wait.
func heldWrite(s *MemoryStore) (held, release chan struct{}) {
	held, release = make(chan struct{}), make(chan struct{})
	var writes atomic.Int64
	s.beforeWrite = func(uint64) {
		if writes.Add(1) == 1 {
			close(held)
			<-release
		}
	}
	return held, release
}

// A client that gave up waiting on a delete and retried it must get its
// success only once the file lacks the route: the retry, finding the
// route gone from memory, waits for that delete's write, however long it
// takes, rather than return at once with the route still in the file
// (a restart then would bring it back).
func TestPersistRetriedRemoveWaitsForItsDeletesWrite(t *testing.T) {
	path := filepath.Join(t.TempDir(), "routes.yaml")
	s := NewMemoryStore()
	if err := s.Put(mustRoute(t, "gone")); err != nil {
		t.Fatal(err)
	}
	s.SetPersistPath(path)
	held, release := heldWrite(s)
	first := make(chan error, 1)
	go func() { _, err := s.Remove("gone"); first <- err }()
	testenv.Recv(t, held, 5*time.Second, "the delete's write to start")

	retry := make(chan error, 1)
	go func() { _, err := s.Remove("gone"); retry <- err }()
	testenv.WaitFor(t, 10*time.Second, "the retry to return or to wait for the write", func() bool {
		return len(retry) > 0 || waitingForWrite()
	})
	select {
	case err := <-retry:
		close(release)
		t.Fatalf("the retried Remove returned (err %v) while its delete's write was still under way: the file still holds the route", err)
	default:
	}
	close(release)
	for _, ch := range []chan error{first, retry} {
		if err := testenv.Recv(t, ch, 10*time.Second, "the delete and its retry to return"); err != nil {
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
}

// A write that failed is retried by the next Remove, whatever id it
// names; once a later write succeeded, the file is current again, and a
// Remove of an id with no route goes back to changing nothing: it must
// not wait behind another change's write under way (seconds at 100k
// routes), as TestPersistRemoveOfAbsentIDDoesNotWait requires of a store
// whose writes never failed.
func TestPersistRemoveOfAbsentIDDoesNotWaitOnceAWriteSucceeded(t *testing.T) {
	path := filepath.Join(t.TempDir(), "routes.yaml")
	s := NewMemoryStore()
	s.SetPersistPath(path)
	s.fileLimit = 1 // no table fits: the write fails
	if err := s.Put(mustRoute(t, "a")); err == nil {
		t.Fatal("a write of a table over the file limit succeeded")
	}
	s.fileLimit = 0
	if err := s.Put(mustRoute(t, "b")); err != nil {
		t.Fatal(err)
	}
	held, release := heldWrite(s)
	defer func() {
		select {
		case <-release:
		default:
			close(release)
		}
	}()
	putDone := make(chan error, 1)
	go func() { putDone <- s.Put(mustRoute(t, "slow")) }()
	testenv.Recv(t, held, 5*time.Second, "the slow write to start")

	absent := make(chan error, 1)
	go func() { _, err := s.Remove("never-there"); absent <- err }()
	testenv.WaitFor(t, 10*time.Second, "the Remove to return or to wait for the write", func() bool {
		return len(absent) > 0 || waitingForWrite()
	})
	waited := len(absent) == 0
	if waited {
		t.Error("Remove of an absent id waits for another change's write, a write after the failed one having succeeded")
	}
	close(release)
	if err := testenv.Recv(t, putDone, 10*time.Second, "the slow write to end"); err != nil {
		t.Fatal(err)
	}
	if err := testenv.Recv(t, absent, 10*time.Second, "the Remove to return"); err != nil {
		t.Errorf("Remove of an absent id: %v", err)
	}
}
