package proxy

import (
	"bufio"
	"net"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"
)

// A refused body is discarded after the answer, as nginx's lingering close
// does (lingering_time 30s, lingering_timeout 5s): each read within
// lingerTimeout, all within lingerTime. A client still sending would
// otherwise get a connection reset instead of the answer. Time bounds it,
// as it bounds nginx's, not bytes: cut at 16 MiB, a larger upload (Python's
// requests and httpx send the whole body before they read) got a broken
// pipe instead of its 404 or 502. Discarding costs less than the upload a
// public sandbox would take anyway, and a client that wants more just
// sends another request.
const (
	lingerTime    = 30 * time.Second
	lingerTimeout = 5 * time.Second
)

// lingerBody answers at once and then closes the connection after a
// lingering close. fasthttp would answer only after the handler returned,
// so discarding the body in the handler kept a slow uploader waiting for
// its 413 until it had sent 16 MiB or timed out; and fasthttp skips a
// hijack handler on a connection marked for closing, so the answer is
// written here.
//
// It counts lingering from the handler on, as goLingerClose does before
// its goroutine: fasthttp counts the connection out as the handler
// returns, before the hijack handler runs, and a drain that found nothing
// open in between ended and closed the connection over the client's
// unread body (TestDrainWaitsForARefusalAboutToLinger). When fasthttp
// skips the hijack handler, Proxy.hijack's abandon counts it out.
func (p *Proxy) lingerBody(ctx *fasthttp.RequestCtx) {
	raw := ctx.Conn()
	p.lingering.Add(1)
	p.hijack(ctx, func(c net.Conn) {
		defer p.lingering.Add(-1)
		defer func() {
			_ = raw.Close()
			p.clientConnClosed()
		}()
		if p.beforeRefusalLingers != nil {
			p.beforeRefusalLingers()
		}
		// The request is recycled only after this returns: its response
		// (with every header the handler set) is still here.
		ctx.Response.Header.SetConnectionClose()
		p.answerCounted(raw, c, &ctx.Response)
	}, func() { p.lingering.Add(-1) })
}

// answerLingering writes resp to the client connection raw, ends raw's
// write side so that the client sees the answer end, and then reads and
// discards from r (raw, or its hijacked form) what the client still sends,
// within lingerTimeout and lingerTime, as nginx's lingering
// close does. A connection closed with unread bytes is reset, and the
// client's write of the rest fails before it reads the answer. The caller
// closes raw.
func (p *Proxy) answerLingering(raw, r net.Conn, resp *fasthttp.Response) {
	p.lingering.Add(1)
	defer p.lingering.Add(-1)
	p.answerCounted(raw, r, resp)
}

// answerCounted is answerLingering for a caller that counts it in
// lingering itself.
func (p *Proxy) answerCounted(raw, r net.Conn, resp *fasthttp.Response) {
	if p.clientWriteTimeout > 0 {
		_ = raw.SetWriteDeadline(time.Now().Add(p.clientWriteTimeout))
	}
	bw := writerPool.Get().(*bufio.Writer)
	bw.Reset(raw)
	err := resp.Write(bw)
	if err == nil {
		err = bw.Flush()
	}
	bw.Reset(nil)
	writerPool.Put(bw)
	if err != nil {
		return
	}
	if cw, ok := raw.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite() // the client sees the answer end
	}
	p.linger(raw, r)
}

// lingerClose closes c, a client connection whose stream ended cleanly but
// whose client sent bytes the proxy will not read (a request pipelined
// behind a detached stream, which ends with its connection): closed at
// once with them unread, the socket is reset, the client reads
// ECONNRESET instead of the end, and what of the end the proxy's kernel
// had not sent yet is lost. So its side is ended first and the rest read
// and dropped (linger), as nginx's lingering close does. The connection
// is counted closed once it is.
func (p *Proxy) lingerClose(c net.Conn) {
	defer p.clientConnClosed()
	p.lingerThenClose(c)
}

// goLingerClose runs lingerClose(c), then after (if not nil), in a
// goroutine, counted in lingering before it starts: the drain ends once
// it finds nothing open and nothing lingering, and a goroutine that
// counted itself only in linger, after its CloseWrite (a TLS close_notify
// waits up to 5 s for a client slow to read), left the drain a window to
// end in; Shutdown then closed the connection over the client's unread
// bytes, the reset the linger avoids
// (TestCloseLingeringCountedForTheDrainAtOnce).
func (p *Proxy) goLingerClose(c net.Conn, after func()) {
	p.lingering.Add(1)
	go func() {
		defer p.lingering.Add(-1)
		if after != nil {
			defer after()
		}
		p.lingerClose(c)
	}()
}

// lingerThenClose ends c's write side, reads and drops what its client
// still sends (linger), then closes c.
func (p *Proxy) lingerThenClose(c net.Conn) {
	defer func() { _ = c.Close() }()
	if p.clientWriteTimeout > 0 {
		// A TLS connection's CloseWrite writes its close_notify.
		_ = c.SetWriteDeadline(time.Now().Add(p.clientWriteTimeout))
	}
	if cw, ok := c.(interface{ CloseWrite() error }); ok && cw.CloseWrite() == nil {
		p.linger(c, c)
	}
}

// closeLingering closes inner, a client connection's own (TCP or TLS)
// connection, after a lingering close in a goroutine, and reports true,
// when the client sent bytes that nobody will read; otherwise it does
// nothing and reports false, and the caller closes. fasthttp closes a
// connection once an answer that ends it is written (the drain's, an
// HTTP/1.0 or Connection: close request's, a refusal's), also when the
// client has already sent its next request (pipelined, or sent as soon as
// the answer's head came): closed with those bytes unread, the socket was
// reset, and the reset threw away what of the answer the kernel had not
// sent yet. Measured on the binary: a client that had pipelined a second
// GET behind an 8 MiB download got 4.4 of the 8 MiB and ECONNRESET during
// the drain, 4.6 to 7.6 MiB behind an HTTP/1.0 one, each logged as 200
// with every byte sent; nginx 1.22 sent all of it, then ended the
// connection (lingering_close on lingers when bytes wait behind the
// answer). lingered makes it once: the linger's own close is a
// close. After a failed write (client.write_timeout) it closes at once,
// as nginx does: the client takes nothing, and lingering would only hold
// the answer's unsent bytes.
//
// The connection is held (p.held), counted under client.max_conns and
// counted lingering (goLingerClose) before the goroutine starts: fasthttp
// counts it closed when this returns, and the drain, seeing no connection
// left, could end before a goroutine that had yet to hold it.
func (p *Proxy) closeLingering(inner net.Conn, lingered *atomic.Bool, writeFailed bool) bool {
	if writeFailed || !lingered.CompareAndSwap(false, true) || !clientSentMore(inner) {
		return false
	}
	if !p.held.add(inner) {
		return true // the drain is over: add closed it
	}
	p.clientConns.Add(1)
	p.metrics.ConnOpened()
	p.goLingerClose(inner, func() { p.held.remove(inner) })
	return true
}

// linger reads and discards from r what the client of raw still sends,
// within lingerTimeout and lingerTime, once raw's write side is closed.
// The caller closes raw, and counts it in lingering (which the drain
// waits for) from before its answer's end goes out. It reads into a 4 KiB
// buffer, and into a 64 KiB one only after a read filled the one it used
// (more is queued): a client
// without credentials that trickled a refused body held a 64 KiB buffer
// for each lingering connection, up to 30 s, ≈ 110 KiB counted per
// connection against README's 56 KiB sizing. Unlike copyGrowing's rule, a
// read that leaves the big buffer part empty gives it back, so that a
// burst followed by a pause does not hold it through the pause.
func (p *Proxy) linger(raw, r net.Conn) {
	// Held while it lingers: the drain waits for it until its deadline,
	// and Shutdown's end cuts the wait short.
	if !p.held.add(raw) {
		return
	}
	defer p.held.remove(raw)
	small := uploadBufPool.Get().(*[]byte)
	defer uploadBufPool.Put(small)
	g := growingBuf{small: *small}
	defer g.shrink()
	end := time.Now().Add(lingerTime)
	for {
		b := g.next()
		_ = r.SetReadDeadline(minTime(time.Now().Add(lingerTimeout), end))
		n, err := r.Read(b)
		switch {
		case err != nil:
			return
		case g.big != nil && n < len(b):
			g.shrink()
		default:
			g.grow(n)
		}
	}
}
