package proxy

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"
)

// poolKey names one upstream connection pool. The sandbox id and CreatedAt
// are part of it so a recycled IP:port (a new sandbox behind the same
// address) never reuses a keep-alive connection opened to the old one.
type poolKey struct {
	id        string
	createdAt int64
	addr      netip.AddrPort
}

// upstream is one pool of keep-alive connections to one sandbox port.
type upstream struct {
	hc       *fasthttp.HostClient
	lastUsed atomic.Int64 // unix nanos
}

// pools holds the upstream pools; idle ones are dropped by sweep.
type pools struct {
	cfg *Config
	p   *Proxy

	mu sync.RWMutex
	m  map[poolKey]*upstream
}

func (ps *pools) get(key poolKey, now int64) *upstream {
	ps.mu.RLock()
	u := ps.m[key]
	ps.mu.RUnlock()
	if u == nil {
		u = ps.create(key)
	}
	u.lastUsed.Store(now)
	return u
}

func (ps *pools) create(key poolKey) *upstream {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if u := ps.m[key]; u != nil {
		return u
	}
	addr := key.addr.String()
	u := &upstream{hc: &fasthttp.HostClient{
		Addr:                          addr,
		Dial:                          ps.p.dial,
		MaxConns:                      ps.cfg.MaxConnsPerUpstream,
		MaxIdleConnDuration:           ps.cfg.UpstreamIdleConnTimeout,
		MaxIdemponentCallAttempts:     2,
		RetryIfErr:                    ps.p.retryIfErr,
		StreamResponseBody:            true,
		DisablePathNormalizing:        true,
		NoDefaultUserAgentHeader:      true,
		DisableHeaderNamesNormalizing: false,
		ReadBufferSize:                ps.cfg.UpstreamReadBufferSize,
		WriteBufferSize:               4 << 10, // used only while a request head is written
		// ReadTimeout and WriteTimeout stay 0: they would bound a whole
		// stream. upstreamConn applies header and idle deadlines instead.
	}}
	ps.m[key] = u
	return u
}

// sweep drops pools that have no connections and were unused for idle.
// Their HostClient is then garbage; it holds no goroutine once it has no
// connections.
func (ps *pools) sweep(now time.Time, idle time.Duration) {
	cutoff := now.Add(-idle).UnixNano()
	ps.mu.Lock()
	defer ps.mu.Unlock()
	for k, u := range ps.m {
		if u.lastUsed.Load() < cutoff && u.hc.ConnsCount() == 0 {
			delete(ps.m, k)
		}
	}
}

// stats reports the number of pools, their open connections, and the
// requests waiting for response headers on them.
func (ps *pools) stats() (pools, conns, pending int) {
	ps.mu.RLock()
	defer ps.mu.RUnlock()
	for _, u := range ps.m {
		conns += u.hc.ConnsCount()
		pending += u.hc.PendingRequests()
	}
	return len(ps.m), conns, pending
}

func (ps *pools) closeIdle() {
	ps.mu.RLock()
	defer ps.mu.RUnlock()
	for _, u := range ps.m {
		u.hc.CloseIdleConnections()
	}
}

// retryIfErr re-sends a request only when a pooled keep-alive connection
// turned out to be closed by the backend before it answered, and only for
// idempotent methods (the rule net/http follows). fasthttp never retries a
// streamed request body, and dial failures are retried in dial, so nothing
// that reached a live backend is ever sent twice.
func (p *Proxy) retryIfErr(req *fasthttp.Request, attempts int, err error) (resetTimeout, retry bool) {
	if attempts > 1 {
		return false, false
	}
	var de *dialError
	if errors.As(err, &de) {
		return false, false
	}
	if !errors.Is(err, fasthttp.ErrConnectionClosed) && !errors.Is(err, net.ErrClosed) && !isConnReset(err) {
		return false, false
	}
	switch string(req.Header.Method()) {
	case "GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE":
		p.metrics.UpstreamRetry()
		return false, true
	}
	return false, false
}

// dialError marks a failure to connect, as opposed to a failure on an
// established connection: the client gets 502 upstream_connect_failed.
type dialError struct {
	addr string
	err  error
}

func (e *dialError) Error() string { return fmt.Sprintf("connect %s: %v", e.addr, e.err) }
func (e *dialError) Unwrap() error { return e.err }

// dial connects to a backend with the connect timeout and retries once when
// the connect itself fails.
func (p *Proxy) dial(addr string) (net.Conn, error) {
	d := net.Dialer{Timeout: p.cfg.ConnectTimeout}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		p.metrics.UpstreamRetry()
		c, err = d.Dial("tcp", addr)
	}
	if err != nil {
		p.metrics.UpstreamConnectError()
		return nil, &dialError{addr: addr, err: err}
	}
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetNoDelay(true)
	}
	return newUpstreamConn(c, &p.cfg), nil
}

// errHeartbeatDue is returned by upstreamConn.Read when the heartbeat
// deadline passed with no data. It is recoverable: the connection and the
// HTTP framing are intact (no byte was consumed), the stream simply has not
// spoken for a while.
var errHeartbeatDue = errors.New("heartbeat due")

// upstreamConn wraps a backend connection with the deadlines a streaming
// proxy needs and fasthttp's own timeouts cannot express: a response-header
// timeout measured from the last byte written, an idle timeout between body
// reads (a stream may last hours but not be silent for hours), and an
// optional heartbeat deadline for silent SSE streams.
type upstreamConn struct {
	net.Conn
	headerTimeout time.Duration
	idleTimeout   time.Duration

	// Only one goroutine uses the connection at a time (fasthttp's pool
	// hands it to one request), so these fields need no lock.
	inBody         bool
	headerDeadline time.Time
	heartbeat      time.Time // zero = no heartbeat pending
	readDeadline   time.Time // last deadline set on the socket
	writeDeadline  time.Time

	laddr taggedAddr
}

// taggedAddr is the connection's LocalAddr carrying a pointer back to the
// connection. fasthttp exposes no way to reach the connection behind a
// streamed response, but it records LocalAddr in the response; the stream
// uses it to switch the connection to body deadlines and heartbeats.
type taggedAddr struct {
	net.Addr
	conn *upstreamConn
}

func newUpstreamConn(c net.Conn, cfg *Config) *upstreamConn {
	u := &upstreamConn{Conn: c, headerTimeout: cfg.ResponseHeaderTimeout, idleTimeout: cfg.IdleStreamTimeout}
	u.laddr = taggedAddr{Addr: c.LocalAddr(), conn: u}
	return u
}

func (c *upstreamConn) LocalAddr() net.Addr { return &c.laddr }

// Write starts (or continues) a request: the header deadline counts from
// the last byte sent, so a long upload does not eat into it.
func (c *upstreamConn) Write(b []byte) (int, error) {
	now := time.Now()
	c.inBody = false
	c.heartbeat = time.Time{}
	c.headerDeadline = time.Time{}
	if c.headerTimeout > 0 {
		c.headerDeadline = now.Add(c.headerTimeout)
	}
	if c.idleTimeout > 0 {
		c.writeDeadline = setDeadline(c.Conn, false, c.writeDeadline, now.Add(c.idleTimeout))
	}
	return c.Conn.Write(b)
}

func (c *upstreamConn) Read(b []byte) (int, error) {
	var deadline time.Time
	hb := false
	if !c.inBody {
		deadline = c.headerDeadline
	} else {
		if c.idleTimeout > 0 {
			deadline = time.Now().Add(c.idleTimeout)
		}
		if !c.heartbeat.IsZero() && (deadline.IsZero() || c.heartbeat.Before(deadline)) {
			deadline, hb = c.heartbeat, true
		}
	}
	c.readDeadline = setDeadline(c.Conn, true, c.readDeadline, deadline)
	n, err := c.Conn.Read(b)
	if err != nil && n == 0 && hb && errors.Is(err, os.ErrDeadlineExceeded) {
		c.heartbeat = time.Time{}
		return 0, errHeartbeatDue
	}
	return n, err
}

// setDeadline arms want unless the armed deadline cur is less than a
// second earlier: moving a socket deadline costs a runtime timer update,
// and timeouts of minutes do not need sub-second precision. Earlier (or
// zero) deadlines are always set, so heartbeats stay exact.
func setDeadline(c net.Conn, read bool, cur, want time.Time) time.Time {
	if !cur.IsZero() && !want.IsZero() && !want.Before(cur) && want.Sub(cur) < time.Second {
		return cur
	}
	if read {
		_ = c.SetReadDeadline(want)
	} else {
		_ = c.SetWriteDeadline(want)
	}
	return want
}

// startBody switches the connection from waiting for headers to streaming a body.
func (c *upstreamConn) startBody() { c.inBody = true }

// setHeartbeat arms (or with a zero time, disarms) the heartbeat deadline.
func (c *upstreamConn) setHeartbeat(t time.Time) { c.heartbeat = t }

// connOf returns the upstreamConn behind a response fasthttp read, if any.
func connOf(resp *fasthttp.Response) *upstreamConn {
	if a, ok := resp.LocalAddr().(*taggedAddr); ok {
		return a.conn
	}
	return nil
}

func isConnReset(err error) bool {
	var oe *net.OpError
	return errors.As(err, &oe) && !oe.Timeout()
}
