package testenv

import (
	"sync"
	"testing"
	"time"
)

// WaitFor polls cond until it holds, failing the test after d.
func WaitFor(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Eventually polls cond until it returns nil, failing the test with its
// last error after d.
func Eventually(t testing.TB, d time.Duration, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("condition not met after %v: %v", d, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Recv waits up to d for a value on ch (or its close) and returns it,
// failing the test when none comes: a bare receive whose sender is gone
// (a proxy that misbehaves never lets the backend see the request) would
// otherwise hold the whole package until go test's -timeout.
func Recv[T any](t testing.TB, ch <-chan T, d time.Duration, what string) T {
	t.Helper()
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case v := <-ch:
		return v
	case <-timer.C:
		t.Fatalf("timed out after %v waiting for %s", d, what)
	}
	var zero T
	return zero
}

// Send waits up to d for ch to take v, failing the test when its
// receiver never does: it may have returned already.
func Send[T any](t testing.TB, ch chan<- T, v T, d time.Duration, what string) {
	t.Helper()
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case ch <- v:
	case <-timer.C:
		t.Fatalf("timed out after %v waiting for %s", d, what)
	}
}

// WaitGroup waits up to d for wg, failing the test when its goroutines
// have not all ended by then.
func WaitGroup(t testing.TB, wg *sync.WaitGroup, d time.Duration, what string) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	Recv(t, done, d, what)
}
