package main

import (
	"fmt"
	"os"
	"slices"
	"time"
)

// meter measures one sample window: wall time, the subject's CPU time, and
// the CPU time that processes outside the benchmark took meanwhile.
type meter struct {
	subject []int // process trees of the subject under test
	own     []int // other process trees of the harness (backend, redis); self is added

	t0    time.Time
	cpu0  cpuTotals
	own0  ticksByPID
	subj0 ticksByPID
	// The processes of the subject's trees and of all trees, found by
	// start before its readings.
	subjPIDs, allPIDs []int

	// Filled by stop.
	wall       time.Duration
	subjectCPU time.Duration
	// harnessCPU is the CPU time of the harness's other processes (load
	// generator, backend, redis): with the pinning of compare.sh, CPU 1's
	// load, which bounds every closed-loop rate as much as the subject.
	harnessCPU  time.Duration
	otherPct    float64 // busy CPU outside the harness, % of all CPU capacity
	stealPct    float64
	busyPct     float64 // all busy CPU, % of capacity
	windowTicks uint64
	// err says why subjectCPU is not the subject's CPU time: a subject
	// process that could not be read or exited during the window. The
	// sample is then failed: a CPU time of zero would read as a result.
	err error
}

func newMeter(subject, own []int) *meter {
	return &meter{subject: subject, own: append(append([]int{}, own...), os.Getpid())}
}

// trees returns the processes of the subject's trees and of all trees,
// walking each tree once: the subject's are part of all.
func (m *meter) trees() (subj, all []int) {
	subj = treePIDs(m.subject)
	all = slices.Clone(subj)
	for _, p := range treePIDs(m.own) {
		if !slices.Contains(all, p) {
			all = append(all, p)
		}
	}
	return subj, all
}

// start and stop read in mirror order, the cheap /proc/stat next to the
// clock and the subject's CPU time next to it. The process trees are found
// before the window opens and after it closes, and only each process's
// stat file is read at its edges: the walk reads a file per thread, and
// done between the readings, its own CPU time and that of every process
// running meanwhile counted as the harness's while /proc/stat had not
// counted it (harness CPU above 100 % of its core, other CPU down to
// -10 % in 0.7 s windows, hiding foreign load from the rerun rule).
func (m *meter) start() {
	m.subjPIDs, m.allPIDs = m.trees()
	m.own0 = readTicks(m.allPIDs)
	m.subj0 = readTicks(m.subjPIDs)
	m.cpu0, _ = readCPUTotals()
	m.t0 = time.Now()
	var missing []int
	for _, p := range m.subject {
		if _, ok := m.subj0[p]; !ok {
			missing = append(missing, p)
		}
	}
	if len(missing) > 0 {
		m.err = fmt.Errorf("subject process %v not found: no CPU time to measure", missing)
	}
}

func (m *meter) stop() {
	m.wall = time.Since(m.t0)
	cpu1, _ := readCPUTotals()
	subj1 := readTicks(m.subjPIDs)
	own1 := readTicks(m.allPIDs)
	// A process started in the window (a worker the subject forked)
	// counts whole.
	subjNow, allNow := m.trees()
	subj1.addStarted(subjNow, m.subjPIDs)
	own1.addStarted(allNow, m.allPIDs)
	subj, gone := subj1.since(m.subj0)
	if len(gone) > 0 && m.err == nil {
		m.err = fmt.Errorf("subject process %v exited during the window: its CPU time is lost", gone)
	}
	m.subjectCPU = time.Duration(subj) * time.Second / clkTck
	// Harness processes that exited took their window's CPU time along,
	// which then counts as foreign: erring towards a rerun.
	own, _ := own1.since(m.own0)
	if own > subj { // own covers the subject's processes too
		m.harnessCPU = time.Duration(own-subj) * time.Second / clkTck
	}
	total := cpu1.all() - m.cpu0.all()
	if total == 0 || cpu1.ncpu == 0 {
		return
	}
	m.windowTicks = total
	m.otherPct, m.stealPct, m.busyPct = cpuShares(m.wall, m.cpu0, cpu1, own)
}

// cpuShares splits a window's CPU capacity (wall × CPUs): the busy share,
// the share of it no harness process took (own is their utime+stime in
// ticks), and steal, all in % of capacity. Busy time is capacity minus
// idle: a tickless kernel accounts idle time exactly, while user/system
// in /proc/stat are sampled at ticks and drift from the processes' exact
// utime+stime by several percent (more than the 5 % rerun threshold) in
// either direction. other is signed: a small negative value is the
// accounting's own error, shown rather than hidden.
func cpuShares(wall time.Duration, c0, c1 cpuTotals, own uint64) (other, steal, busy float64) {
	capacity := wall.Seconds() * clkTck * float64(c1.ncpu)
	if capacity <= 0 {
		return 0, 0, 0
	}
	idle := float64(c1.idle - c0.idle + c1.iowait - c0.iowait)
	st := float64(c1.steal - c0.steal)
	b := capacity - idle - st
	return 100 * (b - float64(own)) / capacity, 100 * st / capacity, 100 * b / capacity
}
