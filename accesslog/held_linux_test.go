package accesslog

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
	"golang.org/x/sys/unix"
)

// stalledOutput returns a logger whose Config.Output is w, filled so that
// the next write waits for its peer, which reads nothing until the test
// reads it.
func stalledOutput(t *testing.T, w *os.File) (*Logger, *lockedBuffer) {
	t.Helper()
	raw, err := w.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	testenv.Fill(t, raw)
	return outputLog(t, w)
}

// outputLog returns a logger whose Config.Output is w.
func outputLog(t *testing.T, w *os.File) (*Logger, *lockedBuffer) {
	t.Helper()
	plog := new(lockedBuffer)
	l, err := newLogger(Config{Format: FormatCube, Output: w, Log: slog.New(slog.NewJSONHandler(plog, nil))}, nil, testCheckEvery)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l, plog
}

// pty opens a pseudo-terminal and returns its terminal end (what a shell's
// stdout is) and its master end, which nothing reads until the test does.
func pty(t *testing.T) (tty, master *os.File) {
	t.Helper()
	m, err := os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Skipf("no pseudo-terminal: %v", err)
	}
	t.Cleanup(func() { m.Close() })
	var n int
	err = withFd(m, func(fd int) error {
		if err := unix.IoctlSetPointerInt(fd, unix.TIOCSPTLCK, 0); err != nil {
			return err
		}
		n, err = unix.IoctlGetInt(fd, unix.TIOCGPTN)
		return err
	})
	if err != nil {
		t.Skipf("no pseudo-terminal: %v", err)
	}
	tty, err = os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Skipf("no pseudo-terminal: %v", err)
	}
	t.Cleanup(func() { tty.Close() })
	return tty, m
}

// pausedTTY is a terminal whose output is stopped, as by Ctrl-S: every
// write to it waits. Reading it resumes the output and reads what the
// terminal shows.
type pausedTTY struct {
	tty, master *os.File
	resumed     bool
}

// pause stops tty's output (TCOOFF).
func pause(t *testing.T, tty, master *os.File) *pausedTTY {
	t.Helper()
	if err := withFd(tty, func(fd int) error { return unix.IoctlSetInt(fd, unix.TCXONC, unix.TCOOFF) }); err != nil {
		t.Skipf("cannot stop the terminal's output: %v", err)
	}
	return &pausedTTY{tty: tty, master: master}
}

func (p *pausedTTY) Read(b []byte) (int, error) {
	if !p.resumed {
		p.resumed = true
		if err := withFd(p.tty, func(fd int) error { return unix.IoctlSetInt(fd, unix.TCXONC, unix.TCOON) }); err != nil {
			return 0, err
		}
	}
	return p.master.Read(b)
}

// withFd runs fn on f's descriptor without taking it out of the poller.
func withFd(f *os.File, fn func(fd int) error) error {
	raw, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var ferr error
	if err := raw.Control(func(fd uintptr) { ferr = fn(int(fd)) }); err != nil {
		return err
	}
	return ferr
}

// A writer held in a write that Abandon could not cut still gets its
// closing line, which counts the lines queued behind it as dropped, says
// the lines of the held write, and names what holds it by the kind of sink:
// a frozen or hung file system only for a regular file. A stdout pipe or
// socket whose reader stalled (a container log driver, journald; Abandon
// does not close stdout) or a terminal paused with Ctrl-S (TCOOFF) was said as a frozen or hung
// file system (measured, the binary's stdout a pipe whose reader was
// stopped under 20,000 requests and a SIGTERM: that line, for a pipe).
// Before, the closing line also waited for the writer's end, which came
// after the process had exited (ext4 on a loop device frozen under load).
// The FIFO's write is held in write(2), in blocking mode, which a close
// from another thread does not wake; stdout's in the poller, as serve
// writes a pipe or socket of its own.
func TestAbandonSaysHeldWriter(t *testing.T) {
	tests := []struct {
		name string
		// sink makes a logger whose sink takes nothing, and the reader
		// whose reading lets a held write go.
		sink func(t *testing.T) (*Logger, *lockedBuffer, io.Reader)
		want string // what holds the write, in the closing line
	}{
		{
			name: "FIFO path",
			sink: func(t *testing.T) (*Logger, *lockedBuffer, io.Reader) {
				fifo, rd := testenv.StalledFIFO(t, t.TempDir(), "access.fifo")
				l, plog := cubeLogTo(t, fifo)
				return l, plog, rd
			},
			want: "a pipe whose reader stopped reading",
		},
		{
			name: "stdout pipe",
			sink: func(t *testing.T) (*Logger, *lockedBuffer, io.Reader) {
				r, w, err := os.Pipe()
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { r.Close(); w.Close() })
				l, plog := stalledOutput(t, w)
				return l, plog, r
			},
			want: "a pipe whose reader stopped reading",
		},
		{
			name: "stdout socket",
			sink: func(t *testing.T) (*Logger, *lockedBuffer, io.Reader) {
				fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_NONBLOCK|syscall.SOCK_CLOEXEC, 0)
				if err != nil {
					t.Fatal(err)
				}
				w, r := os.NewFile(uintptr(fds[0]), "stdout"), os.NewFile(uintptr(fds[1]), "journal")
				t.Cleanup(func() { r.Close(); w.Close() })
				l, plog := stalledOutput(t, w)
				return l, plog, r
			},
			want: "a socket whose reader stopped reading",
		},
		{
			name: "stdout terminal",
			sink: func(t *testing.T) (*Logger, *lockedBuffer, io.Reader) {
				tty, master := pty(t)
				// Paused, not filled: the terminal's buffer drains into
				// the master's on its own time, which let a write
				// through after a fill.
				paused := pause(t, tty, master)
				l, plog := outputLog(t, tty)
				return l, plog, paused
			},
			want: "a terminal or device that takes nothing",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l, plog, rd := tt.sink(t)
			release := holdWriter(t, l, rd)
			const queued = 5
			for range queued {
				l.Log(&Entry{Time: testTime})
			}
			closed := abandonHeld(t, l)
			if l.Dropped() != queued {
				t.Errorf("%d lines dropped, want the %d queued", l.Dropped(), queued)
			}
			const msg = "access log closed with its writer held in a write"
			var before float64 // the loss watcher may say some of the drops first
			for _, r := range plog.records(t, "dropping lines") {
				before = r["dropped_total"].(float64)
			}
			got := plog.records(t, msg)
			if len(got) != 1 || got[0]["level"] != "ERROR" || got[0]["held"] != 1.0 || got[0]["dropped"] != queued-before || got[0]["dropped_total"] != float64(queued) {
				t.Fatalf("closing line %v, want one ERROR with held 1, dropped %v and dropped_total %d\nprocess log:\n%s", got, queued-before, queued, plog.String())
			}
			if m, _ := got[0]["msg"].(string); !strings.Contains(m, "("+tt.want) || strings.Contains(m, "file system") {
				t.Errorf("closing line says %q, want it to name %q and no file system", m, tt.want)
			}

			release()
			select {
			case <-closed:
			case <-time.After(5 * time.Second):
				t.Fatal("Close did not return once the write was let go")
			}
			if got := plog.records(t, "access log closed"); len(got) != 1 {
				t.Errorf("closing lines %v, want the one Abandon had said", got)
			}
		})
	}
}
