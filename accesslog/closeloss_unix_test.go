//go:build unix

package accesslog

import (
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// fullFile makes dir/name a file the kernel takes no byte more of, as on a
// full disk: a sparse file at the file size limit (RLIMIT_FSIZE), where
// every write fails with EFBIG, without a mount. It returns the path and
// the function that lifts the limit (space freed); t's cleanup lifts it
// too.
func fullFile(t *testing.T, dir, name string) (string, func()) {
	t.Helper()
	const size = 4096
	path := testenv.SparseFile(t, dir, name, size)
	var old syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_FSIZE, &old); err != nil {
		t.Fatal(err)
	}
	limit := old
	limit.Cur = size
	if err := syscall.Setrlimit(syscall.RLIMIT_FSIZE, &limit); err != nil {
		t.Skipf("cannot limit the file size: %v", err)
	}
	lift := func() {
		if err := syscall.Setrlimit(syscall.RLIMIT_FSIZE, &old); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(lift)
	return path, lift
}

// The lines lost since the loss watcher last said a total are said when
// the log closes, in one line, and only when there are any: a process
// that exits (SIGTERM, the old process of a reuse_port takeover, a drain)
// said nothing of the losses of its last seconds (the 10 s limit kept them
// quiet, or the watcher had not looked yet) nor of the queued lines Close
// could not write, and its counter went with it (measured, the binary on
// a full 1 MiB tmpfs under load: 25,354 lines lost, 2,163 said).
func TestCloseSaysUnsaidLoss(t *testing.T) {
	tests := []struct {
		name string
		// run logs to a logger writing to a file in dir and closes it.
		run func(t *testing.T, dir string) (*Logger, *lockedBuffer)
		// unsaid: lines are surely lost since the last report; said: none
		// are; neither: the watcher may have said them all before the close.
		unsaid, said bool
	}{
		{
			name: "nothing lost",
			run: func(t *testing.T, dir string) (*Logger, *lockedBuffer) {
				l, plog := cubeLogTo(t, filepath.Join(dir, "access.log"))
				l.Log(&Entry{Time: testTime})
				_ = l.Close()
				return l, plog
			},
			said: true,
		},
		{
			name: "full disk, all of it said",
			run: func(t *testing.T, dir string) (*Logger, *lockedBuffer) {
				path, _ := fullFile(t, dir, "access.log")
				l, plog := cubeLogTo(t, path)
				l.Log(&Entry{Time: testTime})
				waitLossSaid(t, plog)
				_ = l.Close()
				return l, plog
			},
			said: true,
		},
		{
			name: "full disk, its end said",
			run: func(t *testing.T, dir string) (*Logger, *lockedBuffer) {
				path, lift := fullFile(t, dir, "access.log")
				l, plog := cubeLogTo(t, path)
				l.Log(&Entry{Time: testTime})
				waitLossSaid(t, plog)
				l.Log(&Entry{Time: testTime})
				testenv.WaitFor(t, 5*time.Second, "the second line counted as dropped", func() bool { return l.Dropped() == 2 })
				lift()
				l.Log(&Entry{Time: testTime})
				testenv.WaitFor(t, 5*time.Second, "the loss's end in the process log", func() bool {
					return len(plog.records(t, "access log written again")) > 0
				})
				_ = l.Close()
				return l, plog
			},
			said: true,
		},
		{
			name: "full disk, lost after the report",
			run: func(t *testing.T, dir string) (*Logger, *lockedBuffer) {
				path, _ := fullFile(t, dir, "access.log")
				l, plog := cubeLogTo(t, path)
				l.Log(&Entry{Time: testTime})
				waitLossSaid(t, plog)
				for range 3 { // within 10 s of the report: not said again
					l.Log(&Entry{Time: testTime})
				}
				testenv.WaitFor(t, 5*time.Second, "the later lines counted as dropped", func() bool { return l.Dropped() == 4 })
				_ = l.Close()
				return l, plog
			},
			unsaid: true,
		},
		{
			name: "full disk, lost just before the close",
			run: func(t *testing.T, dir string) (*Logger, *lockedBuffer) {
				path, _ := fullFile(t, dir, "access.log")
				l, plog := cubeLogTo(t, path)
				for range 3 { // queued or written when Close comes: lost either way
					l.Log(&Entry{Time: testTime})
				}
				_ = l.Close() // its error, the final flush's, is the closing line's err
				return l, plog
			},
		},
		{
			// serve gives a stalled sink the rest of its 5 s at exit and
			// then gives it up (Abandon): the lines still queued are lost.
			name: "FIFO nobody reads, given up at the close",
			run: func(t *testing.T, dir string) (*Logger, *lockedBuffer) {
				fifo, _ := testenv.StalledFIFO(t, dir, "access.fifo")
				l, plog := cubeLogTo(t, fifo)
				for range 50 { // the writer blocks on the first, the others wait in the queue
					l.Log(&Entry{Time: testTime})
				}
				closed := make(chan error, 1)
				go func() { closed <- l.Close() }()
				testenv.WaitFor(t, 5*time.Second, "Close waiting on the stalled writer", func() bool { return l.closed.Load() })
				l.Abandon(5 * time.Second)
				select {
				case <-closed:
				case <-time.After(5 * time.Second):
					t.Fatal("Close did not return once the sink was given up")
				}
				return l, plog
			},
			unsaid: true,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l, plog := tt.run(t, t.TempDir())
			const closing = "access log closed; lines were dropped since the last report"
			var before float64 // the last total said before the close
			for _, r := range plog.records(t, "access log") {
				if m := r["msg"].(string); m != closing && r["dropped_total"] != nil {
					before = r["dropped_total"].(float64)
				}
			}
			got := plog.records(t, closing)
			total := float64(l.Dropped())
			if tt.unsaid && total <= before {
				t.Fatalf("dropped %v, all of it said before the close: the case lost nothing unsaid", total)
			}
			if tt.said || total == before {
				if len(got) != 0 {
					t.Errorf("closing line %v, want none: nothing lost since the last report", got)
				}
				return
			}
			if len(got) != 1 || got[0]["level"] != "ERROR" || got[0]["dropped_total"] != total || got[0]["dropped"] != total-before {
				t.Fatalf("closing line %v, want one at ERROR with dropped %v, dropped_total %v\nprocess log:\n%s",
					got, total-before, total, plog.String())
			}
		})
	}
}

// waitLossSaid waits for the loss watcher to say that lines are lost.
func waitLossSaid(t *testing.T, plog *lockedBuffer) {
	t.Helper()
	testenv.WaitFor(t, 5*time.Second, "the loss in the process log", func() bool {
		return len(plog.records(t, "dropping lines")) > 0
	})
}
