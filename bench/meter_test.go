package main

import (
	"sync/atomic"
	"testing"
	"time"
)

// Rates divide counts by the meter's wall time, so the counts must be read
// where that clock starts and stops, not around the meter's /proc walks,
// which take milliseconds on a busy core. The counter here counts
// nanoseconds, so its delta must equal the wall time.
func TestWindowCountersCoverTheMeteredWall(t *testing.T) {
	// Walking every process's tree is slow to read, as a subject with many
	// threads is on a loaded core. A preemption between the clock and a
	// mark can still open a gap on a busy CI core, so the best of a few
	// windows is judged: counters read around the walks miss every time.
	m := newMeter([]int{1}, []int{1})
	o := &options{dur: 20 * time.Millisecond}
	var gap time.Duration
	for range 5 {
		var phase atomic.Int32
		var marks []time.Time
		o.window(m, &phase, func() { marks = append(marks, time.Now()) })
		if len(marks) != 2 {
			t.Fatalf("mark ran %d times, want 2", len(marks))
		}
		if phase.Load() != phaseStop {
			t.Fatalf("phase %d after the window, want stop", phase.Load())
		}
		if gap = marks[1].Sub(marks[0]) - m.wall; gap <= 200*time.Microsecond && gap >= -200*time.Microsecond {
			return
		}
	}
	t.Fatalf("in every window the counters' span missed the meter's wall (%s) by more than 200µs, last by %s: rates off by %.1f%%",
		m.wall, gap, 100*float64(gap)/float64(m.wall))
}
