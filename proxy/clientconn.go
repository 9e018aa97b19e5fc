package proxy

import (
	"io"
	"net"
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

	p        *Proxy // nil: no lingering of its own (the socket under a tlsConn)
	lingered atomic.Bool
	// writeFailed says a write failed (client.write_timeout, a broken
	// connection): Close then does not linger.
	writeFailed atomic.Bool
	// wait is its place among the connections waiting for a request
	// (Proxy.waiting).
	wait waitNode
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
