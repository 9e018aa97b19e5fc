package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
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
	// The harness's own process is metered too, and its ticks grow in the
	// window: the spinner's must outweigh that growth for the sums to
	// fall. A busy wait for /proc/stat below (this process spinning)
	// outgrew a 5-tick spinner, and the test passed with the sums
	// subtracted.
	cmd := spinner(t, 30)
	m := newMeter(nil, []int{cmd.Process.Pid})
	m.start()
	stopProc(cmd)
	// stop computes shares only once /proc/stat has counted the window;
	// 20 ticks keep their granularity small next to the capacity.
	testenv.WaitFor(t, 5*time.Second, "/proc/stat to advance", func() bool {
		c, err := readCPUTotals()
		return err == nil && c.all() >= m.cpu0.all()+20
	})
	m.stop()
	if m.windowTicks == 0 {
		t.Fatal("window of zero ticks: shares not computed")
	}
	if m.otherPct < -100 || m.otherPct > 150 {
		t.Fatalf("other CPU %.3g %%, want a share of capacity", m.otherPct)
	}
}

// A subject process started in the window (a worker the subject forks)
// counts whole: it is absent from the reading at the start, and its CPU
// time is the subject's all the same.
func TestMeterCountsSubjectChildStartedInTheWindow(t *testing.T) {
	// The subject forks its worker when told to, on its stdin.
	cmd := exec.Command("sh", "-c", "read go; sh -c 'while :; do :; done' & wait")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // its worker is ended with it
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL); _ = cmd.Wait() })
	m := newMeter([]int{cmd.Process.Pid}, nil)
	m.start()
	if _, err := in.Write([]byte("go\n")); err != nil {
		t.Fatal(err)
	}
	const ticks = 10
	testenv.WaitFor(t, 10*time.Second, "the worker to spin", func() bool {
		for _, p := range procTree(cmd.Process.Pid)[1:] {
			if v, err := procTicks(p); err == nil && v >= ticks {
				return true
			}
		}
		return false
	})
	m.stop()
	if m.err != nil {
		t.Fatal(m.err)
	}
	if least := ticks * time.Second / clkTck; m.subjectCPU < least {
		t.Fatalf("subject CPU %s, want at least the worker's %s", m.subjectCPU, least)
	}
}

// since subtracts process by process. A pid of the start reading that
// shows fewer ticks at the end is another process (the pid was reused)
// and counts whole; subtracted, it wrapped around to about 1.8e19 ticks.
func TestTicksSince(t *testing.T) {
	for _, tc := range []struct {
		name      string
		base, now ticksByPID
		want      uint64
		wantGone  []int
	}{
		{"grew", ticksByPID{1: 10, 2: 5}, ticksByPID{1: 15, 2: 5}, 5, nil},
		{"started in the window", ticksByPID{1: 10}, ticksByPID{1: 10, 3: 7}, 7, nil},
		{"exited in the window", ticksByPID{1: 10, 2: 50}, ticksByPID{1: 12}, 2, []int{2}},
		{"pid reused", ticksByPID{1: 10, 2: 50}, ticksByPID{1: 10, 2: 3}, 3, nil},
		{"nothing", ticksByPID{}, ticksByPID{}, 0, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, gone := tc.now.since(tc.base)
			if got != tc.want || !slices.Equal(gone, tc.wantGone) {
				t.Fatalf("since = %d, gone %v; want %d, gone %v", got, gone, tc.want, tc.wantGone)
			}
		})
	}
}

// The harness's CPU (load generator, backend, redis) is metered apart from
// the subject's: a closed-loop rate is the subject's speed only when the
// subject, not the harness, ran out of CPU. Here the harness process spins
// and the subject sleeps: the spinner's ticks must land in the harness
// share and none in the subject's, and both shares go into the sample.
func TestMeterSeparatesHarnessFromSubjectCPU(t *testing.T) {
	subject := exec.Command("sleep", "30")
	if err := subject.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stopProc(subject) })
	spin := spinner(t, 1)
	m := newMeter([]int{subject.Process.Pid}, []int{spin.Process.Pid, subject.Process.Pid})
	m.start()
	base, err := procTicks(spin.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	const ticks = 20
	var spun uint64
	testenv.WaitFor(t, 10*time.Second, "the harness process to spin", func() bool {
		v, err := procTicks(spin.Process.Pid)
		spun = v - base
		return err == nil && spun >= ticks
	})
	m.stop()
	if m.err != nil {
		t.Fatal(m.err)
	}
	if least := time.Duration(spun) * time.Second / clkTck; m.harnessCPU < least {
		t.Fatalf("harness CPU %s, want at least the spinner's %s", m.harnessCPU, least)
	}
	if m.subjectCPU > 2*time.Second/clkTck {
		t.Fatalf("subject CPU %s for a sleeping subject", m.subjectCPU)
	}
	s := (&options{scenario: "http", subject: subjCube}).newSample("http", "", m)
	want := 100 * m.harnessCPU.Seconds() / m.wall.Seconds()
	if got, ok := s.Metrics["harness_cpu_pct"]; !ok || got != want || got <= 0 {
		t.Fatalf("harness_cpu_pct = %v (%v), want %.1f", got, ok, want)
	}
	if _, ok := s.Metrics["subject_cpu_pct"]; !ok {
		t.Fatal("no subject_cpu_pct in the sample")
	}
}

// idleThreadsEnv makes the test binary, started by idleThreads, a process
// that holds that many idle OS threads until it is killed.
const idleThreadsEnv = "BENCH_TEST_IDLE_THREADS"

func TestMain(m *testing.M) {
	if n, err := strconv.Atoi(os.Getenv(idleThreadsEnv)); err == nil {
		var wg sync.WaitGroup
		for range n {
			wg.Add(1)
			go func() {
				runtime.LockOSThread() // the goroutine blocks, its thread stays
				wg.Done()
				select {}
			}()
		}
		wg.Wait()
		fmt.Println("ready")
		// Until the test closes stdin or dies: a helper must not outlive it.
		_, _ = io.Copy(io.Discard, os.Stdin)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// idleThreads starts a process with n idle threads and returns its pid
// once they exist.
func idleThreads(t *testing.T, n int) int {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%d", idleThreadsEnv, n))
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cmd.StdinPipe(); err != nil { // held open until cmd is reaped
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stopProc(cmd) })
	ready := make(chan error, 1)
	go func() {
		line, err := bufio.NewReader(out).ReadString('\n')
		if err == nil && line != "ready\n" {
			err = fmt.Errorf("helper said %q", line)
		}
		ready <- err
	}()
	if err := testenv.Recv(t, ready, 30*time.Second, "the idle-threads helper to start"); err != nil {
		t.Fatal(err)
	}
	return cmd.Process.Pid
}

// The harness's CPU share counts the processes' time over the window the
// capacity does. Finding the process trees reads a /proc file per thread,
// 35 µs of CPU each: read inside the window, that walk and every harness
// and subject process running meanwhile were counted as the harness's
// while /proc/stat was read before it, so other_cpu_pct came out low by
// the walks' share. The 2026-12-06 --quick run showed it: harness CPU
// 115-119 % of its one pinned core and other CPU down to -10 % in the
// 0.7 s sse-tput windows, so up to 10 % of foreign load passed the 5 %
// rerun rule. Here the harness process is idle but has 2,000 threads,
// whose walk costs about 70 ms of this process's CPU.
func TestMeterWalksTheProcessTreesOutsideTheWindow(t *testing.T) {
	helper := idleThreads(t, 2000)
	m := newMeter(nil, []int{helper})
	// Ticks are whole 10 ms; the idle processes may cross a boundary or
	// two, and one window may be preempted: the best of three is judged.
	const most = 3 * time.Second / clkTck
	var got []time.Duration
	for range 3 {
		m.start()
		time.Sleep(50 * time.Millisecond)
		m.stop()
		if m.harnessCPU <= most {
			return
		}
		got = append(got, m.harnessCPU)
	}
	t.Fatalf("harness CPU %v in windows of %s with idle harness processes, want at most %s: the tree walks were counted", got, m.wall.Round(time.Millisecond), most)
}
