//go:build unix

package proclog

import (
	"errors"
	"io"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// Pollable returns a writer for out that stalls a goroutine, not a thread,
// when out's reader stops reading, and a function that closes it.
//
// A process's stdout is a blocking descriptor: a write to a pipe or socket
// whose reader stalled (a log driver, journald) holds its thread in the
// kernel, and with it the thread's Go processor until the runtime's
// monitor takes it back: 20 µs to 20 ms later, the longer once the monitor
// has backed off. With GOMAXPROCS=1 nothing else runs meanwhile, so every
// request waited on the access log's writer. For a pipe or a socket,
// Pollable returns a duplicate of out's descriptor in non-blocking mode,
// which Go's poller serves: a stalled write parks its goroutine only.
//
// O_NONBLOCK belongs to the open file description, which the duplicate
// shares with out and with whoever else holds it. A terminal's is the
// shell's too; stderr's, under 2>&1 or systemd's StandardError=inherit, is
// where the Go runtime writes a crash's report, blind to EAGAIN, so that a
// report larger than the pipe's free room lost its end, the panic's own
// line; and a regular file does not stall in a way the poller sees. For
// those, for anything but an *os.File, and for a descriptor already
// non-blocking, out comes back unchanged. closeOut closes
// the duplicate, which cuts a write still waiting, and puts out's
// description back in blocking mode. A write that another holder of the
// description (a second process writing the pipe) made blocking waits in
// write(2), where no close cuts it: closeOut waits for it closeWait at
// most, then leaves the duplicate to close when it returns.
func Pollable(out io.Writer) (w io.Writer, closeOut func() error) {
	return pollable(out, unix.Stderr)
}

// pollable is Pollable with stderr's descriptor given (tests).
func pollable(out io.Writer, stderr int) (w io.Writer, closeOut func() error) {
	f, ok := out.(*os.File)
	if !ok {
		return out, noClose
	}
	raw, err := f.SyscallConn()
	if err != nil {
		return out, noClose
	}
	var dup *os.File
	// Control, not Fd: Fd puts a pollable file back in blocking mode.
	cerr := raw.Control(func(fd uintptr) {
		var st unix.Stat_t
		if unix.Fstat(int(fd), &st) != nil {
			return
		}
		if typ := st.Mode & unix.S_IFMT; typ != unix.S_IFIFO && typ != unix.S_IFSOCK {
			return
		}
		// The same pipe or socket as stderr: both ends of a pipe are one
		// inode, and each socket is one of its own.
		var est unix.Stat_t
		if unix.Fstat(stderr, &est) == nil && est.Dev == st.Dev && est.Ino == st.Ino {
			return
		}
		flags, err := unix.FcntlInt(fd, unix.F_GETFL, 0)
		if err != nil || flags&unix.O_NONBLOCK != 0 {
			return
		}
		nfd, err := unix.FcntlInt(fd, unix.F_DUPFD_CLOEXEC, 0)
		if err != nil {
			return
		}
		if err := unix.SetNonblock(nfd, true); err != nil {
			_ = unix.Close(nfd)
			return
		}
		// NewFile sees the non-blocking descriptor and hands it to the poller.
		dup = os.NewFile(uintptr(nfd), f.Name())
	})
	if cerr != nil || dup == nil {
		return out, noClose
	}
	return dup, func() error {
		// Close returns once no write is in flight: at once for one
		// parked in the poller, which it wakes, but only as the reader
		// reads for one in write(2), and the reader may have stalled.
		closed := make(chan error, 1)
		go func() { closed <- dup.Close() }()
		wait := time.NewTimer(closeWait)
		defer wait.Stop()
		var err error
		select {
		case err = <-closed:
		case <-wait.C:
			err = errWriteInKernel
		}
		rerr := raw.Control(func(fd uintptr) {
			if e := unix.SetNonblock(int(fd), false); e != nil && err == nil {
				err = e
			}
		})
		return errors.Join(err, rerr)
	}
}

func noClose() error { return nil }

// closeWait bounds how long closeOut waits for the duplicate to close: a
// parked write is cut in microseconds, so only a write in write(2) takes
// longer, and that one waits for the reader, for as long as it stalls.
// Short, as it adds to an exit that already waited for stdout (the
// process log's 2 s).
const closeWait = 250 * time.Millisecond

// errWriteInKernel is closeOut's error when closeWait passed.
var errWriteInKernel = errors.New("stdout: not waiting for a write blocked in write(2): another holder of the pipe or socket made it blocking")
