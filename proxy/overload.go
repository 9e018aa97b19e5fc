package proxy

import (
	"crypto/tls"
	"net"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"
)

// limit makes l a listener of client traffic: every connection it accepts
// counts in open (shared by all traffic listeners) until it closes, and
// one that would make open exceed max (> 0) takes the place of the
// connections of waiting that wait longest for a request (reclaim), or is
// refused at once when none does.
func (l *retryListener) limit(open *atomic.Int64, max int64, waiting *waitList) {
	l.open, l.max, l.waiting = open, max, waiting
	if max > 0 {
		l.victims = make([]net.Conn, 0, maxReclaim)
		l.answerRest = overloadAnswer()
		l.answer = make([]byte, 0, overloadDatedLen+len(l.answerRest))
		l.scratch = make([]byte, 4<<10)
	}
}

// admit counts a new connection in, unless max are open already. One
// atomic add: the limit holds exactly across listeners accepting at once.
func (l *retryListener) admit() bool {
	if n := l.open.Add(1); l.max > 0 && n > l.max {
		l.open.Add(-1)
		return false
	}
	return true
}

// admitOrReclaim admits a new connection, closing connections that wait
// for a request to make room for it at the limit (reclaim); false when
// every open connection is busy.
func (l *retryListener) admitOrReclaim() bool {
	for !l.admit() {
		// Another listener may take the room made before this one
		// does: reclaim again then, until none waits.
		if !l.reclaim() {
			return false
		}
	}
	return true
}

// refuseDrainReads bounds the reads of what a refused client already sent
// (each of len(scratch)).
const refuseDrainReads = 16

// refuse answers a connection over client.max_conns and closes it, on the
// accept goroutine, without ever waiting for the client: a refusal must
// cost next to nothing, since it happens when the proxy has no room, and
// a client that never reads (or never sends) must not hold up the
// clients behind it. No goroutine is started for it. So:
//
//   - Plain HTTP gets the proxy's JSON 503 proxy_overloaded with
//     Retry-After, X-Cube-Retcode 310503 and Connection: close, in one non-blocking write before
//     its request is read (a fresh socket's send buffer always takes it);
//     the request is not parsed, so it is JSON even for a browser.
//   - HTTPS is closed without a TLS answer: answering needs a handshake,
//     the most expensive thing a proxy out of room could spend CPU on,
//     paced by the client. The client sees the connection end during the
//     handshake, as from nginx out of worker_connections.
//
// What the client already sent is read and dropped (non-blocking, at most
// 64 KiB) so that the close is a FIN rather than a reset that could
// destroy the answer in the client's buffers. Refusals are counted
// (cubeproxy_connections_refused_total) and logged at most every 10 s.
func (l *retryListener) refuse(c net.Conn) {
	l.metrics.ConnRefused()
	l.refused++
	now := time.Now()
	if now.Sub(l.refusedLogged) >= 10*time.Second {
		l.log.Warn("refusing client connections: client.max_conns are open (503 proxy_overloaded); raise it if memory allows",
			"addr", l.Addr().String(), "max_conns", l.max, "refused", l.refused)
		l.refusedLogged, l.refused = now, 0
	}
	raw, isTLS := c, false
	if tc, ok := c.(serverTLSConn); ok {
		raw, isTLS = tc.NetConn(), true
	}
	if !isTLS {
		// Dated now, as every other answer of the proxy (RFC 9110
		// 6.6.1): the status line and the Date, then the rest as
		// rendered once. Refusals run on the accept goroutine, so its
		// one buffer serves them all.
		b := append(l.answer[:0], overloadStatusLine...)
		b = append(b, "Date: "...)
		b = fasthttp.AppendHTTPDate(b, now)
		b = append(b, "\r\n"...)
		l.answer = append(b, l.answerRest...)
		writeNow(raw, l.answer)
	}
	discardNow(raw, l.scratch, refuseDrainReads)
	_ = raw.Close()
}

// serverTLSConn is a TLS connection as a traffic listener accepts it:
// *tls.Conn (Serve over tls.NewListener) or ServeTLS's tlsConn.
type serverTLSConn interface {
	ConnectionState() tls.ConnectionState
	NetConn() net.Conn
}

// overloadStatusLine begins the answer to a refused connection.
const overloadStatusLine = "HTTP/1.1 503 Service Unavailable\r\n"

// overloadDatedLen is the length of the status line and the Date line
// before overloadAnswer's part: an HTTP date is always 29 bytes ("Mon, 02
// Jan 2006 15:04:05 GMT"), so the buffer sized with it is never grown.
const overloadDatedLen = len(overloadStatusLine) + len("Date: ") + 29 + len("\r\n")

// overloadAnswer renders the answer to a refused connection after its
// status line and Date: the other header lines and the body.
func overloadAnswer() []byte {
	e := proxyError{status: 503, code: CodeOverloaded, msg: "the proxy holds as many client connections as it may (client.max_conns); retry", retryAfter: 1}
	body := appendErrorJSON(nil, e, nil)
	b := []byte("Content-Type: application/json\r\nCache-Control: no-store\r\nRetry-After: ")
	b = strconv.AppendInt(b, int64(e.retryAfter), 10)
	// The platform's code for an answer of the proxy's own, as on every
	// other traffic answer (setRetcode): this one is written by hand.
	b = appendRetcode(append(b, "\r\n"+HeaderRetcode+": "...), e.status, false)
	b = append(b, "\r\nConnection: close\r\nContent-Length: "...)
	b = strconv.AppendInt(b, int64(len(body)), 10)
	b = append(b, "\r\n\r\n"...)
	return append(b, body...)
}
