package loglimit

import (
	"slices"
	"sync"
	"testing"
	"time"
)

// A Limit lets the first line through, holds back and counts the lines
// within the interval after it, and lets the next line after the interval
// through with that count, counting from nothing again.
func TestAdmit(t *testing.T) {
	const every = 10 * time.Second
	type step struct {
		at   time.Duration // after the first line
		ok   bool
		held int64
	}
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{"first line passes", []step{{0, true, 0}}},
		{"repeats within the interval held", []step{{0, true, 0}, {time.Second, false, 0}, {every - time.Nanosecond, false, 0}}},
		{"next line carries the count", []step{{0, true, 0}, {time.Second, false, 0}, {2 * time.Second, false, 0}, {every, true, 2}}},
		{"count reset after it is carried", []step{{0, true, 0}, {1, false, 0}, {every, true, 1}, {2 * every, true, 0}}},
		{"interval counts from the last line let through", []step{{0, true, 0}, {every + time.Second, true, 0}, {2 * every, false, 0}, {2*every + time.Second, true, 1}}},
		{"a line dated before the last held", []step{{0, true, 0}, {-time.Second, false, 0}, {every, true, 1}}},
	} {
		// Times as time.Now gives them (with a monotonic reading) and as
		// a test's fixed clock does (wall clock alone, years back).
		for _, base := range []time.Time{time.Now(), time.Unix(1_700_000_000, 0)} {
			var l Limit
			for i, s := range tc.steps {
				held, ok := l.Admit(base.Add(s.at), every)
				if ok != s.ok || held != s.held {
					t.Errorf("%s (base %v): step %d at %v: Admit = %d, %v; want %d, %v", tc.name, base, i, s.at, held, ok, s.held, s.ok)
				}
			}
		}
	}
}

// Lines admitted from many goroutines at once: one per interval passes and
// every other one is counted on a line that passes (the race detector
// checks the Limit's own accesses). Many short rounds, not a few long ones:
// two goroutines checking the last line at once happens at a round's
// start, and a check-then-store without the compare-and-swap let two lines
// through in every run of 500 under -race, in one run of 8 with 5 rounds.
func TestAdmitConcurrent(t *testing.T) {
	const (
		every      = time.Second
		goroutines = 8
		perRound   = 20  // lines each goroutine admits in a round
		rounds     = 500 // intervals: each a race for the one line
	)
	var l Limit
	t0 := time.Now()
	var counted int64
	for r := range rounds {
		now := t0.Add(time.Duration(r) * every)
		var mu sync.Mutex
		passed := 0
		var wg sync.WaitGroup
		start := make(chan struct{})
		for range goroutines {
			wg.Go(func() {
				<-start
				for range perRound {
					if held, ok := l.Admit(now, every); ok {
						mu.Lock()
						passed++
						counted += held
						mu.Unlock()
					}
				}
			})
		}
		close(start)
		wg.Wait()
		if passed != 1 {
			t.Fatalf("round %d: %d lines passed, want 1", r, passed)
		}
	}
	// The line after the last interval carries what is still held.
	held, ok := l.Admit(t0.Add(rounds*every), every)
	if !ok {
		t.Fatal("the line after the last interval was held back")
	}
	if want := int64(rounds * (goroutines*perRound - 1)); counted+held != want {
		t.Fatalf("lines passed counted %d held back, want %d", counted+held, want)
	}
}

// Admit runs on the proxy's request path: it must not allocate.
func TestAdmitNoAllocs(t *testing.T) {
	var l Limit
	if n := testing.AllocsPerRun(1000, func() { l.Admit(time.Now(), time.Second) }); n != 0 {
		t.Fatalf("Admit allocated %v times a call, want 0", n)
	}
}

// The count goes on the line only when lines were held back.
func TestWithSuppressed(t *testing.T) {
	for _, tc := range []struct {
		held int64
		want []any
	}{
		{0, []any{"k", "v"}},
		{3, []any{"k", "v", "suppressed", int64(3)}},
	} {
		if got := WithSuppressed(tc.held, "k", "v"); !slices.Equal(got, tc.want) {
			t.Errorf("WithSuppressed(%d) = %v, want %v", tc.held, got, tc.want)
		}
	}
}
