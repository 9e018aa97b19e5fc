package proxy

import (
	"errors"
	"net"
	"syscall"

	"golang.org/x/sys/unix"
)

// waitConnPoll is how long one poll of waitConn waits before it looks
// whether the listener was closed meanwhile.
const waitConnPoll = 100 // ms

// waitConn returns once a connection waits on ln (its socket is readable),
// without accepting it, and net.ErrClosed once closed is closed first; at
// once for a listener without a socket of its own. Go's poller cannot
// wait on a listener but through accept (its raw Read refuses one), so
// this blocks a thread in poll, one per listener, and only while the
// process is out of descriptors and no client is connecting.
func waitConn(ln net.Listener, closed <-chan struct{}) error {
	sc, ok := ln.(syscall.Conn)
	if !ok {
		return nil
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return nil
	}
	for {
		ready := false
		err := raw.Control(func(fd uintptr) {
			fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
			n, err := unix.Poll(fds, waitConnPoll)
			// An error other than a signal's is Accept's to report.
			ready = n > 0 || err != nil && !errors.Is(err, unix.EINTR)
		})
		if err != nil {
			return err
		}
		if ready {
			return nil
		}
		select {
		case <-closed:
			return net.ErrClosed
		default:
		}
	}
}
