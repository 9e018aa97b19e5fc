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
	"syscall"
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
	// lastRead is the unix nanos of the last byte read either way, or of
	// a write's progress or end: a piece the other end takes slowly
	// (longer than idle) is traffic too, not silence (see read).
	lastRead atomic.Int64

	writeTimeout  time.Duration // client.write_timeout, per write to the client
	writeDeadline time.Time     // last set on client; the backend-to-client copy's own
	// sendDeadline is the write deadline last set on backend (from idle,
	// per write: see writeBackend); the client-to-backend copy's own.
	sendDeadline time.Time

	drainCut atomic.Bool // closed at the drain deadline: logged as such
	// idled: neither side sent anything for the idle timeout, or the
	// sandbox took none of the client's bytes for that long (writeBackend),
	// which ended the tunnel (logged as a silent stream's upstream_timeout).
	idled atomic.Bool
	// clientReset: the client reset its connection while a write to the
	// sandbox waited (writeBackend), which ended the tunnel.
	clientReset atomic.Bool
	// pool is the sandbox connection's pool; killed is set when the
	// tunnel is closed because pools.kill killed that pool.
	pool   *upstream
	killed atomic.Bool
	// changed: a route change cut the tunnel (rejudge): cutMoved or
	// cutRevoked. grant is what its upgrade was let through on (under the
	// pool's mu once listed there).
	changed atomic.Uint32
	grant   grant
	// poolPrev, poolNext link the pool's list of tunnels (upstream.tunnels,
	// under the pool's mu).
	poolPrev, poolNext *tunnel

	// backendGone: the sandbox's side is closed (or a write to it failed);
	// the client's bytes are read and dropped from then on (see linger).
	backendGone atomic.Bool

	// clientErr is the error of the last failed write to the client; only
	// the backend-to-client copy uses it.
	clientErr error
	// writing: a write to the client is in flight (see endBackend).
	writing atomic.Bool

	mu     sync.Mutex
	closed bool
	// clientCut: the client stopped reading and was cut; reads from it end
	// (see cutClient).
	clientCut bool
}

// close ends both directions: the past deadlines end the reads and writes
// pending on either side, and the connections close (the client's is the
// connection itself, not fasthttp's hijacked wrapper, unless it took no
// deadline: see takeBuffered). Only the deadlines are set under the lock
// (so that no later deadline undoes them); the closes are I/O: a TLS
// client's Close writes a close_notify under a 5 s deadline of its own,
// which a client that stopped reading makes it wait out, and the other
// copy, a kill (under its pool's lock) or the drain (under the
// registry's) must not wait behind it for the lock.
func (t *tunnel) close() {
	t.mu.Lock()
	first := !t.closed
	if first {
		t.closed = true
		past := time.Unix(1, 0)
		_ = t.client.SetDeadline(past)
		_ = t.backend.SetDeadline(past)
	}
	t.mu.Unlock()
	if nc, ok := t.client.(interface{ NetConn() net.Conn }); ok && t.isCut() {
		// A cut owes a TLS client no close_notify, nor waits for one: a
		// kill or the drain would wait it out per tunnel. Closing the
		// socket first makes that write fail at once, the one a close
		// that came before the cut is still waiting in too.
		_ = nc.NetConn().Close()
	}
	if !first {
		return
	}
	_ = t.client.Close()
	_ = t.backend.Close()
}

// isCut reports whether the proxy cut the tunnel: a kill, a route change
// or the drain deadline.
func (t *tunnel) isCut() bool {
	return t.killed.Load() || t.drainCut.Load() || t.changed.Load() != cutNone
}

// read reads from c, unless the tunnel was closed. The idle timeout ends
// the tunnel only when neither side has sent anything for that long: a
// terminal's user may type nothing for hours while its output streams.
// Arming the deadline under the lock keeps close from being undone.
func (t *tunnel) read(r *tunnelReader, b []byte) (int, error) {
	c := r.c
	for {
		// The read deadline is armed by start and re-armed only when it
		// passes: setting it per read (a runtime timer change, 144 ns,
		// twice per round trip, plus the lock) was ≈ 2 % of a 64 B echo.
		n, err := c.Read(b)
		if n > 0 {
			t.lastRead.Store(time.Now().UnixNano())
			return n, err
		}
		if !isTimeout(err) || (t.idle <= 0 && !r.bulk) {
			return n, err
		}
		t.mu.Lock()
		if t.closed || (t.clientCut && c == t.client) {
			t.mu.Unlock()
			return 0, net.ErrClosed
		}
		if r.bulk {
			// holdBulk's deadline: the copy gives its bulk buffer back,
			// and the idle one is armed again.
			r.bulk = false
			var d time.Time
			if t.idle > 0 {
				d = time.Unix(0, t.lastRead.Load()).Add(t.idle)
			}
			_ = c.SetReadDeadline(d)
			t.mu.Unlock()
			return 0, errBulkHeld
		}
		if t.writing.Load() && t.writeTimeout > 0 {
			// The other copy is still handing the sandbox's bytes to a
			// client that takes them slowly, within client.write_timeout:
			// a busy tunnel (its end counts as traffic, writeClient).
			_ = c.SetReadDeadline(time.Now().Add(t.idle))
			t.mu.Unlock()
			continue
		}
		last := t.lastRead.Load()
		if time.Now().UnixNano()-last >= int64(t.idle) {
			t.idled.Store(true)
			t.mu.Unlock()
			return n, err // both sides silent for the idle timeout
		}
		// This side was silent, the other was not: wait until idle has
		// passed since the last byte either way.
		_ = c.SetReadDeadline(time.Unix(0, last).Add(t.idle))
		t.mu.Unlock()
	}
}

// bulkHold is how long a tunnel direction keeps the pooled buffer it took
// for bulk (copyTunnel) with no byte to read.
const bulkHold = time.Second

// errBulkHeld: a read waited bulkHold (holdBulk), and the copy gives its
// bulk buffer back.
var errBulkHeld = errors.New("tunnel bulk buffer held too long")

// holdBulk arms r's read deadline bulkHold from now, or at the idle
// timeout if that comes first: a read still waiting then ends with
// errBulkHeld, and the copy reads on into its small buffer (read re-arms
// the idle deadline). Under the lock, and not once the tunnel is closed
// or the client cut, so that it cannot undo their past deadline.
func (t *tunnel) holdBulk(r *tunnelReader) {
	d := time.Now().Add(bulkHold)
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed || (t.clientCut && r.c == t.client) {
		return
	}
	if t.idle > 0 {
		d = minTime(d, time.Unix(0, t.lastRead.Load()).Add(t.idle))
	}
	_ = r.c.SetReadDeadline(d)
	r.bulk = true
}

// minTime is the earlier of a and b.
func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// writeClient writes to the client within client.write_timeout, as every
// other response piece is: a client that stops reading would otherwise
// hold the tunnel and its sandbox connection until the idle timeout, since
// the backend side stalls too once this write blocks. The deadline moves
// at most once per slack (a runtime timer change per frame would cost as
// much as the read deadlines did), and under the lock so that it cannot
// undo close's past deadline.
func (t *tunnel) writeClient(b []byte) (int, error) {
	if err := t.moveWriteDeadline(t.client, t.writeTimeout, &t.writeDeadline); err != nil {
		return 0, err
	}
	t.writing.Store(true)
	n, err := t.client.Write(b)
	// Before writing ends: read's idle check, finding no write in
	// flight, then finds this one's end.
	t.lastRead.Store(time.Now().UnixNano())
	t.writing.Store(false)
	if err != nil {
		t.clientErr = err
	}
	return n, err
}

// writeBackend writes to the sandbox within the idle timeout, as the
// proxy writes a request body (and as nginx's proxy_send_timeout, which
// the platform sets to its read timeout, 7206 s, bounds a WebSocket's
// writes to the sandbox). A sandbox that stops reading holds the client
// back (the proxy reads no more from it: TCP backpressure, no buffering),
// and without a deadline this write would block for as long as the
// sandbox lives when it keeps sending meanwhile (a server whose reader is
// stuck while its pings or output still flow): the read side's idle
// timeout never fires then, and the tunnel, its sandbox connection and
// max_streams_per_sandbox slot were held for ever. A write that made no
// progress for the idle timeout ends the tunnel as an idle one
// (upstream_timeout). While it waits, the client's socket is looked at
// every clientCheck: a client that reset it is gone for good (its unread
// bytes with it), and nobody else would notice, since the other copy
// waits on the sandbox; the tunnel ends at once (client_closed_request)
// rather than hold both sockets and the slot until the idle timeout. A
// half-close is no departure: its bytes still go to the sandbox. The
// deadline moves at most once per slack, under the lock so that it
// cannot undo close's past deadline.
func (t *tunnel) writeBackend(b []byte) (int, error) {
	n := 0
	progress := time.Now()
	waited := false
	for {
		if err := t.moveWriteDeadline(t.backend, clientCheck, &t.sendDeadline); err != nil {
			return n, err
		}
		m, err := t.backend.Write(b[n:])
		n += m
		if err == nil || !isTimeout(err) {
			if waited {
				// The end of a write the sandbox took slowly is traffic,
				// as its progress was (below).
				t.lastRead.Store(time.Now().UnixNano())
			}
			return n, err
		}
		waited = true
		t.mu.Lock()
		cut := t.closed // close's past deadline, not the sandbox's stall
		t.mu.Unlock()
		if cut {
			return n, err
		}
		now := time.Now()
		if m > 0 {
			progress = now
			// Traffic: the other copy's idle check must not take a
			// sandbox that reads slowly for a silent tunnel.
			t.lastRead.Store(now.UnixNano())
		}
		t.sendDeadline = time.Time{} // expired: the next one is set whatever it is
		switch {
		case clientReset(t.client):
			t.clientReset.Store(true)
			t.close()
			return n, err
		case t.idle > 0 && now.Sub(progress) >= t.idle:
			t.idled.Store(true)
			t.close()
			return n, err
		}
	}
}

// moveWriteDeadline sets c's write deadline to timeout from now when the
// last one set, *last, is more than a slack behind (timeout 0: none), for
// the one copy that writes to c. It is set under the lock, and refused
// once the tunnel is closed, so that it cannot undo close's past deadline.
func (t *tunnel) moveWriteDeadline(c net.Conn, timeout time.Duration, last *time.Time) error {
	if timeout <= 0 {
		return nil
	}
	want := time.Now().Add(timeout)
	if !last.IsZero() && want.Sub(*last) < slack(timeout) {
		return nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return net.ErrClosed
	}
	_ = c.SetWriteDeadline(want)
	*last = want
	return nil
}

// cutClient ends the client-to-sandbox copy of a client that stopped
// reading: a past read deadline ends its pending read, and read does not
// re-arm it. The client's socket closes with the tunnel.
func (t *tunnel) cutClient() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return
	}
	t.clientCut = true
	_ = t.client.SetReadDeadline(time.Unix(1, 0))
}

// endBackend ends the client-to-sandbox direction once the client's side
// ended (a FIN, a reset, a cut): the sandbox gets a FIN after every byte
// the client sent, and the tunnel closes once the sandbox's side ended too
// (outDone). Closing the sandbox's socket while the sandbox is still
// sending would reset it with that output unread, and the reset drops what
// the proxy had not yet delivered to a sandbox that reads slower than it
// writes: the client's last bytes, its close frame among them. Meanwhile
// the sandbox's output still goes to the client, which may have only
// half-closed, or is read and dropped. As nginx's lingering close, the
// wait ends too when the sandbox has sent nothing for lingerTimeout (all
// its output taken, the close is a FIN, after which the kernel still
// delivers what is queued for it), and after lingerTime in any case.
func (t *tunnel) endBackend(outDone <-chan struct{}) {
	if t.backendGone.Load() {
		return
	}
	t.mu.Lock()
	closed := t.closed
	t.mu.Unlock()
	cw, ok := t.backend.(interface{ CloseWrite() error })
	if closed || !ok || cw.CloseWrite() != nil {
		return
	}
	end := time.Now().Add(lingerTime)
	timer := time.NewTimer(lingerTimeout)
	defer timer.Stop()
	for {
		select {
		case <-outDone:
			return
		case now := <-timer.C:
			// The client's reads are over: the last read was the sandbox's.
			quiet := now.Sub(time.Unix(0, t.lastRead.Load()))
			if !now.Before(end) || (quiet >= lingerTimeout && !t.writing.Load()) {
				return
			}
			next := lingerTimeout - quiet
			if next <= 0 { // its last bytes are still being written
				next = lingerTimeout
			}
			timer.Reset(min(next, end.Sub(now)))
		}
	}
}

// tunnelDrainLimit is how much of a sandbox's output is read and dropped
// once its tunnel's client is gone (README: up to 16 MiB).
const tunnelDrainLimit = 16 << 20

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
// splices the client connection to it.
func (p *Proxy) tunnel(ctx *fasthttp.RequestCtx, x *exchange, r *routing.Route, t *routing.Target, addr netip.AddrPort, sb *sandboxState) {
	id := t.ID()
	if perr := p.prepareRequest(ctx, x.seen, r, t, true); perr != nil {
		sb.leave()
		x.fail(ctx, *perr, id)
		return
	}
	// A tunnel's connection is its pool's, counted against
	// upstream.max_conns, though it never goes back to the idle list.
	u := p.pool(r, addr, x, sb)
	if u == nil {
		sb.leave()
		x.fail(ctx, errKilled, id)
		return
	}
	p.startUpstream(ctx, x, addr)
	// Judged by its own copy: once listed, uc.grant is the pool lock's
	// (a route change's walk may point it at a route that judges alike).
	g := grant{route: r, port: t.Port, via: x.via, changes: x.changes}
	uc, err := u.dialNew(p, g, ctx.Conn())
	if first := connectRetry(uc, err); first != nil {
		p.retried(x, &ctx.Request.Header, connectErrCode(first.err), first.err, first.at)
	}
	if err == nil {
		if why := p.judgeLate(x, g); why != cutNone && !uc.killed.Load() { // a kill's cut is the kill's
			uc.release(p, false)
			err = changedErr(why)
		}
	}
	if err != nil {
		// By its end, as forward's: a frozen sandbox holds each of the
		// two connects for upstream.connect_timeout.
		sb.done(time.Now().UnixMilli())
		p.upstreamError(ctx, x, err, id, addr)
		return
	}
	if err := p.sendUpgrade(ctx, uc); err != nil {
		uc.release(p, false)
		sb.done(time.Now().UnixMilli()) // by its end, as forward's
		p.upstreamError(ctx, x, err, id, addr)
		return
	}
	resp := &ctx.Response
	// A 101 may set cookies too, and a declined upgrade is any answer.
	scopeResponse(&resp.Header, t)
	if resp.StatusCode() != fasthttp.StatusSwitchingProtocols {
		// Declined (a 401, a 404, a page): relayed like any answer,
		// streamed if need be, and the connection is not reused.
		resp.Header.SetConnectionClose()
		p.respond(ctx, x, uc, t, addr, sb)
		return
	}
	if !switchedAsAsked(&ctx.Request.Header, &resp.Header) {
		// What follows is in a protocol the client did not ask for (or
		// an unnamed one), which it cannot speak: its WebSocket library
		// would fail the handshake anyway (RFC 6455 §4.1), after the
		// tunnel had taken a sandbox connection until the idle timeout.
		uc.release(p, false)
		// Dated by this answer, as every failure after the sandbox was
		// asked: it may have come minutes after the handshake.
		sb.done(time.Now().UnixMilli())
		p.upstreamError(ctx, x, errWrongSwitch, id, addr)
		return
	}
	if err := removeHopResponse(&resp.Header, true); err != nil {
		uc.release(p, false)
		sb.done(time.Now().UnixMilli())
		p.upstreamError(ctx, x, err, id, addr)
		return
	}
	// The 101 goes out with the proxy's own version, as respond sends
	// every other answer and nginx writes it (RFC 9110 §2.5): a sandbox's
	// "HTTP/1.0 101" (Python's http.server speaks HTTP/1.0 by default),
	// relayed as it came, failed the handshake of clients that take only
	// HTTP/1.1 there (Python's websockets, Rust's tungstenite).
	if !resp.Header.IsHTTP11() {
		resp.Header.SetProtocol(http11)
	}
	p.splice(ctx, x, u, uc, sb)
}

// sendUpgrade writes the upgrade request's head to the sandbox and reads
// its answer's head into ctx.Response.
func (p *Proxy) sendUpgrade(ctx *fasthttp.RequestCtx, uc *upstreamConn) error {
	// An upgrade request has no body (serve sends only bodiless ones
	// here): the head alone.
	ctx.Request.UseHostHeader = true
	if uri := ctx.Request.Header.RequestURI(); len(uri) > 0 && uri[0] != '/' && uri[0] != '*' {
		// An absolute-form target goes on as the path and query alone, as
		// forward sends it: a sandbox's server takes the target's host (and
		// userinfo) over the Host header, which would undo a masked Host.
		u := freshURI(&ctx.Request)
		u.DisablePathNormalizing = true
		ctx.Request.Header.SetRequestURIBytes(u.RequestURI())
	}
	// A client that leaves while the sandbox has yet to answer ends the
	// exchange, as for any request (roundTrip): a Jupyter kernel's channel
	// answers its upgrade only once the kernel is up, and a client that
	// gave up on the handshake must not hold the sandbox's connection and
	// its max_streams_per_sandbox slot until then. Set before the write,
	// which starts the checks.
	uc.client = ctx.Conn()
	bw := writerPool.Get().(*bufio.Writer)
	bw.Reset(uc)
	err := ctx.Request.Header.Write(bw)
	if err == nil {
		err = bw.Flush()
	}
	bw.Reset(nil)
	writerPool.Put(bw)
	if err == nil {
		err = uc.readHeader(p, &ctx.Response)
		if uc.manyLines {
			ctx.SetUserValue(headDropKey{}, (*headDrop)(ctx))
		}
	}
	switch {
	case uc.endClientWait():
		err = errClientLeft // whatever the read made of the closed connection
	case err != nil && uc.interrupted.Load():
		err = uc.cutErr()
	}
	return err
}

// statusClientClosed is nginx's 499: the client closed its connection
// before its answer reached it.
const statusClientClosed = 499

// splice takes over both connections after the sandbox's 101: the
// sandbox's from its pool, the client's from fasthttp (a hijack), writes
// the 101 and starts the tunnel between them.
func (p *Proxy) splice(ctx *fasthttp.RequestCtx, x *exchange, u *upstream, uc *upstreamConn, sb *sandboxState) {
	x.upStatus = fasthttp.StatusSwitchingProtocols
	ctx.Response.Header.SetNoDefaultContentType(true)
	// Bytes the backend sent right after the 101 go to the client first.
	var pending []byte
	if n := uc.br.Buffered(); n > 0 {
		b, _ := uc.br.Peek(n)
		pending = bytes.Clone(b)
	}
	p.releaseReader(uc.br)
	uc.br = nil
	// The registry cuts the tunnel from now on; its release gives the
	// pool's slot back. What it was let through on goes with it.
	g := u.handOff(uc)
	if p.afterHandOff != nil {
		p.afterHandOff()
	}
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
	x.headLater = true
	tx := *x
	entry := p.captureEntry(ctx, x, fasthttp.StatusSwitchingProtocols)
	ttfb := time.Since(x.start)
	// answered counts the request (headLater: headersReady leaves it to
	// this) with the status its client got: the 101, or 499 when the
	// client left before the 101 reached it.
	answered := func(status int) { p.metrics.RequestDone(status, telemetry.RouteWebSocket, ttfb) }
	// release frees what the tunnel holds besides the client connection,
	// and finishes the exchange with status, as answered counted it.
	release := func(status int, err error) {
		u.conns.Add(-1)
		sb.done(time.Now().UnixMilli())
		p.finish(nil, &tx, status, err, entry)
	}
	abandon := func() {
		p.streams.unreserveTunnel()
		_ = raw.Close()
		// The client left before its 101 could go out (fasthttp closed
		// the connection instead of handing it over): the client's
		// choice, logged and counted as a request's hang-up before its
		// answer is (499; upstream_status keeps the sandbox's 101), and
		// no failure of the sandbox (finish).
		tx.errCode = CodeClientClosed
		answered(statusClientClosed)
		release(statusClientClosed, errClientGone)
	}
	// The connection itself: the tunnel reads, writes and closes it (the
	// hijacked one wraps it, reading through fasthttp's reader).
	conn := ctx.Conn()
	// The 101 is written by the hijack handler, not by fasthttp: when the
	// client is gone before it, fasthttp would skip the handler (p.hijack
	// then runs abandon). Counted open from now (the drain waits for it):
	// fasthttp counts the connection out before that handler lists it.
	p.streams.reserveTunnel()
	p.hijack(ctx, func(hc net.Conn) {
		// The tunnel reads the connection itself, not hc: hc reads
		// through fasthttp's reader (client.max_header_size, 32 KiB),
		// which would stay with every idle tunnel. Only what that reader
		// already holds (frames a client sent before the 101) comes
		// from it.
		client, early := conn, takeBuffered(hc, conn)
		if early == nil {
			client = hc // no deadlines on this connection: read as fasthttp does
		}
		tn := &tunnel{client: client, backend: raw, idle: p.cfg.IdleStreamTimeout, writeTimeout: p.clientWriteTimeout, pool: u, grant: g}
		if why := uc.changed.Load(); why != cutNone {
			// A route change cut its connection before the hand-off:
			// logged as that cut, not as the sandbox's reset.
			tn.changed.Store(why)
			tn.close()
		}
		tn.start()
		if p.beforeTunnelListed != nil {
			p.beforeTunnelListed()
		}
		p.streams.addTunnel(tn)
		// Between the hand-off and the listing just made, no list of
		// the pool held the exchange: a change's walk in between did not
		// see it. Judged here as a request is at its checkout
		// (judgeLate): a change announced since its route was read is
		// judged now; one announced later finds it listed.
		if why := p.judgeLate(&tx, g); why != cutNone && !tn.isCut() { // a kill's or the drain's cut is theirs
			tn.changed.CompareAndSwap(cutNone, why)
			tn.close()
		}
		// The request is recycled once this handler returns, so its
		// response head (with every header the handler set) is written
		// here. fasthttp cleared the connection's deadlines: a client
		// that reads nothing must not hold this write (and the tunnel)
		// for ever.
		if p.clientWriteTimeout > 0 {
			_ = client.SetWriteDeadline(time.Now().Add(p.clientWriteTimeout))
		}
		// fasthttp marks an answer given while it shuts down (the drain)
		// "Connection: close" after the handler returned: beside the 101's
		// "Connection: Upgrade" that fails the handshake (net/http drops a
		// Connection header that lists close, and Go's WebSocket clients
		// then find no Upgrade token). The connection is the tunnel's now.
		ctx.Response.Header.ResetConnectionClose()
		head := ctx.Response.Header.AppendBytes(nil)
		headLen := len(head)
		n, err := client.Write(append(head, pending...))
		_ = client.SetWriteDeadline(time.Time{})
		// A write that failed found the client gone, unless the proxy cut
		// the tunnel (a drain past its deadline, a kill) as it registered
		// or while the 101 was going out to a client slow to take it. A
		// client that took none of the 101 within client.write_timeout is
		// still there (client_write_timeout, as a stream's stalled write
		// keeps its status).
		cut := err != nil && tn.isCut()
		gone := err != nil && !isTimeout(err) && !cut
		hs := headSent{err: err, gone: gone, sent: max(int64(n-headLen), 0)}
		if cut && n < headLen {
			// The cut came before the whole 101 reached the client's
			// socket: its client got no switch, only a connection that
			// closed, as a request the kill or the drain cuts before its
			// answer's head gets; that request's status is what is logged
			// and counted (cutStatus), with the sandbox's 101 in
			// upstream_status. The proxy cannot write that answer
			// instead: the cut closed the socket, with part of the 101
			// already in it maybe.
			hs.cut = cutStatus(tn)
		}
		switch {
		case gone:
			answered(statusClientClosed)
		case hs.cut != 0:
			answered(hs.cut)
		default:
			answered(fasthttp.StatusSwitchingProtocols)
		}
		// The tunnel runs on its own goroutine, so that fasthttp's
		// hijack goroutine ends and frees the request's context and
		// fasthttp's reader with it.
		go p.runTunnel(tn, conn, early, int64(len(pending)), hs, &tx, release)
	}, abandon)
}

// headSent is how writing a tunnel's 101 (and what the sandbox sent with
// it) to its client went.
type headSent struct {
	err error // the write's error: with one, the tunnel only closes
	// gone: err found the client gone (the exchange ends as a 499).
	gone bool
	// cut is the status of a tunnel the kill or the drain deadline cut
	// before its 101 was all written (cutStatus); 0 otherwise.
	cut int
	// sent is how many of the sandbox's bytes after its 101 the write
	// took, when it failed.
	sent int64
}

// cutStatus is the status of an exchange that the kill (410) or the drain
// deadline (504) cut before its answer's head reached its client: the
// status upstreamError answers such a request with.
func cutStatus(tn *tunnel) int {
	if tn.killed.Load() {
		return fasthttp.StatusGone
	}
	if why := tn.changed.Load(); why != cutNone {
		return changedStatus(why) // as upstreamError answers a request a route change cut
	}
	return fasthttp.StatusGatewayTimeout
}

// runTunnel copies both ways until the tunnel ends; early is what the
// client sent before the tunnel read its connection (non-nil, maybe
// empty), pending how many bytes the sandbox sent after its 101, and hs
// how writing the 101 (and those) to the client went: after an error, the
// tunnel only closes. Only counts outlive the start: the bytes themselves,
// kept by end for their length, stayed with every tunnel for its life
// (12 KiB a tunnel whose sandbox's first frames came with its 101).
func (p *Proxy) runTunnel(tn *tunnel, conn net.Conn, early []byte, pending int64, hs headSent, tx *exchange, release func(int, error)) {
	headErr := hs.err
	earlyN := int64(len(early))
	var in, out countingReader
	// reset: the sandbox reset its connection rather than closing it
	// (a crashed server, a VM gone), logged so that the session does
	// not pass for one that ended cleanly, as a cut HTTP stream. It is
	// known once the sandbox-to-client copy ends, before end can run.
	reset := false
	// upErr is what ended the sandbox-to-client copy on the sandbox's
	// side (nil: the sandbox ended its side, or the client's side failed
	// first): the reset, the idle timeout, the close a kill or the drain
	// made.
	var upErr error
	// cause is the timeout on the client's side that ended the tunnel (the
	// 101, or a later write, not taken within client.write_timeout),
	// logged as a stream's (bodyStream.clientEnded).
	var cause error
	if headErr != nil && isTimeout(headErr) {
		cause = headErr
	}
	// end finishes the exchange, once: when the tunnel closes, or as
	// soon as its sandbox ended it and only the client's side lingers
	// (linger calls it).
	ended := false
	end := func() {
		if ended {
			return
		}
		ended = true
		if p.beforeCutEnd != nil && tn.isCut() {
			p.beforeCutEnd()
		}
		tx.bytesIn, tx.bytesOut = in.n.Load()+earlyN, out.n.Load()+pending
		if headErr != nil {
			// Only what the failed write took of pending went out.
			tx.bytesOut = hs.sent
		}
		status := fasthttp.StatusSwitchingProtocols
		switch {
		case hs.gone:
			// The client was gone before its 101 went out: as abandon,
			// whatever else (a drain, a kill) came since. What came with
			// the 101 did not reach it either.
			tx.errCode = CodeClientClosed
			status = statusClientClosed
			tx.bytesOut = 0
		case hs.cut != 0:
			// Cut before its 101 was all written: logged with the status
			// its client was counted with (splice), the cut's code, and
			// nothing sent.
			status = hs.cut
			tx.bytesOut = 0
			switch {
			case hs.cut == fasthttp.StatusGone:
				tx.errCode = CodeSandboxKilled
			case tn.changed.Load() != cutNone:
				tx.errCode = changedCode(tn.changed.Load())
			default:
				tx.errCode = CodeDrainTimeout
			}
		case tn.killed.Load():
			tx.errCode = CodeSandboxKilled
		case tn.changed.Load() != cutNone:
			tx.errCode = changedCode(tn.changed.Load())
		case tn.drainCut.Load():
			tx.errCode = CodeDrainTimeout
		case reset:
			tx.errCode = CodeUpstreamReset
		case tn.idled.Load():
			tx.errCode = CodeUpstreamTimeout
		case tn.clientReset.Load():
			tx.errCode = CodeClientClosed
		case cause != nil:
			tx.errCode = CodeClientWriteTimeout
		}
		release(status, tunnelEndErr(tx.errCode, cause, upErr))
		// Listed until its line is logged (release): the drain's wait
		// ends once nothing is, and the access log is closed then. A
		// drain or a kill that finds it ended meanwhile closes it again,
		// a no-op.
		p.streams.removeTunnel(tn)
	}
	defer func() {
		tn.close()
		end()
		p.clientConnClosed()
	}()
	if headErr != nil {
		return
	}
	done, outDone := make(chan struct{}), make(chan struct{})
	go func() {
		if len(early) > 0 {
			_, _ = backendWriter{tn}.Write(early)
			early = nil
		}
		in.r = &tunnelReader{t: tn, c: tn.client}
		_ = copyTunnel(backendWriter{tn}, &in)
		tn.endBackend(outDone)
		tn.close()
		close(done)
	}()
	out.r = &tunnelReader{t: tn, c: tn.backend}
	err := copyTunnel(clientWriter{tn}, &out)
	reset = tn.clientErr == nil && errors.Is(err, syscall.ECONNRESET)
	if tn.clientErr == nil {
		upErr = err
	}
	if tn.clientErr != nil {
		// The client is gone, or stopped reading and is cut: the
		// sandbox's output is read and dropped until it ends its side
		// (or endBackend's wait does), so that its socket closes
		// without a reset that would lose what the client sent. Up to
		// tunnelDrainLimit bytes: a sandbox still streaming past that is
		// not reading either.
		if isTimeout(tn.clientErr) {
			tn.cutClient()
			cause = tn.clientErr
		}
		_, _ = io.CopyN(io.Discard, &tunnelReader{t: tn, c: tn.backend}, tunnelDrainLimit)
	}
	close(outDone)
	if err == nil && p.held.add(conn) {
		// The sandbox ended its side. Held while the client's side
		// lingers, and counted lingering from before it leaves the
		// registry (end): the drain waits for it as for a refusal's
		// lingering close, until its deadline, after which Shutdown's end
		// cuts the wait short. Uncounted, a drain that found nothing else
		// open ended at once, and closed the socket over the client's
		// next bytes (its reply to the sandbox's close frame): the reset
		// the linger is there to avoid.
		p.lingering.Add(1)
		tn.linger(conn, done, end)
		p.lingering.Add(-1)
		p.held.remove(conn)
	}
	tn.close()
	<-done
}

// tunnelEndErr is the error a tunnel that ended with code (its log line's
// error_code) finishes with: cause, a client that took no write in time;
// for a cut of the sandbox's side or the proxy's (a reset, the idle
// timeout, a kill, the drain, a route change) what ended its copy from
// the sandbox, upErr, or, when that side was not what failed, the code
// itself; nil for a tunnel either side closed, or its client left. Its
// upstream span is an error then, as a stream's cut the same way is
// (finish); a tunnel that ended with no error whatever cut it had an
// upstream span that never was.
func tunnelEndErr(code string, cause, upErr error) error {
	switch {
	case cause != nil:
		return cause
	case code == "" || telemetry.ClientEnded(code):
		return nil
	case upErr != nil:
		return upErr
	}
	return errors.New("tunnel cut: " + code)
}

// takeBuffered returns what hc, a hijacked connection reading conn through
// fasthttp's reader, holds already, and leaves conn to be read directly:
// with conn's read deadline passed, the reader gives what it holds, and
// then its next read fails at once, before any system call. nil when conn
// takes no deadline.
func takeBuffered(hc, conn net.Conn) []byte {
	if conn.SetReadDeadline(time.Unix(1, 0)) != nil {
		return nil
	}
	early := []byte{}
	var b [512]byte
	for {
		n, err := hc.Read(b[:])
		early = append(early, b[:n]...)
		if err != nil {
			break // the deadline; or the client's end, which conn reports again
		}
	}
	_ = conn.SetReadDeadline(time.Time{})
	return early
}

// errWrongSwitch is a 101 whose Upgrade names no protocol, one the request
// did not offer, or more than maxSwitchProtocols.
var errWrongSwitch = errors.New("101 Switching Protocols to a protocol the client did not offer")

// maxSwitchProtocols is the most protocols a 101's Upgrade may name: a
// stack of them (RFC 9110 §7.8), a few at most, usually one.
const maxSwitchProtocols = 8

// switchedAsAsked reports whether a 101 names the protocols it switches to
// in Upgrade, each one the request offered, as RFC 9110 requires (§15.2.2:
// a 101 MUST carry Upgrade; §7.8: a server MUST NOT switch to a protocol
// the client did not offer). Names compare case-insensitively, as
// WebSocket's "websocket" does. The offers are read once, whatever the
// 101 names: a sandbox naming thousands of protocols to a client offering
// thousands (16 KiB heads each) cost 350 ms of CPU per handshake when
// each name was looked up among the offers in turn.
func switchedAsAsked(req *fasthttp.RequestHeader, resp *fasthttp.ResponseHeader) bool {
	var named [maxSwitchProtocols][]byte
	n := 0
	for _, v := range resp.PeekAll("Upgrade") {
		for len(v) > 0 {
			var proto []byte
			if proto, v = nextToken(v); len(proto) == 0 {
				continue
			}
			// h2c is never spliced, even when offered beside a protocol
			// the tunnel takes (see switchable).
			if n == len(named) || isH2C(proto) {
				return false
			}
			named[n] = proto
			n++
		}
	}
	if n == 0 {
		return false
	}
	var found, all uint = 0, 1<<n - 1
	for _, v := range req.PeekAll("Upgrade") {
		for len(v) > 0 && found != all {
			var offer []byte
			offer, v = nextToken(v)
			for i, proto := range named[:n] {
				if len(offer) == len(proto) && bytes.EqualFold(offer, proto) {
					found |= 1 << i
				}
			}
		}
	}
	return found == all
}

// switchable reports whether an upgrade request (upgradeRequested) is one
// the tunnel takes: an HTTP/1.1 request offering a protocol other than h2c.
// A server MUST ignore Upgrade in an HTTP/1.0 request (RFC 9110 §7.8), and
// the 101 fasthttp wrote such a client said "Connection: keep-alive", not
// Upgrade, which fails any client's handshake. h2c's upgrade is deprecated
// (RFC 9113 §3.1) and cannot work through the proxy: its HTTP2-Settings,
// which it requires (RFC 7540 §3.2.1), is hop-by-hop and removed. A
// sandbox that switched anyway would get a whole HTTP/2 connection whose
// requests the proxy never sees, one by one (the "h2c smuggling" past a
// proxy's per-request checks); Envoy strips the h2c upgrade too. Those
// requests go on as plain ones, Upgrade removed, as a POST's does. Only
// requests with an Upgrade header get here: no cost for the others.
func switchable(h *fasthttp.RequestHeader) bool {
	if !h.IsHTTP11() {
		return false
	}
	for _, v := range h.PeekAll("Upgrade") {
		for len(v) > 0 {
			var proto []byte
			if proto, v = nextToken(v); len(proto) > 0 && !isH2C(proto) {
				return true
			}
		}
	}
	return false
}

// isH2C reports whether an Upgrade token is h2c, never tunnelled (see
// switchable).
func isH2C(proto []byte) bool { return bytes.EqualFold(proto, []byte("h2c")) }

// tunnelSmallBuf is the buffer a tunnel direction reads into while its
// traffic is small messages (keystrokes, pings, a chat's tokens).
const tunnelSmallBuf = 2 << 10

// copyTunnel copies src to dst until src ends (nil) or either fails, as
// io.Copy does, without holding io.Copy's 32 KiB buffer for the tunnel's
// whole life: most WebSockets sit idle for hours between small messages,
// and two such buffers per tunnel were most of its memory. It reads into a
// 2 KiB buffer, and into a pooled 64 KiB one from the first read that
// fills the small one (bulk) until a read has waited bulkHold for a byte
// (holdBulk). copyGrowing's rule, the big buffer back once a read brings
// less than the small one holds, is right for an upload, which ends, but a
// tunnel that went quiet after a message of a few KiB kept it while it
// waited, for hours: 145 KiB of RSS per idle tunnel that had carried one
// 60 KB message each way, against 22 KiB. Giving it back after every read
// that did not fill it cost bulk 10 % more CPU over TCP and 18 % over TLS
// (a TLS read ends at its record), for a second small read per big one.
func copyTunnel(dst io.Writer, src *countingReader) error {
	g := growingBuf{small: make([]byte, tunnelSmallBuf)}
	defer g.shrink()
	for {
		b := g.next()
		n, rerr := src.Read(b)
		if n > 0 {
			if _, werr := dst.Write(b[:n]); werr != nil {
				return werr
			}
		}
		switch {
		case rerr == io.EOF:
			return nil
		case rerr == errBulkHeld:
			g.shrink()
		case rerr != nil:
			return rerr
		case g.grow(n):
			src.r.t.holdBulk(src.r)
		}
	}
}

// countingReader counts the bytes a tunnel direction carried.
type countingReader struct {
	r *tunnelReader
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
	// bulk: c's read deadline is holdBulk's, not the idle timeout's (only
	// the direction's own copy, and the lock, touch it).
	bulk bool
}

func (r *tunnelReader) Read(b []byte) (int, error) { return r.t.read(r, b) }

// clientWriter writes a tunnel's backend-to-client direction.
type clientWriter struct{ t *tunnel }

func (w clientWriter) Write(b []byte) (int, error) { return w.t.writeClient(b) }

// backendWriter writes a tunnel's client-to-backend direction. Once the
// sandbox's side is gone it drops the client's bytes instead of failing:
// the client's socket is then closed by the other direction (see
// tunnel.linger), not by this one on a write error. A sandbox that stopped
// reading (writeBackend's timeout) closed the tunnel: that write fails.
type backendWriter struct{ t *tunnel }

func (w backendWriter) Write(b []byte) (int, error) {
	if !w.t.backendGone.Load() {
		_, err := w.t.writeBackend(b)
		if err == nil {
			return len(b), nil
		}
		if w.t.idled.Load() || w.t.clientReset.Load() {
			// The sandbox stopped reading, or the client reset while it
			// waited: the tunnel is closed, and the client's bytes are not
			// to be dropped as if the sandbox had gone.
			return 0, err
		}
		w.t.backendGone.Store(true)
	}
	return len(b), nil
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
