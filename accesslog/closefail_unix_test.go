//go:build unix

package accesslog

import (
	"log/slog"
	"os"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// closeUnder closes f's descriptor behind its back, so that its Close
// fails in close(2) (EBADF), as a network or FUSE file system's fails when
// a write-back it took earlier did not reach the storage.
func closeUnder(t *testing.T, f *os.File) {
	t.Helper()
	raw, err := f.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var cerr error
	if err := raw.Control(func(fd uintptr) { cerr = syscall.Close(int(fd)) }); err != nil {
		t.Fatal(err)
	}
	if cerr != nil {
		t.Fatal(cerr)
	}
}

// logWritten logs n lines and waits for the file at path to hold want.
func logWritten(t *testing.T, l *Logger, path string, n, want int) {
	t.Helper()
	for range n {
		l.Log(&Entry{Time: testTime})
	}
	testenv.WaitFor(t, 5*time.Second, "the lines in the file", func() bool {
		b, _ := os.ReadFile(path)
		return len(b) > 0 && len(readLines(t, path)) == want
	})
}

// closeCountedLogTo is cubeLogTo with Config.OnCloseFailure counting into
// the returned counter.
func closeCountedLogTo(t *testing.T, path string) (*Logger, *lockedBuffer, *atomic.Int64) {
	t.Helper()
	plog := new(lockedBuffer)
	failed := new(atomic.Int64)
	cfg := Config{Format: FormatCube, Path: path, Log: slog.New(slog.NewJSONHandler(plog, nil)),
		OnCloseFailure: func() { failed.Add(1) }}
	l, err := newLogger(cfg, nil, testCheckEvery)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l, plog, failed
}

// A close(2) of the log file that fails says that lines written to it may
// be lost: NFS and FUSE report a write-back that failed there, and the
// lines already written go with it (measured, the binary on a FUSE file
// system failing its close at exit: 3,000 requests answered, an empty
// file, nothing in the process log; at a SIGHUP's reopen, an error that
// the reopen failed, though the new file was in use). A file Abandon gave
// up is no such failure. Each failure is counted too (OnCloseFailure, the
// metric's seam): an operator alerting on metrics saw nothing of it.
func TestFailedCloseIsSaid(t *testing.T) {
	const msg = "access log file could not be closed; lines written to it may be lost"
	tests := []struct {
		name string
		// run writes to a logger in dir, has a close fail or not, and
		// closes the logger.
		run   func(t *testing.T, dir string) (*Logger, *lockedBuffer, *atomic.Int64)
		at    string  // the failure said, "" for none
		lines float64 // written to the file whose close failed
	}{
		{
			name: "at Close",
			run: func(t *testing.T, dir string) (*Logger, *lockedBuffer, *atomic.Int64) {
				path := filepath.Join(dir, "access.log")
				l, plog, failed := closeCountedLogTo(t, path)
				logWritten(t, l, path, 3, 3)
				closeUnder(t, l.file)
				if err := l.Close(); err == nil {
					t.Error("Close returned nil, want the close's error")
				}
				return l, plog, failed
			},
			at:    "close",
			lines: 3,
		},
		{
			name: "of the file a reopen replaced",
			run: func(t *testing.T, dir string) (*Logger, *lockedBuffer, *atomic.Int64) {
				path := filepath.Join(dir, "access.log")
				// Holds a descriptor below the logger's, so that the
				// reopen's file takes this one's, not the one closed under
				// the logger.
				below, err := os.Open(os.DevNull)
				if err != nil {
					t.Fatal(err)
				}
				l, plog, failed := closeCountedLogTo(t, path)
				logWritten(t, l, path, 2, 2)
				if err := os.Rename(path, path+".1"); err != nil {
					t.Fatal(err)
				}
				below.Close()
				closeUnder(t, l.file)
				if err := l.Reopen(); err != nil {
					t.Errorf("Reopen = %v, want nil: the new file is in use", err)
				}
				logWritten(t, l, path, 1, 1)
				testenv.WaitFor(t, 5*time.Second, "the failed close in the process log", func() bool {
					return len(plog.records(t, msg)) > 0
				})
				if err := l.Close(); err != nil {
					t.Errorf("Close: %v", err)
				}
				return l, plog, failed
			},
			at:    "reopen",
			lines: 2,
		},
		{
			name: "given up by Abandon",
			run: func(t *testing.T, dir string) (*Logger, *lockedBuffer, *atomic.Int64) {
				fifo, _ := testenv.StalledFIFO(t, dir, "access.fifo")
				l, plog, failed := closeCountedLogTo(t, fifo)
				l.Log(&Entry{Time: testTime})
				closed := make(chan error, 1)
				go func() { closed <- l.Close() }()
				testenv.WaitFor(t, 5*time.Second, "Close waiting on the stalled writer", l.closed.Load)
				l.Abandon(5 * time.Second)
				<-closed
				return l, plog, failed
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l, plog, failed := tt.run(t, t.TempDir())
			got := plog.records(t, msg)
			want := int64(1)
			if tt.at == "" {
				want = 0
			}
			if n := failed.Load(); n != want {
				t.Errorf("OnCloseFailure called %d times, want %d", n, want)
			}
			if tt.at == "" {
				if len(got) != 0 {
					t.Fatalf("said %v, want nothing: no close failed", got)
				}
				return
			}
			if len(got) != 1 || got[0]["level"] != "ERROR" || got[0]["at"] != tt.at || got[0]["lines"] != tt.lines || got[0]["err"] == nil {
				t.Fatalf("said %v, want one ERROR at %q with lines %v and the error\nprocess log:\n%s", got, tt.at, tt.lines, plog.String())
			}
			if l.Dropped() != 0 {
				t.Errorf("dropped %d: which lines a failed close lost is unknown, so none is counted", l.Dropped())
			}
		})
	}
}
