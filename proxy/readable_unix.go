//go:build unix

package proxy

import (
	"errors"
	"net"
	"os"
	"syscall"
)

// canWaitReadable: this platform can wait for a socket to become readable
// without reading, so SSE streams can detach (detach.go).
const canWaitReadable = true

// waitReadable blocks until the backend has sent something (or closed),
// under the same deadlines as Read, without reading any of it.
func (c *upstreamConn) waitReadable() error {
	if c.raw == nil {
		if err := c.initRaw(); err != nil {
			return err
		}
	}
	for {
		hb := c.armRead()
		c.peekErr = nil
		err := c.raw.Read(c.peekFn)
		if err == nil {
			err = c.peekErr
		}
		if err == nil || !errors.Is(err, os.ErrDeadlineExceeded) {
			return err
		}
		switch {
		case hb:
			c.heartbeatFired()
			return errHeartbeatDue
		case c.checking:
			// A detached body that is not an event stream (an HTTP/1.0
			// client's) is watched once it lasts, as in Read.
			if err := c.checkClient(); err != nil {
				return err
			}
		default:
			return err
		}
	}
}

// initRaw gets the connection's RawConn and the callbacks handed to it
// (method values: one allocation each per connection, not per use).
func (c *upstreamConn) initRaw() error {
	sc, ok := c.Conn.(syscall.Conn)
	if !ok {
		return errors.New("upstream connection has no file descriptor")
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return err
	}
	c.raw, c.peekFn, c.checkFn, c.answerFn = raw, c.peek, c.checkIdle, c.peekAnswer
	return nil
}

// idleOK reports whether an idle keep-alive connection can carry a new
// request: the backend has neither closed it nor sent anything since its
// last answer. One non-blocking MSG_PEEK; net/http learns the same from a
// background read goroutine per idle connection, which costs far more.
func (c *upstreamConn) idleOK() bool {
	if c.raw == nil && c.initRaw() != nil {
		return true
	}
	c.idleGood = false
	if c.raw.Control(c.checkFn) != nil {
		return false
	}
	return c.idleGood
}

// checkIdle is idleOK's callback: only "nothing to read" (EAGAIN) is good.
func (c *upstreamConn) checkIdle(fd uintptr) {
	c.idleGood = c.peekByte(fd) == syscall.EAGAIN
}

// peek is called by the netpoller with the socket; returning false means
// "nothing yet, park until readable".
func (c *upstreamConn) peek(fd uintptr) bool {
	switch err := c.peekByte(fd); err {
	case nil:
		if c.interrupted.Load() {
			c.peekErr = errInterrupted // wake's end of input, not the sandbox's
		}
		return true // data, or 0 bytes: the backend closed; Read will tell
	case syscall.EAGAIN:
		return false
	default:
		c.peekErr = os.NewSyscallError("recvfrom", err)
		return true
	}
}

// peekByte looks at the socket's next byte without consuming it and
// without blocking: EAGAIN means there is nothing to read yet.
func (c *upstreamConn) peekByte(fd uintptr) error {
	for {
		_, _, err := syscall.Recvfrom(int(fd), c.peekBuf[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		if err != syscall.EINTR {
			return err
		}
	}
}

// answerWaiting tells what the sandbox has sent on c while its request
// body is being sent: a closed or reset c, or the head of a final answer
// with a status of 300 or more, refuses the body; a 2xx head (a sandbox
// that streams its answer while it reads the body) lets it go on; bytes
// that do not tell yet (a status line in pieces, or interim 1xx heads
// before the final one) are answerUntold. One non-blocking MSG_PEEK, of up
// to 64 KiB: interim heads come whole before the final status line, and a
// 103 Early Hints' Link lines alone run to hundreds of bytes (a peek of 256
// never reached the refusal behind one). Called while c's exchange sends a
// body (from the hangups goroutine, or the send's own writeUntold): c.raw
// is set (roundTrip) and nothing reads c meanwhile.
func (c *upstreamConn) answerWaiting() answerSeen {
	bp := copyBufPool.Get().(*[]byte)
	defer copyBufPool.Put(bp)
	c.answerBuf, c.answerN, c.answerStop = *bp, 0, false
	err := c.raw.Control(c.answerFn)
	b, n, stop := c.answerBuf, c.answerN, c.answerStop
	c.answerBuf = nil // back in the pool
	if err != nil || stop {
		return answerRefuses
	}
	return readAnswer(b[:n])
}

// peekAnswer is answerWaiting's callback: it peeks into c.answerBuf and
// leaves the count in c.answerN, or sets c.answerStop on a closed or
// reset socket.
func (c *upstreamConn) peekAnswer(fd uintptr) {
	for {
		m, _, err := syscall.Recvfrom(int(fd), c.answerBuf, syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		switch {
		case err == syscall.EINTR:
			continue
		case err == syscall.EAGAIN:
		case err != nil, m == 0: // reset, or closed
			c.answerStop = true
		default:
			c.answerN = m
		}
		return
	}
}

// clientClosed reports whether the client has closed its end of c (a FIN
// with nothing unread before it, or a reset): one non-blocking MSG_PEEK,
// the check nginx makes on a proxied request's client. A stream about to
// send a heartbeat asks first: writing into a half-closed connection
// succeeds, so the heartbeat alone would not notice a client that left.
// Bytes waiting (a pipelined request, a TLS close_notify) read as open.
func clientClosed(c net.Conn) bool {
	raw := rawConn(c)
	if raw == nil {
		return false
	}
	closed := false
	err := raw.Control(func(fd uintptr) {
		var b [1]byte
		for {
			n, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
			if err != syscall.EINTR {
				closed = err == nil && n == 0 || err != nil && err != syscall.EAGAIN
				return
			}
		}
	})
	return closed || err != nil
}

// clientSentMore reports whether bytes from the client wait unread in c's
// socket (one non-blocking MSG_PEEK): closed so, c would be reset.
func clientSentMore(c net.Conn) bool {
	raw := rawConn(c)
	if raw == nil {
		return false
	}
	more := false
	_ = raw.Control(func(fd uintptr) {
		var b [1]byte
		for {
			n, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
			if err != syscall.EINTR {
				more = err == nil && n > 0
				return
			}
		}
	})
	return more
}

// awaitFirstByte returns once c, a client's connection, has a byte to
// read, which it leaves there (MSG_PEEK), or once its read deadline passes
// or it is closed. nginx keeps a TLS connection reclaimable until the
// first byte of its handshake arrives (tlsConn.Handshake).
func awaitFirstByte(c net.Conn) {
	raw := rawConn(c)
	if raw == nil {
		return
	}
	var b [1]byte
	_ = raw.Read(func(fd uintptr) bool {
		_, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		return err != syscall.EAGAIN
	})
}

// wake ends every wait on c's socket without closing it: after
// shutdown(2) each read returns at once with the end of input (which
// upstreamConn's Read and peek report as errInterrupted once its
// interrupted flag is set) and each write fails, and the owner closes the
// socket as its exchange ends (an interrupted connection is never pooled).
// Close would end them too, but then waits until each goroutine blocked on
// the socket has run and let go of it: the drain closed thousands of
// streams' sockets one wait after another (9,990 SSE streams on the built
// binary: 1.3 s, over HTTPS 2.5 s, with the CPU mostly idle, all under the
// registry lock, so that no stream could end meanwhile). False when the
// socket cannot be shut (closed already, or reset): close it then.
func wake(c net.Conn) bool {
	raw := rawConn(c)
	if raw == nil {
		return false
	}
	var serr error
	if err := raw.Control(func(fd uintptr) { serr = syscall.Shutdown(int(fd), syscall.SHUT_RDWR) }); err != nil {
		return false
	}
	return serr == nil
}

// shut wakes c (wake), or closes it where it cannot be shut; nil: nothing.
func shut(c net.Conn) {
	if c != nil && !wake(c) {
		_ = c.Close()
	}
}

// rawConn is c's socket, under TLS if need be; nil if it has none.
func rawConn(c net.Conn) syscall.RawConn {
	if tc, ok := c.(interface{ NetConn() net.Conn }); ok {
		c = tc.NetConn()
	}
	sc, ok := c.(syscall.Conn)
	if !ok {
		return nil
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return nil
	}
	return raw
}
