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
	// threads is on a loaded core.
	m := newMeter([]int{1}, []int{1})
	o := &options{dur: 20 * time.Millisecond}
	var phase atomic.Int32
	var marks []time.Time
	o.window(m, &phase, func() { marks = append(marks, time.Now()) })
	if len(marks) != 2 {
		t.Fatalf("mark ran %d times, want 2", len(marks))
	}
	counted := marks[1].Sub(marks[0])
	if gap := counted - m.wall; gap > 200*time.Microsecond || gap < -200*time.Microsecond {
		t.Fatalf("counters cover %s, the meter's wall is %s: rates off by %.1f%%",
			counted, m.wall, 100*float64(gap)/float64(m.wall))
	}
	if phase.Load() != phaseStop {
		t.Fatalf("phase %d after the window, want stop", phase.Load())
	}
}
