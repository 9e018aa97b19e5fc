package proxy

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/cube-sandbox/cubeproxy/routing"
	"github.com/cube-sandbox/cubeproxy/telemetry"
)

// tunnel is a spliced upgrade (WebSocket) connection pair. It is a byte
// tunnel: frames, subprotocols and compression stay end to end.
type tunnel struct {
	client, backend net.Conn
	idle            time.Duration
	lastRead        atomic.Int64 // unix nanos of the last byte read either way

	writeTimeout  time.Duration // client.write_timeout, per write to the client
	writeDeadline time.Time     // last set on client; the backend-to-client copy's own

	drainCut atomic.Bool // closed at the drain deadline: logged as such

	// backendGone: the sandbox's side is closed (or a write to it failed);
	// the client's bytes are read and dropped from then on (see linger).
	backendGone atomic.Bool

	mu     sync.Mutex
	closed bool
}

// close ends both directions. Closing a hijacked connection is a no-op in
// fasthttp (it closes it after the handler returns), so a past deadline is
// what unblocks a read pending on the client side.
func (t *tunnel) close() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return
	}
	t.closed = true
	past := time.Unix(1, 0)
	_ = t.client.SetDeadline(past)
	_ = t.backend.SetDeadline(past)
	_ = t.client.Close()
	_ = t.backend.Close()
}

// read reads from c, unless the tunnel was closed. The idle timeout ends
// the tunnel only when neither side has sent anything for that long: a
// terminal's user may type nothing for hours while its output streams.
// Arming the deadline under the lock keeps close from being undone.
func (t *tunnel) read(c net.Conn, b []byte) (int, error) {
	for {
		// The read deadline is armed by start and re-armed only when it
		// passes: setting it per read (a runtime timer change, 144 ns,
		// twice per round trip, plus the lock) was ≈ 2 % of a 64 B echo.
		n, err := c.Read(b)
		if n > 0 {
			t.lastRead.Store(time.Now().UnixNano())
			return n, err
		}
		if t.idle <= 0 || !isTimeout(err) {
			return n, err
		}
		t.mu.Lock()
		if t.closed {
			t.mu.Unlock()
			return 0, net.ErrClosed
		}
		last := t.lastRead.Load()
		if time.Now().UnixNano()-last >= int64(t.idle) {
			t.mu.Unlock()
			return n, err // both sides silent for the idle timeout
		}
		// This side was silent, the other was not: wait until idle has
		// passed since the last byte either way.
		_ = c.SetReadDeadline(time.Unix(0, last).Add(t.idle))
		t.mu.Unlock()
	}
}

// writeClient writes to the client within client.write_timeout, as every
// other response piece is: a client that stops reading would otherwise
// hold the tunnel and its sandbox connection until the idle timeout, since
// the backend side stalls too once this write blocks. The deadline moves
// at most once per slack (a runtime timer change per frame would cost as
// much as the read deadlines did), and under the lock so that it cannot
// undo close's past deadline.
func (t *tunnel) writeClient(b []byte) (int, error) {
	if t.writeTimeout > 0 {
		want := time.Now().Add(t.writeTimeout)
		if t.writeDeadline.IsZero() || want.Sub(t.writeDeadline) >= slack(t.writeTimeout) {
			t.mu.Lock()
			if t.closed {
				t.mu.Unlock()
				return 0, net.ErrClosed
			}
			_ = t.client.SetWriteDeadline(want)
			t.mu.Unlock()
			t.writeDeadline = want
		}
	}
	return t.client.Write(b)
}

// linger ends a tunnel whose sandbox closed its side cleanly, after every
// byte it sent was handed to the client's socket: the sandbox connection
// closes, the exchange ends (end), the client gets a FIN after those
// bytes, and what the client still sends is read and dropped until it
// closes its side (done), at most lingerTime, as nginx's lingering close.
// Closing the client's socket at once would answer the next byte it sends
// (a ping, a keystroke) with a reset, and the kernel would drop what the
// client had not yet received: the sandbox's last output and its close
// frame.
func (t *tunnel) linger(conn net.Conn, done <-chan struct{}, end func()) {
	cw, ok := conn.(interface{ CloseWrite() error })
	if !ok {
		return
	}
	t.backendGone.Store(true)
	_ = t.backend.Close() // its bytes were all read: a clean close
	end()
	if cw.CloseWrite() != nil {
		return
	}
	timer := time.NewTimer(lingerTime)
	defer timer.Stop()
	select {
	case <-done:
	case <-timer.C:
	}
}

// start arms both sides' read deadlines (read re-arms them).
func (t *tunnel) start() {
	t.lastRead.Store(time.Now().UnixNano())
	if t.idle <= 0 {
		return
	}
	d := time.Now().Add(t.idle)
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.closed {
		_ = t.client.SetReadDeadline(d)
		_ = t.backend.SetReadDeadline(d)
	}
}

// tunnel serves an Upgrade request. The upgrade never goes through the
// connection pool (it would put the switched connection back in the
// pool): it dials its own connection, replays the request, and after a 101
// hijacks the client connection and copies bytes both ways until either
// side closes.
func (p *Proxy) tunnel(ctx *fasthttp.RequestCtx, x *exchange, r *routing.Route, t *routing.Target, addr netip.AddrPort, sb *sandboxState) {
	id := t.ID()
	if perr := p.prepareRequest(ctx, r, t, true); perr != nil {
		sb.active.Add(-1)
		x.fail(ctx, *perr, id)
		return
	}
	p.startUpstream(ctx, x)
	// A tunnel's connection is its pool's, counted against
	// upstream.max_conns, though it never goes back to the idle list.
	u := p.pools.get(poolKey{id: r.ID, createdAt: r.CreatedAt, addr: addr}, x.start.UnixNano())
	uc, err := u.dialNew(p)
	if err != nil {
		sb.active.Add(-1)
		p.upstreamError(ctx, x, err, id, addr)
		return
	}

	// An upgrade request has no body (serve sends only bodiless ones
	// here): the head alone.
	ctx.Request.UseHostHeader = true
	if uri := ctx.Request.Header.RequestURI(); len(uri) > 0 && uri[0] != '/' && uri[0] != '*' {
		// An absolute-form target goes on as the path and query alone, as
		// forward sends it: a sandbox's server takes the target's host (and
		// userinfo) over the Host header, which would undo a masked Host.
		u := ctx.Request.URI()
		u.DisablePathNormalizing = true
		ctx.Request.Header.SetRequestURIBytes(u.RequestURI())
	}
	bw := writerPool.Get().(*bufio.Writer)
	bw.Reset(uc)
	if err = ctx.Request.Header.Write(bw); err == nil {
		err = bw.Flush()
	}
	bw.Reset(nil)
	writerPool.Put(bw)
	resp := &ctx.Response
	if err == nil {
		err = uc.readHeader(p, resp)
	}
	if err != nil {
		uc.release(p, false)
		sb.active.Add(-1)
		p.upstreamError(ctx, x, err, id, addr)
		return
	}
	if resp.StatusCode() != fasthttp.StatusSwitchingProtocols {
		// Declined (a 401, a 404, a page): relayed like any answer,
		// streamed if need be, and the connection is not reused.
		resp.Header.SetConnectionClose()
		p.respond(ctx, x, uc, t, addr, sb)
		return
	}
	x.upStatus = fasthttp.StatusSwitchingProtocols
	x.upTime = time.Since(x.start)
	resp.Header.SetNoDefaultContentType(true)
	// Bytes the backend sent right after the 101 go to the client first.
	var pending []byte
	if n := uc.br.Buffered(); n > 0 {
		b, _ := uc.br.Peek(n)
		pending = bytes.Clone(b)
	}
	p.releaseReader(uc.br)
	uc.br = nil
	// From here on both directions run at once, so the tunnel uses the raw
	// connection with its own idle deadlines, not upstreamConn's
	// request/response bookkeeping.
	raw := uc.Conn
	// upstreamConn armed deadlines for the upgrade exchange (the write one
	// from the idle timeout): left in place they would cut a busy tunnel
	// that long after the upgrade. The tunnel arms its own per read.
	_ = raw.SetDeadline(time.Time{})

	// The tunnel outlives the request: it finishes the exchange itself,
	// with a log entry captured now (the request is recycled before then).
	x.kind = telemetry.RouteWebSocket
	x.stream = true
	x.owned = true
	tx := *x
	entry := p.captureEntry(ctx, x, fasthttp.StatusSwitchingProtocols)
	// release frees what the tunnel holds besides the client connection.
	release := func(err error) {
		u.conns.Add(-1)
		sb.done(time.Now().UnixMilli())
		p.finish(nil, &tx, fasthttp.StatusSwitchingProtocols, err, entry)
	}
	abandon := func() {
		_ = raw.Close()
		release(errClientGone)
	}
	// The connection itself, for its CloseWrite (the hijacked one wraps it).
	conn := ctx.Conn()
	// The 101 is written by the hijack handler, not by fasthttp: when the
	// client is gone before it, fasthttp would skip the handler (p.hijack
	// then runs abandon).
	p.hijack(ctx, func(client net.Conn) {
		var in, out countingReader
		tn := &tunnel{client: client, backend: raw, idle: p.cfg.IdleStreamTimeout, writeTimeout: p.clientWriteTimeout}
		tn.start()
		p.streams.addTunnel(tn)
		// end finishes the exchange: when the tunnel closes, or as soon as
		// its sandbox ended it and only the client's side lingers.
		ended := false
		end := func() {
			if ended {
				return
			}
			ended = true
			p.streams.removeTunnel(tn)
			tx.bytesIn, tx.bytesOut = in.n.Load(), out.n.Load()+int64(len(pending))
			if tn.drainCut.Load() {
				tx.errCode = CodeDrainTimeout
			}
			release(nil)
		}
		defer func() {
			tn.close()
			end()
			p.metrics.ConnClosed()
		}()
		// The request is recycled only after this function returns, so its
		// response head (with every header the handler set) is still here.
		// fasthttp cleared the connection's deadlines: a client that reads
		// nothing must not hold this write (and the tunnel) for ever.
		if p.clientWriteTimeout > 0 {
			_ = client.SetWriteDeadline(time.Now().Add(p.clientWriteTimeout))
		}
		if _, err := client.Write(append(ctx.Response.Header.AppendBytes(nil), pending...)); err != nil {
			return
		}
		_ = client.SetWriteDeadline(time.Time{})
		done := make(chan struct{})
		go func() {
			in.r = tunnelReader{tn, client}
			_, _ = io.Copy(backendWriter{tn}, &in)
			tn.close()
			close(done)
		}()
		out.r = tunnelReader{tn, raw}
		if _, err := io.Copy(clientWriter{tn}, &out); err == nil {
			tn.linger(conn, done, end) // the sandbox ended its side
		}
		tn.close()
		<-done
	}, abandon)
}

// countingReader counts the bytes a tunnel direction carried.
type countingReader struct {
	r io.Reader
	n atomic.Int64
}

func (c *countingReader) Read(b []byte) (int, error) {
	n, err := c.r.Read(b)
	c.n.Add(int64(n))
	return n, err
}

// tunnelReader reads one side of a tunnel.
type tunnelReader struct {
	t *tunnel
	c net.Conn
}

func (r tunnelReader) Read(b []byte) (int, error) { return r.t.read(r.c, b) }

// clientWriter writes a tunnel's backend-to-client direction.
type clientWriter struct{ t *tunnel }

func (w clientWriter) Write(b []byte) (int, error) { return w.t.writeClient(b) }

// backendWriter writes a tunnel's client-to-backend direction. Once the
// sandbox's side is gone it drops the client's bytes instead of failing:
// the client's socket is then closed by the other direction (see
// tunnel.linger), not by this one on a write error.
type backendWriter struct{ t *tunnel }

func (w backendWriter) Write(b []byte) (int, error) {
	if !w.t.backendGone.Load() {
		if _, err := w.t.backend.Write(b); err == nil {
			return len(b), nil
		}
		w.t.backendGone.Store(true)
	}
	return len(b), nil
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
