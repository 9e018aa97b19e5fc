package proxy

import (
	"runtime"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// threadCPU runs f on a thread of its own and returns the CPU time that
// thread spent in it: the cost of f, whatever else the machine runs. Wall
// time was that cost times the machine's load: on a loaded 2-core box
// (the race run beside other packages) 15 ms of work took 160 ms.
func threadCPU(t testing.TB, f func()) time.Duration {
	t.Helper()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	now := func() time.Duration {
		var ts unix.Timespec
		if err := unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts); err != nil {
			t.Fatalf("thread CPU clock: %v", err)
		}
		return time.Duration(ts.Nano())
	}
	start := now()
	f()
	return now() - start
}
