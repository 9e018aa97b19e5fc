package accesslog

import (
	"bytes"
	"runtime"
	"sync"
	"testing"
)

// lineCounter counts the lines written to it.
type lineCounter struct {
	mu sync.Mutex
	n  int
}

func (w *lineCounter) Write(p []byte) (int, error) {
	w.mu.Lock()
	w.n += bytes.Count(p, []byte{'\n'})
	w.mu.Unlock()
	return len(p), nil
}

func (w *lineCounter) lines() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.n
}

// Every line Log is given is written or counted as dropped, also when Log
// races Close (a request that ends as the proxy stops): a Log that had
// found the logger open queued its line after the writer's last drain, and
// the line stayed in the queue, neither written nor counted; and a Log
// after Close discarded its line uncounted.
func TestLogRacingCloseLosesNoLineUncounted(t *testing.T) {
	const loggers, each = 4, 100
	iterations := 100
	if testing.Short() {
		iterations = 20
	}
	for i := range iterations {
		out := &lineCounter{}
		l, err := New(Config{Format: FormatCube, Output: out}, nil)
		if err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		start := make(chan struct{})
		for range loggers {
			wg.Go(func() {
				<-start
				for range each {
					l.Log(&Entry{Time: testTime})
				}
			})
		}
		close(start)
		for out.lines() == 0 { // Close while lines flow
			runtime.Gosched()
		}
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		wg.Wait()
		written, dropped := out.lines(), l.Dropped()
		if got := written + int(dropped); got != loggers*each {
			t.Fatalf("iteration %d: %d lines written and %d dropped, want %d in all: %d lost uncounted",
				i, written, dropped, loggers*each, loggers*each-got)
		}
	}
}
