package main

import (
	"bytes"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
)

// clkTck is USER_HZ, the unit of /proc CPU times; Linux fixes it at 100
// for every architecture the harness runs on.
const clkTck = 100

// cpuTotals are the aggregate "cpu" line of /proc/stat, in ticks, and the
// number of CPUs ("cpuN" lines; not runtime.NumCPU, which counts only the
// CPUs this process is pinned to).
type cpuTotals struct {
	user, nice, system, idle, iowait, irq, softirq, steal uint64
	ncpu                                                  int
}

func (c cpuTotals) all() uint64 {
	return c.user + c.nice + c.system + c.idle + c.iowait + c.irq + c.softirq + c.steal
}

func readCPUTotals() (cpuTotals, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return cpuTotals{}, fmt.Errorf("read /proc/stat: %w", err)
	}
	line, _, _ := bytes.Cut(b, []byte("\n"))
	f := strings.Fields(string(line))
	if len(f) < 9 || f[0] != "cpu" {
		return cpuTotals{}, fmt.Errorf("parse /proc/stat: unexpected first line %q", line)
	}
	var v [8]uint64
	for i := range v {
		if v[i], err = strconv.ParseUint(f[i+1], 10, 64); err != nil {
			return cpuTotals{}, fmt.Errorf("parse /proc/stat field %d: %w", i+1, err)
		}
	}
	ncpu := 0
	for _, l := range bytes.Split(b, []byte("\n")) {
		if len(l) > 3 && bytes.HasPrefix(l, []byte("cpu")) && l[3] >= '0' && l[3] <= '9' {
			ncpu++
		}
	}
	return cpuTotals{v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7], ncpu}, nil
}

// procTicks returns utime+stime of one process (all its threads), in ticks.
func procTicks(pid int) (uint64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, fmt.Errorf("read stat of pid %d: %w", pid, err)
	}
	// The command name may contain spaces; fields resume after the last ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, fmt.Errorf("parse stat of pid %d: no ')'", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	// f[0] is field 3 (state); utime and stime are fields 14 and 15.
	if len(f) < 13 {
		return 0, fmt.Errorf("parse stat of pid %d: %d fields", pid, len(f))
	}
	u, err1 := strconv.ParseUint(f[11], 10, 64)
	s, err2 := strconv.ParseUint(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("parse utime/stime of pid %d: %v %v", pid, err1, err2)
	}
	return u + s, nil
}

// procTree returns pid and all its living descendants, found through
// /proc/<pid>/task/<tid>/children.
func procTree(pid int) []int {
	out := []int{pid}
	for i := 0; i < len(out) && i < 4096; i++ {
		tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", out[i]))
		if err != nil {
			continue
		}
		for _, t := range tasks {
			b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/children", out[i], t.Name()))
			if err != nil {
				continue
			}
			for _, s := range strings.Fields(string(b)) {
				if c, err := strconv.Atoi(s); err == nil {
					out = append(out, c)
				}
			}
		}
	}
	return out
}

// ticksByPID is utime+stime per process, in ticks: one reading of the
// process trees a meter watches.
type ticksByPID map[int]uint64

// treePIDs returns the processes of the trees rooted at roots, each once.
// It reads a /proc file per thread of every process: milliseconds for a
// subject with many threads on a busy core.
func treePIDs(roots []int) []int {
	var out []int
	for _, r := range roots {
		for _, p := range procTree(r) {
			if !slices.Contains(out, p) {
				out = append(out, p)
			}
		}
	}
	return out
}

// readTicks reads utime+stime of pids, one /proc/<pid>/stat each.
// Processes that exited meanwhile are left out.
func readTicks(pids []int) ticksByPID {
	t := ticksByPID{}
	for _, p := range pids {
		if v, err := procTicks(p); err == nil {
			t[p] = v
		}
	}
	return t
}

// addStarted adds to t the processes of now that are not in known: they
// started after known was found.
func (t ticksByPID) addStarted(now, known []int) {
	for _, p := range now {
		if slices.Contains(known, p) {
			continue
		}
		if v, err := procTicks(p); err == nil {
			t[p] = v
		}
	}
}

// since returns the CPU time the processes of t took after base, process
// by process: a process absent from base started meanwhile and counts
// whole. gone lists the processes of base absent from t: they exited and
// took the CPU time they spent since base with them (an exited child's
// time moves to its parent's cutime, which is not counted). Subtracting
// the sums instead wrapped around below zero when a process exited.
func (t ticksByPID) since(base ticksByPID) (ticks uint64, gone []int) {
	for p, v := range t {
		if b, ok := base[p]; ok && b <= v {
			ticks += v - b
		} else {
			ticks += v // new, or its pid was reused
		}
	}
	for p := range base {
		if _, ok := t[p]; !ok {
			gone = append(gone, p)
		}
	}
	slices.Sort(gone)
	return ticks, gone
}

// treeRSSKiB sums VmRSS over the process trees rooted at roots.
func treeRSSKiB(roots []int) (int64, error) {
	var sum int64
	for _, r := range roots {
		for _, p := range procTree(r) {
			kib, err := vmRSSKiB(p)
			if err != nil {
				return 0, err
			}
			sum += kib
		}
	}
	return sum, nil
}

func vmRSSKiB(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, fmt.Errorf("read status of pid %d: %w", pid, err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			f := strings.Fields(v)
			if len(f) == 0 {
				break
			}
			return strconv.ParseInt(f[0], 10, 64)
		}
	}
	return 0, fmt.Errorf("no VmRSS in status of pid %d", pid)
}
