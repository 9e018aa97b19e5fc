package proxy

import (
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// clientConn is a client's TCP connection as the proxy accepts it, made
// once per connection. Its writes renew client.write_timeout on progress
// (sendWatch, Unix only), and, on a traffic (or redirect) listener's plain
// connection, its Close lingers when the client sent bytes nobody will
// read (closeLingering). Under TLS it is the socket beneath the TLS layer,
// and the tlsConn above it lingers instead. The *net.TCPConn is embedded so that its CloseWrite,
// SetLinger and reads stay the connection's.
type clientConn struct {
	*net.TCPConn
	sendWatch
	hold readHold

	p        *Proxy // nil: no lingering of its own (the socket under a tlsConn)
	lingered atomic.Bool
	// writeFailed says a write failed (client.write_timeout, a broken
	// connection): Close then does not linger.
	writeFailed atomic.Bool
	// wait is its place among the connections waiting for a request
	// (Proxy.waiting).
	wait waitNode
	// tls is the TLS connection above it on the HTTPS listener (nil on a
	// plain one), whose handshake a wait for its certificate moves on
	// (certificateWaitExcluded).
	tls *tlsConn
}

// newClientConn wraps tcp; p is nil under TLS (see clientConn), and a
// writeTimeout that is not positive renews nothing.
func newClientConn(tcp *net.TCPConn, p *Proxy, writeTimeout time.Duration) *clientConn {
	c := &clientConn{TCPConn: tcp, p: p}
	c.watchSends(writeTimeout)
	return c
}

// Close closes the connection, after a lingering close when its client
// sent bytes nobody will read.
func (c *clientConn) Close() error {
	if c.p != nil && c.p.closeLingering(c.TCPConn, &c.lingered, c.writeFailed.Load()) {
		return nil
	}
	return c.TCPConn.Close()
}

// Read reads from the socket; a read the hold ended is empty (readHold).
func (c *clientConn) Read(b []byte) (int, error) {
	if err := c.hold.beforeRead(); err != nil {
		return 0, err
	}
	n, err := c.TCPConn.Read(b)
	if err != nil && n == 0 && c.hold.ranOut(c.TCPConn, err) {
		return 0, nil
	}
	return n, err
}

// SetReadDeadline sets the read deadline, which a hold may bring forward
// (readHold).
func (c *clientConn) SetReadDeadline(t time.Time) error {
	return c.hold.setReadDeadline(c.TCPConn, t)
}

// holdReads starts or ends a hold on the connection's reads (readHold).
func (c *clientConn) holdReads(until time.Time, l holdLender) { c.hold.holdReads(c.TCPConn, until, l) }

// setReadHook sets (or with nil, removes) the hook run before each read.
func (c *clientConn) setReadHook(f readHook) { c.hold.hook = f }

// ReadFrom copies r to the connection through its Write. The embedded
// *net.TCPConn's (splice, sendfile, or a plain copy to the socket) would
// write around the write lock and the renewal of the write deadline
// (sendWatch): an io.Copy to a slow but steady client was cut at the
// first deadline. No path of the proxy copies this way today.
func (c *clientConn) ReadFrom(r io.Reader) (int64, error) {
	return io.Copy(writerOnly{c}, r)
}

// writerOnly hides its writer's ReadFrom from io.Copy.
type writerOnly struct{ io.Writer }

// adopt readies a traffic listener's connection just accepted: a
// *net.TCPConn becomes a clientConn, and a *tlsConn, whose socket already
// is one and which lingers itself, is told the proxy.
func (p *Proxy) adopt(c net.Conn) net.Conn {
	switch c := c.(type) {
	case *net.TCPConn:
		return newClientConn(c, p, p.clientWriteTimeout)
	case *tlsConn:
		c.p = p
	}
	return c
}

// ownsClose marks c, a client connection the proxy takes from fasthttp (a
// hijack), as one whose Close never lingers by itself: the code that owns
// it lingers where it must (lingerClose, tunnel.linger), and a Close that
// left the socket open would not end that code's pending reads.
func ownsClose(c net.Conn) {
	switch c := c.(type) {
	case *clientConn:
		c.lingered.Store(true)
	case *tlsConn:
		c.lingered.Store(true)
	}
}

// readHolder is a client connection whose reads an upload's copy can hold
// (readHold): the traffic listeners' clientConn and tlsConn.
type readHolder interface {
	holdReads(until time.Time, l holdLender)
	setReadHook(f readHook)
}

// readHook is run before each read of a client connection while a chunked
// upload is copied (uploadWriter.beforeRead): the pieces of the body the
// copy holds go to the sandbox before a read that may wait for the client.
// An error it returns is the read's, which then reads nothing.
type readHook interface {
	beforeRead() error
}

// holdLender is the copy a hold is for: told when the hold runs out in a
// read that fasthttp's reader takes up again, it can give back a buffer
// that read does not use (clientBody.heldOut).
type holdLender interface {
	heldOut()
}

// readHold lets a streamed upload's copy give its 64 KiB buffer back while
// the client is silent (clientBody, copyGrowing). The body is read through
// fasthttp's reader, which must see no error it did not cause: one marks
// the request's body as failed (the connection is then closed after the
// answer, however the body ends), and one in the middle of a chunk's
// framing loses the bytes of it read so far. So the hold is the
// connection's: while it is on, the read deadline armed is the hold's end
// when that comes first, and a read it times out ends empty (0, nil) with
// the deadline set (the body's) armed again. An empty read reaches the
// copy only from a read that went straight to the connection (the big
// buffer is larger than fasthttp's reader, which is empty then); one
// fasthttp's reader makes to fill itself (a chunk's size line) is tried
// again, now under the body's deadline; the hold's lender is told first,
// and a copy that reads no data into its big buffer in that read (one
// waiting for a chunk's size line, clientBody.nextChunk) gives it back
// there. Deadlines set from other goroutines (the drain's cut, an early
// answer's) go through setReadDeadline and are never taken for the hold's.
type readHold struct {
	mu     sync.Mutex
	set    time.Time  // the read deadline last set (zero: none)
	until  time.Time  // the hold's end (zero: no hold)
	lender holdLender // whom the hold is for (nil: no hold)
	// hook is run before each read (readHook); set and used on the
	// reading goroutine only, so mu does not guard it.
	hook readHook
}

// beforeRead runs the hook, if one is set.
func (h *readHold) beforeRead() error {
	if h.hook == nil {
		return nil
	}
	return h.hook.beforeRead()
}

// armed is the read deadline in force; h.mu must be held.
func (h *readHold) armed() time.Time {
	if !h.until.IsZero() && (h.set.IsZero() || h.until.Before(h.set)) {
		return h.until
	}
	return h.set
}

// setReadDeadline sets c's read deadline to t, or to the hold's end if
// that comes first.
func (h *readHold) setReadDeadline(c net.Conn, t time.Time) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.set = t
	return c.SetReadDeadline(h.armed())
}

// holdReads starts the hold for l, to end at until, or ends it (zero).
func (h *readHold) holdReads(c net.Conn, until time.Time, l holdLender) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.until, h.lender = until, l
	if until.IsZero() {
		h.lender = nil
	}
	_ = c.SetReadDeadline(h.armed())
}

// ranOut reports whether err, a failed read of c, is the hold's end rather
// than the deadline set's: the hold is then over, the deadline set is
// armed again, and the hold's lender is told. Any failure ends the hold.
// It runs on the reading goroutine, the lender's.
func (h *readHold) ranOut(c net.Conn, err error) bool {
	h.mu.Lock()
	if h.until.IsZero() {
		h.mu.Unlock()
		return false
	}
	l := h.lender
	h.until, h.lender = time.Time{}, nil
	_ = c.SetReadDeadline(h.set)
	out := isTimeout(err) && (h.set.IsZero() || time.Now().Before(h.set))
	h.mu.Unlock()
	if out && l != nil {
		l.heldOut()
	}
	return out
}
