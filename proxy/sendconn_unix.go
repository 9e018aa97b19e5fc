//go:build unix

package proxy

import (
	"net"
	"os"
	"sync"
	"syscall"
	"time"
)

// sendWatch makes a clientConn's write deadline move on whenever the
// client takes bytes while a write waits, as nginx's send_timeout is
// renewed by any progress: a client that keeps reading, however slowly, is
// never cut; one that takes nothing for timeout is. With the deadline
// alone, each write (a piece of up to 64 KiB) had to be taken whole within
// client.write_timeout, and a client reading under about 1.1 KB/s at 60 s
// was cut where nginx kept sending.
//
// Writes go through the socket's RawConn, whose callback sees every
// wake-up of a write that waits: a write that does not wait costs what
// net.TCPConn's does. It sits under TLS, so a tls.Conn above it sees a
// timeout only when no byte went out for that long (a timed-out TLS write
// cannot be taken up again). Its owner stops a write by closing the
// connection, not by a deadline in the past: a wake-up with progress would
// move such a deadline on.
type sendWatch struct {
	raw     syscall.RawConn // nil: writes are net.TCPConn's (no renewal)
	writeFn func(fd uintptr) bool
	timeout time.Duration // client.write_timeout

	mu       sync.Mutex
	deadline time.Time // the write deadline in force (zero: none), the owner's or moved on by writeSome

	// wmu serializes writes (net.Conn allows them from several
	// goroutines); it guards the write in progress.
	wmu  sync.Mutex
	buf  []byte
	sent int
	err  error
}

// watchSends starts renewing c's write deadline by timeout on progress;
// a timeout that is not positive renews nothing.
func (c *clientConn) watchSends(timeout time.Duration) {
	if timeout <= 0 {
		return
	}
	raw, err := c.TCPConn.SyscallConn()
	if err != nil {
		return
	}
	c.raw, c.timeout = raw, timeout
	c.writeFn = c.writeSome
}

// Write writes b whole, or fails once the client took nothing for the
// write timeout (or the owner's deadline, if later) or the connection
// broke; errors look like net.TCPConn's. A failure is noted (writeFailed).
func (c *clientConn) Write(b []byte) (int, error) {
	if c.raw == nil {
		n, err := c.TCPConn.Write(b)
		if err != nil {
			c.writeFailed.Store(true)
		}
		return n, err
	}
	if len(b) == 0 {
		return 0, nil
	}
	c.wmu.Lock()
	c.buf, c.sent, c.err = b, 0, nil
	err := c.raw.Write(c.writeFn)
	n, werr := c.sent, c.err
	c.buf = nil
	c.wmu.Unlock()
	if err == nil && werr == nil {
		return n, nil
	}
	c.writeFailed.Store(true)
	if oe, ok := err.(*net.OpError); ok {
		oe.Op = "write" // the RawConn's "raw-write"
		return n, oe
	}
	if err == nil {
		err = os.NewSyscallError("write", werr)
	}
	return n, &net.OpError{Op: "write", Net: "tcp", Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: err}
}

// writeSome is the RawConn's callback: it writes what the socket takes,
// and returns false to wait until it takes more. A wait after progress
// moves the deadline on.
func (c *clientConn) writeSome(fd uintptr) bool {
	start := c.sent
	for c.sent < len(c.buf) {
		n, err := syscall.Write(int(fd), c.buf[c.sent:])
		if n > 0 {
			c.sent += n
		}
		switch err {
		case nil:
		case syscall.EINTR:
		case syscall.EAGAIN:
			if c.sent > start {
				c.progressed()
			}
			return false
		default:
			c.err = err
			return true
		}
	}
	return true
}

// progressed moves a deadline in force to timeout from now, at most once
// per slack (as setDeadline), never earlier than it was, and never once
// it has passed.
func (c *clientConn) progressed() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.deadline.IsZero() {
		return
	}
	now := time.Now()
	want := now.Add(c.timeout)
	if !now.Before(c.deadline) || want.Sub(c.deadline) < slack(c.timeout) {
		return
	}
	c.deadline = want
	_ = c.TCPConn.SetWriteDeadline(want)
}

// SetWriteDeadline sets the deadline that progress then moves on.
func (c *clientConn) SetWriteDeadline(t time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.deadline = t
	return c.TCPConn.SetWriteDeadline(t)
}

// SetDeadline sets both deadlines (see SetWriteDeadline and
// SetReadDeadline).
func (c *clientConn) SetDeadline(t time.Time) error {
	if err := c.SetWriteDeadline(t); err != nil {
		return err
	}
	return c.SetReadDeadline(t)
}

// SyscallConn returns the socket (hang-up watches, readability checks),
// the RawConn made once when writes are watched.
func (c *clientConn) SyscallConn() (syscall.RawConn, error) {
	if c.raw != nil {
		return c.raw, nil
	}
	return c.TCPConn.SyscallConn()
}
