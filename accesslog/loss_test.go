package accesslog

import (
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// testCheckEvery is how often the watchers of the tests' loggers look
// (newLogger): a tenth of lossCheckEvery, so that a test waiting for a
// look, or for two, takes a tenth of the time.
const testCheckEvery = lossCheckEvery / 10

// lockedBuffer is the process log the watcher writes and the test reads.
type lockedBuffer struct{ testenv.LogBuffer }

// records returns the process log's lines whose msg contains msg.
func (b *lockedBuffer) records(t *testing.T, msg string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, ln := range strings.Split(strings.TrimSpace(b.String()), "\n") {
		if ln == "" {
			continue
		}
		var r map[string]any
		if err := json.Unmarshal([]byte(ln), &r); err != nil {
			t.Fatalf("process log line %q: %v", ln, err)
		}
		if m, _ := r["msg"].(string); strings.Contains(m, msg) {
			out = append(out, r)
		}
	}
	return out
}

// switchWriter fails every Write while fail is set, as a full disk does.
type switchWriter struct {
	fail atomic.Bool
	mu   sync.Mutex
	buf  bytes.Buffer
}

func (w *switchWriter) Write(p []byte) (int, error) {
	if w.fail.Load() {
		return 0, syscall.ENOSPC
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.Write(p)
}

// Lost lines reach the process log, not only a counter: an operator whose
// disk filled up, or whose log shipper stopped reading, learns that
// requests go unrecorded. One line when the loss begins (not one per lost
// line or per check while it lasts) and one when lines are written again,
// with how many were lost.
func TestLossIsLoggedOnceAndItsEnd(t *testing.T) {
	tests := []struct {
		name string
		msg  string // of the line saying lines are lost
		// start makes the sink lose lines and returns a function that
		// loses one more, and one that ends the loss.
		start func(t *testing.T, cfg *Config) (loseOne func(*Logger), end func())
	}{
		{
			name: "write fails",
			msg:  "access log cannot be written",
			start: func(t *testing.T, cfg *Config) (func(*Logger), func()) {
				w := &switchWriter{}
				w.fail.Store(true)
				cfg.Output = w
				return func(l *Logger) {
					n := l.Dropped()
					l.Log(&Entry{Time: testTime})
					testenv.WaitFor(t, 5*time.Second, "the failed write counted", func() bool { return l.Dropped() > n })
				}, func() { w.fail.Store(false) }
			},
		},
		{
			name: "sink stalled",
			msg:  "access log sink is not keeping up",
			start: func(t *testing.T, cfg *Config) (func(*Logger), func()) {
				w := &stallWriter{entered: make(chan struct{}), release: make(chan struct{})}
				cfg.Output, cfg.BufferLines = w, 1
				stuck := false
				return func(l *Logger) {
						if !stuck { // the writer holds one line, the queue another
							stuck = true
							l.Log(&Entry{Time: testTime})
							<-w.entered
							l.Log(&Entry{Time: testTime})
						}
						n := l.Dropped()
						l.Log(&Entry{Time: testTime})
						if l.Dropped() != n+1 {
							t.Fatalf("a line to a full queue was not dropped")
						}
					}, func() {
						select {
						case <-w.release:
							return // ended already
						default:
						}
						close(w.release)
						// Written: the line the writer held and the queued one.
						testenv.WaitFor(t, 5*time.Second, "the stalled lines written", func() bool {
							w.mu.Lock()
							defer w.mu.Unlock()
							return bytes.Count(w.buf.Bytes(), []byte("\n")) == 2
						})
					}
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var plog lockedBuffer
			cfg := Config{Format: FormatJSON, Log: slog.New(slog.NewJSONHandler(&plog, nil))}
			loseOne, end := tt.start(t, &cfg)
			l, err := newLogger(cfg, nil, testCheckEvery)
			if err != nil {
				t.Fatal(err)
			}
			// Cleanups run last first: a failing test ends the loss, so
			// that Close does not wait for a stalled writer forever.
			t.Cleanup(func() { l.Close() })
			t.Cleanup(end)

			loseOne(l)
			testenv.WaitFor(t, 5*time.Second, "the loss in the process log", func() bool {
				return len(plog.records(t, tt.msg)) > 0
			})
			// Lost after the watcher reported the first: counted in the
			// end's line, not logged again.
			loseOne(l)
			end()
			l.Log(&Entry{Time: testTime})
			testenv.WaitFor(t, 5*time.Second, "the loss's end in the process log", func() bool {
				return len(plog.records(t, "access log written again")) > 0
			})
			if got := plog.records(t, tt.msg); len(got) != 1 {
				t.Errorf("loss logged %d times, want once: %v", len(got), got)
			} else if got[0]["level"] != "ERROR" || got[0]["dropped"] != float64(1) {
				t.Errorf("loss line %v, want level ERROR and dropped 1", got[0])
			}
			if got := plog.records(t, "access log written again"); len(got) != 1 || got[0]["dropped"] != float64(2) {
				t.Errorf("end of the loss logged as %v, want once with dropped 2", got)
			}
		})
	}
}

// The loss watcher is gone when Close returns: Close is the end of the
// logger, after which nothing of it runs (a line in the process log after
// "stopped", or a goroutine an embedding program's leak check finds).
// Before, the watcher noticed Close on its own time, after Close returned.
func TestLossWatcherEndsWithClose(t *testing.T) {
	for i := range 20 {
		l, err := New(Config{Format: FormatJSON, Output: io.Discard, Log: slog.New(slog.DiscardHandler)}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 1<<20)
		if stacks := buf[:runtime.Stack(buf, true)]; bytes.Contains(stacks, []byte("accesslog.(*Logger).watchLoss")) {
			t.Fatalf("logger %d: the loss watcher still runs after Close returned:\n%s", i, stacks)
		}
	}
}

// A log file deleted without a reopen (an rm to free space, a logrotate
// without a postrotate signal whose rotations ran out) took every later
// line into an inode nobody can open: written "successfully", so neither
// counted nor said, until the next SIGHUP. They are counted as dropped
// and said as a loss, whose end a reopen brings.
func TestDeletedFileIsALoss(t *testing.T) {
	path := filepath.Join(t.TempDir(), "access.log")
	l, plog := cubeLogTo(t, path)
	l.Log(&Entry{Time: testTime, RequestID: "before"})
	testenv.WaitFor(t, 5*time.Second, "the first line written", func() bool {
		b, _ := os.ReadFile(path)
		return bytes.Contains(b, []byte("before"))
	})
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 5*time.Second, "lines to the deleted file counted as dropped", func() bool {
		l.Log(&Entry{Time: testTime, RequestID: "lost"})
		return l.Dropped() > 0
	})
	testenv.WaitFor(t, 5*time.Second, "the loss in the process log", func() bool {
		return len(plog.records(t, "access log file was deleted")) > 0
	})
	if err := l.Reopen(); err != nil {
		t.Fatal(err)
	}
	lost := l.Dropped()
	l.Log(&Entry{Time: testTime, RequestID: "after"})
	testenv.WaitFor(t, 5*time.Second, "the loss's end in the process log", func() bool {
		return len(plog.records(t, "access log written again")) > 0
	})
	if l.Dropped() != lost {
		t.Errorf("dropped %d after the reopen, want still %d: lines to the new file are not lost", l.Dropped(), lost)
	}
	if got := readLines(t, path); len(got) != 1 || !strings.Contains(got[0], "after") {
		t.Errorf("reopened file holds %q, want the one line logged after the reopen", got)
	}
	if got := plog.records(t, "access log file was deleted"); len(got) != 1 || got[0]["level"] != "ERROR" {
		t.Errorf("loss logged as %v, want once at ERROR", got)
	}
}

// A log file moved (logrotate's rename with no postrotate signal) or
// replaced keeps the lines, in the old file, but where no reader of the
// path looks, and where logrotate deletes them rotations later: said once
// (not counted as lost), and not said for the moment between logrotate's
// rename and its signal's reopen.
func TestMovedFileIsSaid(t *testing.T) {
	tests := []struct {
		name   string
		reopen bool // at once after the rename
		said   int
	}{
		{name: "never reopened", said: 1},
		{name: "reopened at once", reopen: true, said: 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "access.log")
			// Between the rename and the reopen the file is moved, and two
			// looks there say so: at testCheckEvery a stall of 50 ms (the
			// test's goroutine, or the writer's that serves Reopen, on
			// loaded cores) was enough. At lossCheckEvery it takes one of
			// 0.5 s, as a process's own looks take logrotate's signal.
			every := testCheckEvery
			if tt.reopen {
				every = lossCheckEvery
			}
			l, plog := cubeLogEvery(t, path, every)
			if err := os.Rename(path, path+".1"); err != nil {
				t.Fatal(err)
			}
			if tt.reopen {
				if err := l.Reopen(); err != nil { // logrotate's postrotate signal
					t.Fatal(err)
				}
				// Nothing to wait for but time: the watcher has looked
				// movedChecks+1 times by then, and found the file in place.
				time.Sleep((movedChecks + 1) * every)
			} else {
				testenv.WaitFor(t, 5*time.Second, "the move in the process log", func() bool {
					return len(plog.records(t, "access log file was moved or replaced")) > 0
				})
			}
			l.Log(&Entry{Time: testTime, RequestID: "kept"})
			if err := l.Close(); err != nil {
				t.Fatal(err)
			}
			if got := plog.records(t, "access log file was moved or replaced"); len(got) != tt.said {
				t.Errorf("move said %d times, want %d: %v", len(got), tt.said, got)
			}
			if l.Dropped() != 0 {
				t.Errorf("dropped %d, want 0: the lines are in a file", l.Dropped())
			}
		})
	}
}

// cubeLogTo opens a cube-format logger writing to path, whose process-log
// lines go to the buffer it returns; t's cleanup closes it.
func cubeLogTo(t *testing.T, path string) (*Logger, *lockedBuffer) {
	t.Helper()
	return cubeLogEvery(t, path, testCheckEvery)
}

// cubeLogEvery is cubeLogTo with the watchers looking every checkEvery.
func cubeLogEvery(t *testing.T, path string, checkEvery time.Duration) (*Logger, *lockedBuffer) {
	t.Helper()
	plog := new(lockedBuffer)
	l, err := newLogger(Config{Format: FormatCube, Path: path, Log: slog.New(slog.NewJSONHandler(plog, nil))}, nil, checkEvery)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l, plog
}
