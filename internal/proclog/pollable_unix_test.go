//go:build unix

package proclog

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// blockingFile wraps fd as a process's inherited stdout is: an *os.File on
// a blocking descriptor, which Go does not hand to its poller.
func blockingFile(t *testing.T, fd int, name string) *os.File {
	t.Helper()
	if err := unix.SetNonblock(fd, false); err != nil {
		t.Fatal(err)
	}
	f := os.NewFile(uintptr(fd), name)
	t.Cleanup(func() { f.Close() })
	return f
}

func nonblocking(t *testing.T, f *os.File) bool {
	t.Helper()
	raw, err := f.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var flags int
	raw.Control(func(fd uintptr) { flags, err = unix.FcntlInt(fd, unix.F_GETFL, 0) })
	if err != nil {
		t.Fatal(err)
	}
	return flags&unix.O_NONBLOCK != 0
}

// fill writes to f until its buffer takes no more, so that the next
// write would block. f's description must be non-blocking (Pollable made
// it so, for the duplicate and for f alike).
func fill(t *testing.T, f *os.File) {
	t.Helper()
	raw, err := f.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	testenv.Fill(t, raw)
}

// writeUntil writes b to f from a goroutine and waits until that
// goroutine is in state ("[IO wait": parked in the poller; "[syscall": in
// write(2)); the write's error comes on the channel. One at a time.
func writeUntil(t *testing.T, f *os.File, b []byte, state string) <-chan error {
	t.Helper()
	written := make(chan error, 1)
	go func() {
		_, err := f.Write(b)
		written <- err
	}()
	testenv.WaitFor(t, 5*time.Second, "the write waiting as "+state+"]", func() bool {
		for _, s := range testenv.Stacks() {
			if strings.Contains(s, "proclog.writeUntil.func") && strings.Contains(s, state) {
				return true
			}
		}
		return false
	})
	return written
}

// A stdout on a pipe or a socket, as a container's log driver or journald
// gives it, becomes a duplicate the poller serves: a write to it once its
// reader stalled waits with a goroutine parked (a deadline applies, which
// only a polled descriptor honours), closing it cuts a write still waiting,
// and the description is blocking again afterwards, as it was inherited.
func TestPollableStdoutPipeOrSocket(t *testing.T) {
	for _, tc := range []struct {
		name string
		make func(t *testing.T) *os.File // the writing end, blocking
	}{
		{"pipe", func(t *testing.T) *os.File { _, w := testenv.BlockingPipe(t); return w }},
		{"socket", func(t *testing.T) *os.File {
			// Close-on-exec under ForkLock: macOS has no SOCK_CLOEXEC.
			syscall.ForkLock.RLock()
			fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM, 0)
			if err == nil {
				unix.CloseOnExec(fds[0])
				unix.CloseOnExec(fds[1])
			}
			syscall.ForkLock.RUnlock()
			if err != nil {
				t.Fatal(err)
			}
			blockingFile(t, fds[1], "socket-r")
			return blockingFile(t, fds[0], "socket-w")
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := tc.make(t)
			w, closeOut := Pollable(out)
			pf, ok := w.(*os.File)
			if !ok || pf == out {
				t.Fatalf("Pollable(%s) = %T %v, want a new *os.File", tc.name, w, w)
			}
			if !nonblocking(t, pf) {
				t.Fatal("the duplicate is in blocking mode")
			}
			fill(t, out)
			// A blocking descriptor refuses deadlines (os.ErrNoDeadline) and
			// its write would hang here.
			if err := pf.SetWriteDeadline(time.Now().Add(50 * time.Millisecond)); err != nil {
				t.Fatalf("SetWriteDeadline: %v (the duplicate is not polled)", err)
			}
			if _, err := pf.Write([]byte("line\n")); !errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatalf("write to a stalled %s: %v, want a deadline error", tc.name, err)
			}
			pf.SetWriteDeadline(time.Time{})

			written := writeUntil(t, pf, []byte("stalled line\n"), "[IO wait")
			if err := closeOut(); err != nil {
				t.Fatalf("closeOut: %v", err)
			}
			select {
			case err := <-written:
				if !errors.Is(err, os.ErrClosed) {
					t.Errorf("write cut by closeOut: %v, want os.ErrClosed", err)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("closeOut did not cut the waiting write")
			}
			if nonblocking(t, out) {
				t.Error("the inherited description is still non-blocking after closeOut")
			}
		})
	}
}

// Anything else comes back as it is: a terminal's description is the
// shell's too (non-blocking, it would break the shell after the proxy
// exits), stderr's pipe is where the runtime writes a crash's report
// (non-blocking, a long one lost its end), a regular file never stalls in
// a way the poller sees, and a descriptor already non-blocking is polled
// already.
func TestPollableLeavesOtherOutputsAlone(t *testing.T) {
	regular, err := os.Create(filepath.Join(t.TempDir(), "log"))
	if err != nil {
		t.Fatal(err)
	}
	defer regular.Close()
	devNull, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer devNull.Close()
	_, polled, err := os.Pipe() // os.Pipe's ends are non-blocking, polled
	if err != nil {
		t.Fatal(err)
	}
	defer polled.Close()
	_, shared := testenv.BlockingPipe(t)
	sharedStderr, err := unix.Dup(int(shared.Fd())) // as 2>&1 makes fd 2
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(sharedStderr)
	for _, tc := range []struct {
		name   string
		out    io.Writer
		stderr int
	}{
		{"buffer", &bytes.Buffer{}, unix.Stderr},
		{"regular file", regular, unix.Stderr},
		{"character device", devNull, unix.Stderr},
		{"non-blocking pipe", polled, unix.Stderr},
		{"stderr's pipe", shared, sharedStderr},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w, closeOut := pollable(tc.out, tc.stderr)
			if w != tc.out {
				t.Fatalf("Pollable returned %T %v, want the output itself", w, w)
			}
			if err := closeOut(); err != nil {
				t.Fatalf("closeOut: %v", err)
			}
			if _, err := w.Write([]byte("still open\n")); err != nil {
				t.Fatalf("write after closeOut: %v", err)
			}
		})
	}
}

// Another holder of the description (a second process writing the same
// pipe) can put it back in blocking mode while the proxy runs; a write
// through the duplicate then waits for the reader in write(2), where
// closing the duplicate cannot cut it, and Close waits for it to return.
// closeOut must not wait with it: with the reader stalled, serve's exit
// would hang for as long as the stall lasts (before Pollable it waited
// for stdout 2 s, the process log's budget, then exited).
func TestPollableCloseOutDoesNotWaitForAWriteInTheKernel(t *testing.T) {
	r, out := testenv.BlockingPipe(t)
	w, closeOut := Pollable(out)
	pf, ok := w.(*os.File)
	if !ok || pf == out {
		t.Fatalf("Pollable = %T %v, want a new *os.File", w, w)
	}
	fill(t, out)
	raw, err := out.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	raw.Control(func(fd uintptr) { err = unix.SetNonblock(int(fd), false) })
	if err != nil {
		t.Fatal(err)
	}
	written := writeUntil(t, pf, make([]byte, 128<<10), "[syscall")
	// The reader resumes once the test ends, whatever it found, so that
	// the write and a Close waiting for it return.
	defer func() {
		go io.Copy(io.Discard, r)
		select {
		case <-written:
		case <-time.After(10 * time.Second):
			t.Error("the write did not return once the reader read")
		}
	}()

	closed := make(chan error, 1)
	start := time.Now()
	go func() { closed <- closeOut() }()
	select {
	case err := <-closed:
		if err == nil {
			t.Error("closeOut returned nil with a write still waiting in the kernel; want an error saying so")
		}
		t.Logf("closeOut returned after %v: %v", time.Since(start).Round(time.Millisecond), err)
	case <-time.After(10 * time.Second):
		t.Fatal("closeOut waits for a write blocked in write(2) on a stalled pipe")
	}
	if nonblocking(t, out) {
		t.Error("the description is non-blocking after closeOut")
	}
}
