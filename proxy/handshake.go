package proxy

import (
	"crypto/tls"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// handshakeGrace is how long after its accept a connection may still be
// in its TLS handshake once the drain has begun: fasthttp's grace for a
// plain connection that has sent nothing (5 s from its accept, as
// net/http's), after which its shutdown closes that connection.
const handshakeGrace = 5 * time.Second

// tlsListener is tls.NewListener whose connections record their
// handshake while it runs, so that the drain can end the ones that stall.
// fasthttp runs the handshake before it tracks a connection as new or
// idle: its shutdown never closes one that connected and sent no
// ClientHello, or half of one, and such a client held every drain to
// drain_timeout (the plain listener's equivalent is closed after the
// grace).
type tlsListener struct {
	net.Listener
	cfg        *tls.Config
	handshakes *handshakes
	// headTimeout is client.read_timeout: the handshake and the first
	// request head must both arrive within it of the accept.
	headTimeout time.Duration
	// sendTimeout is client.write_timeout, which the socket beneath the
	// TLS layer renews on progress (clientConn).
	sendTimeout time.Duration
}

// SyscallConn is the listening socket's beneath the TLS layer: at the
// descriptor limit the retry listener waits on it for a client (waitConn),
// and without it counted, logged and backed off with nobody connecting.
func (l *tlsListener) SyscallConn() (syscall.RawConn, error) {
	sc, ok := l.Listener.(syscall.Conn)
	if !ok {
		return nil, errors.ErrUnsupported
	}
	return sc.SyscallConn()
}

// Accept wraps the next connection in a server-side TLS connection.
func (l *tlsListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	var cc *clientConn
	if tcp, ok := c.(*net.TCPConn); ok {
		cc = newClientConn(tcp, nil, l.sendTimeout)
		c = cc
	}
	now := time.Now()
	tc := &tlsConn{Conn: tls.Server(c, l.cfg), accepted: now, handshakes: l.handshakes}
	if cc != nil {
		cc.tls = tc
	}
	if l.headTimeout > 0 {
		tc.headBy = now.Add(l.headTimeout)
	}
	return tc, nil
}

// certificateWaitMin is the shortest wait for a certificate that moves a
// handshake's deadlines on (certificateWaitExcluded): one in memory takes
// microseconds, an on-demand order seconds.
const certificateWaitMin = 100 * time.Millisecond

// certificateWaitExcluded returns cfg with the time its GetCertificate
// waits (an on-demand ACME order, run inside the handshake) left out of
// the connection's client.read_timeout and write_timeout: the wait is the
// proxy's, not the client's. Counted, the deadlines set at the accept
// passed while the order ran, and the client that waited for it was
// closed once the certificate was there. Its errors come back marked as
// certificateRefused. cfg is cloned once, at Serve.
func (l *tlsListener) certificateWaitExcluded(cfg *tls.Config) *tls.Config {
	if cfg == nil || cfg.GetCertificate == nil {
		return cfg
	}
	cfg = cfg.Clone()
	get := cfg.GetCertificate
	cfg.GetCertificate = func(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
		start := time.Now()
		cert, err := get(hello)
		if err != nil {
			err = certificateRefused{err}
		}
		if waited := time.Since(start); waited >= certificateWaitMin {
			if cc, ok := hello.Conn.(*clientConn); ok && cc.tls != nil {
				cc.tls.waitedForCertificate(waited, l.sendTimeout)
			}
		}
		return cert, err
	}
	return cfg
}

// certificateRefused is the error of a handshake whose certificate the
// listener's GetCertificate refused (the acme source's: an on-demand order
// failed or over its budget, the route store or the certificate storage
// failing, the wildcard not obtained yet). crypto/tls hands that error on
// as it stands, without the "tls: " of its own, so that connectionError
// took it for a malformed request: each such handshake, which carried no
// request, was logged and counted as a 400 bad_request.
type certificateRefused struct{ err error }

func (e certificateRefused) Error() string { return e.err.Error() }
func (e certificateRefused) Unwrap() error { return e.err }

// tlsConn is a server-side TLS connection whose handshake is registered
// in handshakes while it runs. fasthttp takes it for TLS (it asserts an
// interface with Handshake and ConnectionState, not *tls.Conn) and calls
// Handshake before it reads the first request.
type tlsConn struct {
	*tls.Conn
	accepted   time.Time
	handshakes *handshakes
	// headBy is when the first request's head must have arrived: the
	// accept plus client.read_timeout (zero: no bound), as nginx's
	// client_header_timeout runs from the accept through the handshake
	// and the first head. fasthttp sets the first head's deadline anew
	// after the handshake, which let a client hold the connection twice
	// the timeout without a request.
	headBy time.Time
	// gotData says a request's bytes have arrived, after which deadlines
	// are fasthttp's own (the body's, the keep-alive wait's).
	gotData atomic.Bool
	// p is set once a traffic listener took the connection (Proxy.adopt):
	// its Close lingers, as a clientConn's.
	p        *Proxy
	lingered atomic.Bool
	// writeFailed says a write failed (the client took nothing for
	// client.write_timeout, or the connection broke): Close then sends no
	// close_notify, as nginx sends none after a timeout. crypto/tls sends
	// it under a 5 s deadline of its own, and into a socket the client
	// stopped emptying that held each such close 5 s.
	writeFailed atomic.Bool
	wait        waitNode // its place among the connections waiting for a request (Proxy.waiting)
	// hold is above the TLS layer, whose own reads retry an empty one
	// (readHold); a timed-out read of a record is taken up again.
	hold readHold
}

// Read reads application data, noting the first bytes; a read the hold
// ended is empty (readHold).
func (c *tlsConn) Read(b []byte) (int, error) {
	if err := c.hold.beforeRead(); err != nil {
		return 0, err
	}
	n, err := c.Conn.Read(b)
	if n > 0 && !c.gotData.Load() {
		c.gotData.Store(true)
	}
	if err != nil && n == 0 && c.hold.ranOut(c.Conn, err) {
		return 0, nil
	}
	return n, err
}

// Write writes application data, noting a failure.
func (c *tlsConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	if err != nil {
		c.writeFailed.Store(true)
	}
	return n, err
}

// SetReadDeadline sets the read deadline, not past headBy until the first
// request's bytes have arrived (they are read under that deadline: fasthttp
// leaves the first head's deadline as it set it before its first byte).
func (c *tlsConn) SetReadDeadline(t time.Time) error {
	if !c.headBy.IsZero() && !c.gotData.Load() && (t.IsZero() || t.After(c.headBy)) {
		t = c.headBy
	}
	return c.hold.setReadDeadline(c.Conn, t)
}

// waitedForCertificate moves the handshake's deadlines on by waited, the
// time its certificate took (certificateWaitExcluded): headBy, which the
// first request's head keeps, and the read and write deadlines with it
// (writesByHead), or without headBy the write deadline to sendTimeout from
// now, as fasthttp set it when the handshake began. It runs inside the
// handshake, which the connection's goroutine waits for (handshakeApart)
// before it reads headBy.
func (c *tlsConn) waitedForCertificate(waited, sendTimeout time.Duration) {
	if !c.headBy.IsZero() {
		c.headBy = c.headBy.Add(waited)
		_ = c.NetConn().SetReadDeadline(c.headBy)
		_ = c.NetConn().SetWriteDeadline(c.headBy) // as writesByHead
		return
	}
	if sendTimeout > 0 {
		_ = c.NetConn().SetWriteDeadline(time.Now().Add(sendTimeout))
	}
}

// writesByHead gives the handshake's writes the first head's deadline,
// headBy, as nginx's one client_header_timeout timer bounds the whole
// handshake, its writes too. fasthttp sets client.write_timeout from now
// as the write deadline just before it calls Handshake, when nothing has
// been read yet: a client whose ClientHello came later than that got no
// server flight (an EOF in its handshake), whatever client.read_timeout
// allowed, so a write_timeout lowered to cut slow readers sooner (10 s)
// failed handshakes nginx completes. The handshake's reads end by headBy,
// so its writes hold nothing past it. fasthttp sets client.write_timeout
// again before it writes each answer.
func (c *tlsConn) writesByHead() {
	if !c.headBy.IsZero() {
		_ = c.NetConn().SetWriteDeadline(c.headBy)
	}
}

// holdReads starts or ends a hold on the connection's reads (readHold).
func (c *tlsConn) holdReads(until time.Time, l holdLender) { c.hold.holdReads(c.Conn, until, l) }

// setReadHook sets (or with nil, removes) the hook run before each read.
func (c *tlsConn) setReadHook(f readHook) { c.hold.hook = f }

// SetDeadline sets both deadlines, the read one as SetReadDeadline does.
func (c *tlsConn) SetDeadline(t time.Time) error {
	if err := c.Conn.SetWriteDeadline(t); err != nil {
		return err
	}
	return c.SetReadDeadline(t)
}

// Close closes the connection, after a lingering close when its client
// sent bytes nobody will read (Proxy.closeLingering), and
// without close_notify after a failed write.
func (c *tlsConn) Close() error {
	if c.writeFailed.Load() {
		return c.NetConn().Close()
	}
	if c.p != nil && c.p.closeLingering(c.Conn, &c.lingered, false) {
		return nil
	}
	return c.Conn.Close()
}

// Handshake runs the TLS handshake where the drain can end it. With
// client.max_conns set, the connection is one a new client may take the
// place of (Proxy.waiting) until the handshake's first byte arrives, and
// again once the handshake is done, until its first request's byte, as
// nginx's: a client's handshake is never cut half way to make room.
func (c *tlsConn) Handshake() error {
	c.handshakes.add(c)
	defer c.handshakes.remove(c)
	c.writesByHead()
	if c.p == nil || c.p.waiting == nil {
		return c.handshakeApart()
	}
	awaitFirstByte(c.NetConn())
	c.p.waiting.remove(c)
	err := c.handshakeApart()
	if err == nil {
		c.p.waiting.push(c)
	}
	return err
}

// handshakeApart runs crypto/tls's handshake on a goroutine of its own
// and waits for it. Its frames (the key exchange, the certificate's
// signature) grow a goroutine's stack to 32 KiB, and on the connection's
// own goroutine that stack stayed through the first request: the runtime
// halves a stack only while less than a quarter of it is in use, and a
// request waiting on its sandbox uses more than 8 KiB. An HTTPS connection
// waiting on a slow sandbox held 22 KiB of stack where a plain one holds
// 14 (TestTLSHandshakeStackIsNotTheConnections). The goroutine costs one
// start per connection, next to a handshake's hundreds of microseconds
// of CPU.
func (c *tlsConn) handshakeApart() error {
	done := make(chan error, 1)
	go func() { done <- c.Conn.Handshake() }()
	return <-done
}

// handshakes is the set of TLS handshakes running.
type handshakes struct {
	mu sync.Mutex
	m  map[*tlsConn]struct{}
}

func (h *handshakes) add(c *tlsConn) {
	h.mu.Lock()
	if h.m == nil {
		h.m = make(map[*tlsConn]struct{})
	}
	h.m[c] = struct{}{}
	h.mu.Unlock()
}

func (h *handshakes) remove(c *tlsConn) {
	h.mu.Lock()
	delete(h.m, c)
	h.mu.Unlock()
}

// closeStalled closes the connections still in their handshake that
// were accepted before since. The socket under the TLS layer is closed:
// the handshake's read fails at once, without waiting on the TLS
// connection's locks, which the handshake holds.
func (h *handshakes) closeStalled(since time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for c := range h.m {
		if c.accepted.Before(since) {
			delete(h.m, c)
			_ = c.NetConn().Close()
		}
	}
}

// endHandshakes closes, until stop, each TLS handshake still running
// handshakeGrace after its accept: what fasthttp's shutdown does for the
// connections it tracks, every 100 ms, as it does.
func (h *handshakes) endHandshakes(stop <-chan struct{}) {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		h.closeStalled(time.Now().Add(-handshakeGrace))
		select {
		case <-stop:
			return
		case <-tick.C:
		}
	}
}
