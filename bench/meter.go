package main

import (
	"os"
	"time"
)

// meter measures one sample window: wall time, the subject's CPU time, and
// the CPU time that processes outside the benchmark took meanwhile.
type meter struct {
	subject []int // process trees of the subject under test
	own     []int // other process trees of the harness (backend, redis); self is added

	t0    time.Time
	cpu0  cpuTotals
	own0  uint64
	subj0 uint64

	// Filled by stop.
	wall        time.Duration
	subjectCPU  time.Duration
	otherPct    float64 // busy CPU outside the harness, % of all CPU capacity
	stealPct    float64
	busyPct     float64 // all busy CPU, % of capacity
	windowTicks uint64
}

func newMeter(subject, own []int) *meter {
	return &meter{subject: subject, own: append(append([]int{}, own...), os.Getpid())}
}

func (m *meter) all() []int { return append(append([]int{}, m.subject...), m.own...) }

func (m *meter) start() {
	m.cpu0, _ = readCPUTotals()
	m.own0 = treeTicks(m.all())
	m.subj0 = treeTicks(m.subject)
	m.t0 = time.Now()
}

func (m *meter) stop() {
	m.wall = time.Since(m.t0)
	cpu1, _ := readCPUTotals()
	own1 := treeTicks(m.all())
	subj1 := treeTicks(m.subject)
	m.subjectCPU = time.Duration(subj1-m.subj0) * time.Second / clkTck
	total := cpu1.all() - m.cpu0.all()
	if total == 0 || cpu1.ncpu == 0 {
		return
	}
	m.windowTicks = total
	// Busy time is capacity minus idle: a tickless kernel accounts idle
	// time exactly, while user/system in /proc/stat are sampled at ticks
	// and drift from the processes' exact utime+stime by several percent
	// (more than the 5 % rerun threshold) in either direction.
	capacity := m.wall.Seconds() * clkTck * float64(cpu1.ncpu)
	idle := float64(cpu1.idle - m.cpu0.idle + cpu1.iowait - m.cpu0.iowait)
	steal := float64(cpu1.steal - m.cpu0.steal)
	busy := capacity - idle - steal
	ownD := float64(own1 - m.own0)
	// Signed: a small negative value is the accounting's own error, shown
	// rather than hidden.
	m.otherPct = 100 * (busy - ownD) / capacity
	m.stealPct = 100 * steal / capacity
	m.busyPct = 100 * busy / capacity
}
