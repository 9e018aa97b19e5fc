package testenv

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
)

// fatalTB records Fatalf instead of ending the goroutine, so that a test
// can see a helper give up.
type fatalTB struct {
	testing.TB
	msg string
}

func (f *fatalTB) Helper() {}

func (f *fatalTB) Fatalf(format string, args ...any) { f.msg = fmt.Sprintf(format, args...) }

// Each bounded wait gives up after its duration, naming what did not
// happen, where the bare form (the other side gone) waited for ever.
func TestBoundedWaitsGiveUp(t *testing.T) {
	t.Parallel()
	var wg sync.WaitGroup
	wg.Add(1)
	defer wg.Done()
	for _, tc := range []struct {
		name string
		wait func(testing.TB)
	}{
		{"Recv", func(tb testing.TB) { Recv(tb, make(chan int), 10*time.Millisecond, "a value nobody sends") }},
		{"Send", func(tb testing.TB) { Send(tb, make(chan int), 1, 10*time.Millisecond, "a value nobody sends") }},
		{"WaitGroup", func(tb testing.TB) { WaitGroup(tb, &wg, 10*time.Millisecond, "a value nobody sends") }},
	} {
		f := &fatalTB{TB: t}
		tc.wait(f)
		if !strings.Contains(f.msg, "a value nobody sends") {
			t.Errorf("%s: failed with %q, want it to name what it waited for", tc.name, f.msg)
		}
	}
	// What comes in time is taken, with no failure.
	f := &fatalTB{TB: t}
	ch := make(chan int, 1)
	ch <- 7
	if v := Recv(f, ch, time.Second, "seven"); v != 7 || f.msg != "" {
		t.Errorf("Recv: %d, %q; want 7 and no failure", v, f.msg)
	}
}
