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
	if total == 0 {
		return
	}
	m.windowTicks = total
	busy := cpu1.busy() - m.cpu0.busy()
	ownD := own1 - m.own0
	var other uint64
	if busy > ownD {
		other = busy - ownD
	}
	m.otherPct = 100 * float64(other) / float64(total)
	m.stealPct = 100 * float64(cpu1.steal-m.cpu0.steal) / float64(total)
	m.busyPct = 100 * float64(busy) / float64(total)
}
