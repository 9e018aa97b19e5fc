package main

import (
	"os/exec"
	"runtime"
	"strings"
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

// spinner starts a process that burns CPU until killed and returns it once
// it has at least ticks of CPU time, so that its exit changes the sums.
func spinner(t *testing.T, ticks uint64) *exec.Cmd {
	t.Helper()
	cmd := exec.Command("sh", "-c", "while :; do :; done")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	for end := time.Now().Add(10 * time.Second); ; runtime.Gosched() {
		if v, err := procTicks(cmd.Process.Pid); err == nil && v >= ticks {
			return cmd
		}
		if time.Now().After(end) {
			t.Fatalf("spinner %d did not reach %d ticks", cmd.Process.Pid, ticks)
		}
	}
}

// stopProc kills cmd and reaps it, so that its /proc entry is gone.
func stopProc(cmd *exec.Cmd) {
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
}

// deadPID returns the pid of a process that ran and was reaped.
func deadPID(t *testing.T) int {
	t.Helper()
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	return cmd.Process.Pid
}

// A subject whose CPU time cannot be read must fail the sample: the
// harness reported 0 µs per request for a -pids that named no process,
// and a figure wrapped around below zero when a subject process exited in
// the window.
func TestMeterFailsSampleWithoutTheSubjectsCPU(t *testing.T) {
	cases := []struct {
		name string
		// subject returns the subject's pid and what to do inside the window.
		subject func(t *testing.T) (int, func())
		want    string
	}{
		{"no such process", func(t *testing.T) (int, func()) { return deadPID(t), func() {} }, "not found"},
		{"exits during the window", func(t *testing.T) (int, func()) {
			cmd := spinner(t, 5)
			return cmd.Process.Pid, func() { stopProc(cmd) }
		}, "exited during the window"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			pid, during := tc.subject(t)
			m := newMeter([]int{pid}, nil)
			m.start()
			during()
			m.stop()
			o := &options{scenario: "http", subject: subjCube}
			s := o.newSample("http", "", m)
			if !strings.Contains(s.Failed, tc.want) {
				t.Fatalf("sample failed = %q (subject CPU %s), want a failure saying %q", s.Failed, m.subjectCPU, tc.want)
			}
		})
	}
}

// A harness process that exits in the window must not wrap the foreign
// CPU share around: the sums of utime+stime fell, and the uint64
// difference made other_cpu_pct about -10^17 %, so no noisy sample was
// ever rerun.
func TestMeterOwnProcessExitKeepsForeignShareSane(t *testing.T) {
	cmd := spinner(t, 5)
	m := newMeter(nil, []int{cmd.Process.Pid})
	m.start()
	stopProc(cmd)
	// stop computes shares only once /proc/stat has counted the window;
	// 20 ticks keep their granularity small next to the capacity.
	for end := time.Now().Add(5 * time.Second); ; runtime.Gosched() {
		if c, err := readCPUTotals(); err == nil && c.all() >= m.cpu0.all()+20 {
			break
		}
		if time.Now().After(end) {
			t.Fatal("/proc/stat did not advance")
		}
	}
	m.stop()
	if m.windowTicks == 0 {
		t.Fatal("window of zero ticks: shares not computed")
	}
	if m.otherPct < -100 || m.otherPct > 150 {
		t.Fatalf("other CPU %.3g %%, want a share of capacity", m.otherPct)
	}
}
