//go:build unix

package proxy

import (
	"errors"
	"os"
	"syscall"
	"time"
)

// canWaitReadable: this platform can wait for a socket to become readable
// without reading, so SSE streams can detach (detach.go).
const canWaitReadable = true

// waitReadable blocks until the backend has sent something (or closed),
// under the same deadlines as Read, without reading any of it.
func (c *upstreamConn) waitReadable() error {
	if c.raw == nil {
		sc, ok := c.Conn.(syscall.Conn)
		if !ok {
			return errors.New("upstream connection has no file descriptor")
		}
		raw, err := sc.SyscallConn()
		if err != nil {
			return err
		}
		c.raw = raw
		c.peekFn = c.peek // one allocation per connection, not per wait
	}
	hb := c.armRead()
	c.peekErr = nil
	err := c.raw.Read(c.peekFn)
	if err == nil {
		err = c.peekErr
	}
	if err != nil && hb && errors.Is(err, os.ErrDeadlineExceeded) {
		c.heartbeat = time.Time{}
		return errHeartbeatDue
	}
	return err
}

// peek is called by the netpoller with the socket; returning false means
// "nothing yet, park until readable".
func (c *upstreamConn) peek(fd uintptr) bool {
	for {
		_, _, err := syscall.Recvfrom(int(fd), c.peekBuf[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		switch err {
		case nil:
			return true // data, or 0 bytes: the backend closed; Read will tell
		case syscall.EINTR:
			continue
		case syscall.EAGAIN:
			return false
		}
		c.peekErr = os.NewSyscallError("recvfrom", err)
		return true
	}
}
