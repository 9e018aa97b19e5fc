package proxy

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/valyala/fasthttp"
)

// roundTrip sends req on a pooled connection and reads the response
// headers into resp. On success the connection is busy and positioned at
// the response body; the caller reads the body with c.br and ends the
// exchange with c.release. Each connect and send retried is counted in
// x and, tracing on, is a client span of its own (retried).
//
// A request is re-sent once, on a new connection, only when a reused
// keep-alive connection turned out to be closed by the backend before it
// sent a single byte of an answer, the method is idempotent and there is no
// body (an empty one counts as none). acquire already drops idle
// connections the backend closed; this covers a close racing the request.
// g is what the request was let through on: a route change judges the
// exchange by it (rejudge).
func (p *Proxy) roundTrip(x *exchange, u *upstream, g grant, req *fasthttp.Request, resp *fasthttp.Response, headerTimeout time.Duration, client net.Conn) (*upstreamConn, error) {
	// Content-Length: 0 is no body, though fasthttp gives it a (empty)
	// stream: every client sends it on a PUT without one (Go's, Python's
	// requests, Node's fetch), and some on a GET or DELETE.
	retryable := (!req.IsBodyStream() || req.Header.ContentLength() == 0) && isIdempotent(req.Header.Method())
	body, _ := req.BodyStream().(*clientBody)
	// A body fasthttp has not read whole (it reads up to fasthttpPreRead
	// before the handler) may take long to send: the sandbox may answer
	// meanwhile. A smaller one goes out in a write or two. So may one
	// held in memory at the stream limit (x.held, up to max_held_body):
	// a sandbox that refuses it from the head and then reads no more
	// would otherwise keep its write, slot and held bytes until
	// upstream.idle_timeout.
	slowBody := x.held > 0 || body != nil &&
		(req.Header.ContentLength() < 0 || req.Header.ContentLength() > fasthttpPreRead)
	watchAnswer := p.hangups != nil && slowBody
	for attempt := 0; ; attempt++ {
		c, reused, err := u.acquire(p, attempt > 0, g, client)
		if first := connectRetry(c, err); first != nil {
			p.retried(x, &req.Header, connectErrCode(first.err), first.err, first.at)
		}
		if err != nil {
			return nil, err
		}
		// On the retry's connection too: between the release of the
		// first and this checkout no list of the pool held the request,
		// and a change's walk then did not see it. A kill's cut is the
		// kill's (410), though its invalidation moves the count too:
		// killed is read after the count.
		if why := p.judgeLate(x, g); why != cutNone && !c.killed.Load() {
			u.dropBusy(c)
			return nil, changedErr(why)
		}
		c.nread = 0
		c.headerTimeout = headerTimeout
		c.client = client
		if body != nil {
			u.setUpload(c, body)
		}
		if c.answered.Load() {
			c.answered.Store(false) // a store is a locked instruction: not on every request
		}
		if c.untold.Load() {
			c.untold.Store(false)
		}
		if watchAnswer && (c.raw != nil || c.initRaw() == nil) {
			c.answer.body = body
			c.answerKey = p.hangups.watchReadable(c.raw, &c.answer)
		}
		c.slowBody = slowBody
		serr := c.send(req, body)
		c.slowBody = false
		if c.answerKey != 0 {
			p.hangups.unwatch(c.answerKey) // hangUp is not running once this returns
			c.answerKey, c.answer.body = 0, nil
		}
		if body != nil {
			u.setUpload(c, nil)
		}
		err = serr
		if serr == nil && c.answered.Load() {
			// The answer came as the last bytes went out: the body was all
			// sent, and the exchange goes on as usual. Only the write
			// deadline earlyAnswer expired is to be set anew.
			c.answered.Store(false)
			c.writeDeadline = time.Time{}
		}
		if c.untold.Load() {
			// The body was sent (or failed) before the bytes told: the
			// head is read as usual, and writeUntold's short deadline goes.
			c.untold.Store(false)
			c.writeDeadline = time.Time{}
		}
		switch {
		case serr == nil:
			u.pending.Add(1)
			err = c.readHeader(p, resp)
			u.pending.Add(-1)
		case c.answered.Load() && !c.interrupted.Load():
			// The sandbox answered before it took the whole body (a 413
			// from the head alone) and kept the connection, so the send
			// could have gone on until the client had sent it all, or, with
			// a sandbox that reads no more, until upstream.idle_timeout.
			// Its answer is relayed now, as nginx relays it, and the
			// connection, with the body half sent, is not reused. The
			// sandbox is told that no more of the body comes (its read
			// ends), so an answer it ends only with the body (a head sent
			// early, the rest after) ends too, rather than at
			// upstream.idle_timeout.
			if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
				_ = cw.CloseWrite()
			}
			u.pending.Add(1)
			err = c.readHeader(p, resp)
			u.pending.Add(-1)
			if err == nil {
				resp.Header.SetConnectionClose()
			}
		case !c.isWriteErr(serr):
			// Reading the client's body failed, not writing to the backend:
			// a malformed chunk, a timeout, a client gone.
			err = &clientBodyError{err: serr, gone: body != nil && body.gone}
		case isTimeout(serr):
			// A write waited upstream.idle_timeout: the sandbox took none
			// of the request (a VM paused mid-upload, an app that reads no
			// more), which its client is told, not that it was slow to
			// answer.
			err = &sendTimeoutError{err: serr}
		case !isTimeout(serr) && (!reused || !retryable):
			// A backend may answer before it has read the whole body (a
			// 413) and close: its answer is the one to relay, as net/http
			// does. The connection is not reused. A reused connection was
			// peeked just before the request when it cannot be re-sent, so
			// what is there answers it; one that can be re-sent is, on a
			// new connection, since what is there may be a stray answer
			// sent before the request (a 408 before closing).
			u.pending.Add(1)
			if c.readHeader(p, resp) == nil {
				resp.Header.SetConnectionClose()
				c.answered.Store(true)
				err = nil
			}
			u.pending.Add(-1)
		}
		gone := c.endClientWait()
		if err == nil && !gone {
			return c, nil
		}
		stale := reused && c.nread == 0 && isStaleConn(err)
		staleSince := c.idleSince
		cut := c.interrupted.Load()
		if cut && p.beforeCutEnd != nil {
			p.beforeCutEnd()
		}
		c.release(p, false)
		if gone {
			return nil, errClientLeft // not retried: nobody is waiting for it
		}
		if cut {
			return nil, c.cutErr() // not retried: the proxy is going away, or the sandbox is gone
		}
		if stale {
			// The sandbox dropped a connection it had kept alive, and the
			// peek before reuse could not tell: it was rolled back to a
			// snapshot (its kernel resets what comes on a connection
			// opened after it), its server restarted, or its idle timeout
			// closed it as the request went out. The pool's connections
			// idle at least as long (it reuses the newest first) are as
			// dead, and each would cost a request a 502 (a POST) or a
			// retry: after a rollback one request per pool pays, not one
			// per pooled connection.
			u.closeIdle(staleSince + 1)
		}
		if stale && attempt == 0 && retryable {
			p.metrics.UpstreamRetry()
			p.retried(x, &req.Header, CodeUpstreamReset, err, time.Time{})
			if p.beforeRetry != nil {
				p.beforeRetry()
			}
			continue
		}
		return nil, err
	}
}

// errAnsweredEarly stops the send of a request body the sandbox has
// answered already (earlyAnswer).
var errAnsweredEarly = errors.New("the sandbox answered before the request body was sent")

// earlyAnswer is the hangups watch on a sandbox connection while a request
// body is sent on it (roundTrip).
type earlyAnswer struct {
	c    *upstreamConn
	body *clientBody
}

// hangUp is told, under the hangups lock while roundTrip still watches,
// that the sandbox sent something (or closed) before the whole body was
// sent. A final answer that refuses the rest of the body (a status of 300
// or more, as curl stops its upload on) ends the send: the write to the
// sandbox, or the wait for the client's next bytes, is woken by a deadline
// now. A 2xx head waits for the end of the body, as before. Bytes that do
// not tell yet (an interim 100 or 103, a status line in pieces) leave it
// to the send to look again (writeUntold): the one-shot watch is spent,
// and armed again it would fire at once, and again, while they wait
// unread. Its write, which a sandbox that reads no more holds until
// upstream.idle_timeout, is woken to look within clientCheck.
func (a *earlyAnswer) hangUp() net.Conn {
	c := a.c
	switch c.answerWaiting() {
	case answerGoesOn:
		return nil
	case answerUntold:
		// Before the deadline, as answered below.
		c.untold.Store(true)
		_ = c.Conn.SetWriteDeadline(time.Now().Add(clientCheck))
		return nil
	}
	// Before the deadlines: Write and clientBody.Read look at it after
	// they set their own.
	c.answered.Store(true)
	now := time.Now()
	_ = c.Conn.SetWriteDeadline(now)
	if a.body != nil {
		_ = a.body.ctx.SetReadDeadline(now)
	}
	return nil
}

// answerSeen is what the bytes a sandbox sent while its request body was
// being sent say of that body (readAnswer).
type answerSeen uint8

const (
	answerGoesOn  answerSeen = iota // a 2xx head, or bytes no head begins with: the body goes on
	answerRefuses                   // a final head of 300 or more, a close or a reset: the send stops
	answerUntold                    // not known yet: a status line in pieces, or only interim heads so far
)

// readAnswer reads b, the first bytes a sandbox sent while its request
// body was being sent. Blank lines before a status line and spaces before
// the code are skipped, as fasthttp's parser skips them, and so are whole
// interim (1xx) heads: a 100 Continue or a 103 Early Hints may come
// before the refusal. More than maxInterim of them refuse the body:
// readHeader answers them with a 502.
func readAnswer(b []byte) answerSeen {
	const proto = "HTTP/1."
	for interim := 0; ; interim++ {
		if interim > maxInterim {
			return answerRefuses
		}
		b = bytes.TrimLeft(b, "\r\n")
		if len(b) < len("HTTP/1.1 ") {
			if strings.HasPrefix(proto, string(b[:min(len(b), len(proto))])) {
				return answerUntold
			}
			return answerGoesOn
		}
		if string(b[:len(proto)]) != proto || b[8] != ' ' {
			return answerGoesOn
		}
		code := bytes.TrimLeft(b[8:], " ")
		switch {
		case len(code) < 3:
			return answerUntold
		case !isDigit(code[0]) || !isDigit(code[1]) || !isDigit(code[2]):
			return answerGoesOn
		case code[0] >= '3':
			return answerRefuses
		case code[0] != '1' || string(code[:3]) == "101":
			return answerGoesOn
		}
		end := headEnd(b)
		if end < 0 {
			return answerUntold
		}
		b = b[end:]
	}
}

// headEnd returns the length of the head at the start of b, ended by a
// blank line (CRLF or a bare LF), or -1 when its end is not in b.
func headEnd(b []byte) int {
	end := -1
	for _, sep := range []string{"\n\r\n", "\n\n"} {
		if i := bytes.Index(b, []byte(sep)); i >= 0 && (end < 0 || i+len(sep) < end) {
			end = i + len(sep)
		}
	}
	return end
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

// clientBodyError is a failure to read the client's request body while
// sending it: the client's fault, not the sandbox's.
type clientBodyError struct {
	err error
	// gone: the client closed its connection before the end of the body
	// (clientBody.gone), rather than sending a malformed one.
	gone bool
}

func (e *clientBodyError) Error() string {
	return "reading the client's request body: " + e.err.Error()
}
func (e *clientBodyError) Unwrap() error { return e.err }

// sendTimeoutError is a write of the request to the sandbox that waited
// upstream.idle_timeout: the sandbox stopped reading it.
type sendTimeoutError struct{ err error }

func (e *sendTimeoutError) Error() string {
	return "the sandbox took none of the request for upstream.idle_timeout: " + e.err.Error()
}
func (e *sendTimeoutError) Unwrap() error { return e.err }

// isWriteErr reports whether err is a failed write to this connection
// (and not, say, a TLS client connection writing while it was read).
func (c *upstreamConn) isWriteErr(err error) bool {
	var oe *net.OpError
	return errors.As(err, &oe) && oe.Op == "write" && oe.Addr != nil && oe.Addr.String() == c.RemoteAddr().String()
}

func isIdempotent(method []byte) bool {
	switch string(method) {
	case "GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE":
		return true
	}
	return false
}

// isStaleConn reports whether err means the backend had closed the
// connection before reading the request: a reset or EOF, not a timeout.
func isStaleConn(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, net.ErrClosed) || isConnReset(err)
}

// writerPool holds the writers requests are sent through; a connection
// holds one only while it writes a request head and body.
var writerPool = sync.Pool{New: func() any { return bufio.NewWriterSize(nil, 4<<10) }}

// send writes the request (head and body) to the backend. body is req's
// streamed body, if it has one: it sends each piece on at once through
// the writer (see uploadWriter).
func (c *upstreamConn) send(req *fasthttp.Request, body *clientBody) error {
	bw := writerPool.Get().(*bufio.Writer)
	bw.Reset(c)
	if body != nil {
		body.bw = bw
	}
	err := req.Write(bw)
	if body != nil {
		// Not released yet: forward has still to count it (bytesRead).
		body.bw = nil
	}
	if err == nil {
		err = bw.Flush()
	}
	bw.Reset(nil)
	writerPool.Put(bw)
	return err
}

// maxInterim bounds the 1xx responses skipped before the final one.
const maxInterim = 8

// readHeader reads the final response head into resp, skipping interim
// (1xx) responses, and switches the connection to body deadlines.
func (c *upstreamConn) readHeader(p *Proxy, resp *fasthttp.Response) error {
	if c.br == nil {
		c.br = p.acquireReader(c)
	}
	h := &resp.Header
	c.manyLines = false
	for i := 0; ; i++ {
		if err := c.readHead(h); err != nil {
			return err
		}
		if sc := h.StatusCode(); sc < 100 {
			// fasthttp takes any three digits; relayed, "099" would go
			// out as "HTTP/1.1 99", a status line no client can parse.
			return fmt.Errorf("invalid response status code %d", sc)
		} else if sc > 199 || sc == fasthttp.StatusSwitchingProtocols {
			break
		}
		if i == maxInterim {
			return fmt.Errorf("more than %d interim responses", maxInterim)
		}
	}
	c.inBody = true
	// Read here, before removeHopResponse drops the field from the answer.
	c.reuseWithin = int64(keepAliveReuse(h.Peek(fasthttp.HeaderKeepAlive)))
	return nil
}

// maxKeepAliveHint bounds the Keep-Alive timeout hint taken, in digits:
// a longer one (over 11 days) is junk, and upstream.idle_conn_timeout
// ends the connection long before anyway.
const maxKeepAliveHint = 6

// keepAliveReuse returns how long a connection whose last answer carried
// the Keep-Alive field v may stay idle and still be reused, or 0 for no
// limit of its own (no hint, or one that is not a positive number of
// seconds). A sandbox server that announces "timeout=N" closes the idle
// connection after N seconds (Node's http.Server: 5 s), and a request sent
// in the moment it does was reset: a POST, which is not re-sent, got a
// 502. The margin before N is undici's (keepAliveTimeoutThreshold, 1 s),
// or half of N when N is that short. Parameters are matched as RFC 9110
// 5.6.6 writes them ("timeout=5, max=100"), tolerating spaces, any case
// and a quoted number; nothing is allocated (the request path runs it).
func keepAliveReuse(v []byte) time.Duration {
	for len(v) > 0 {
		var param []byte
		param, v = nextToken(v)
		eq := bytes.IndexByte(param, '=')
		if eq < 0 || !bytes.EqualFold(bytes.Trim(param[:eq], " \t"), []byte("timeout")) {
			continue
		}
		num := bytes.Trim(param[eq+1:], " \t")
		if len(num) >= 2 && num[0] == '"' && num[len(num)-1] == '"' {
			num = num[1 : len(num)-1]
		}
		if len(num) == 0 || len(num) > maxKeepAliveHint {
			return 0
		}
		secs := 0
		for _, b := range num {
			if b < '0' || b > '9' {
				return 0
			}
			secs = secs*10 + int(b-'0')
		}
		n := time.Duration(secs) * time.Second
		return n - min(time.Second, n/2)
	}
	return 0
}

// errNoWait is upstreamConn.Read's answer while readHead has it report
// "nothing buffered" instead of waiting for the backend.
var errNoWait = errors.New("no buffered bytes")

// readHead reads one response head into h. fasthttp's parser takes a bare
// LF for a line end, but ends the head only at a CRLF CRLF (a defence for
// requests, which another server might frame differently) and otherwise
// waits for more: a sandbox that ends its head with a bare-LF blank line
// (a hand-written socket server, printf into nc) got a 504 after
// upstream.response_header_timeout, or a 502 "closed before answering".
// nginx accepts such heads, as RFC 9112 2.2 allows, and here the proxy is
// the only one to frame them (the client gets a head the proxy writes).
//
// fasthttp parses what is buffered first; only when it wants more than
// that does readHead look for a bare-LF head, so a well-formed one costs
// nothing more.
//
// Each parse is of every byte buffered, so a head that trickles in is
// parsed again only when the bytes that came may end it (headWait):
// parsed at every piece, a 16 KiB head sent a byte at a time cost ≈ 0.8 s
// of CPU, and one of upstream.max_header_size's largest, 1 MiB, hours.
func (c *upstreamConn) readHead(h *fasthttp.ResponseHeader) error {
	if _, err := c.br.Peek(1); err != nil {
		return h.Read(c.br) // fasthttp's own error for a close or a timeout
	}
	var w headWait
	for {
		// fasthttp parses a head only once it is all buffered, and never
		// reads while noWait is set: a head it takes is at the start of
		// these bytes.
		b, _ := c.br.Peek(c.br.Buffered())
		if !w.mayEnd(b) && len(b) < c.br.Size() {
			if _, err := c.br.Peek(len(b) + 1); err != nil {
				return h.Read(c.br)
			}
			continue
		}
		c.noWait, c.starved = true, false
		err := h.Read(c.br)
		c.noWait = false
		if err == nil {
			if err := checkStatus(h, b); err != nil {
				return err
			}
			// What h.Read consumed of b is the head.
			head := b[:len(b)-c.br.Buffered()]
			c.noteLines(head)
			return checkFraming(h, head)
		}
		// A full buffer wants more too: fasthttp then asks for more than
		// it can hold without reading (bufio.ErrBufferFull), which a
		// bare-LF head sent with a large body in one write does.
		if !c.starved && c.br.Buffered() < c.br.Size() {
			return err
		}
		b, _ = c.br.Peek(c.br.Buffered())
		if end := bareLFHeadEnd(b); end > 0 {
			return c.readBareLFHead(h, b[:end])
		}
		if len(b) == c.br.Size() {
			return h.Read(c.br) // fasthttp's error for a head over the buffer
		}
		// Wait for more; a close or a timeout gets fasthttp's own error.
		if _, err := c.br.Peek(len(b) + 1); err != nil {
			return h.Read(c.br)
		}
	}
}

// headWait follows the bytes of a response head as they arrive, for
// readHead: each is looked at once.
type headWait struct {
	seen   int  // bytes looked at
	looked bool // mayEnd has run
	begun  bool // the status line has begun (fasthttp skips blank lines before it), at start
	start  int
	lined  bool // the status line has ended
}

// mayEnd reports whether b, the bytes buffered so far (which start with
// those seen before), may hold what a parse would act on: anything on the
// first look; then the status line's end, which fasthttp checks as soon as
// it is whole, and a blank line's start behind it, "\n\n" or "\n\r\n",
// which every head end holds (fasthttp's CRLF CRLF, and a bare-LF one).
func (w *headWait) mayEnd(b []byte) bool {
	old, first := w.seen, !w.looked
	w.seen, w.looked = len(b), true
	if !w.begun {
		i := old
		for i < len(b) && (b[i] == '\r' || b[i] == '\n') {
			i++
		}
		if i == len(b) {
			return first
		}
		w.begun, w.start = true, i
	}
	from := max(old-2, w.start) // a blank line's start may span the last look
	if !w.lined {
		if bytes.IndexByte(b[from:], '\n') < 0 {
			return first
		}
		w.lined = true
		return true
	}
	for rest := b[from:]; ; {
		i := bytes.IndexByte(rest, '\n')
		if i < 0 {
			return false
		}
		rest = rest[i+1:]
		if len(rest) > 0 && rest[0] == '\n' || len(rest) > 1 && rest[0] == '\r' && rest[1] == '\n' {
			return true
		}
	}
}

// bareLFHeadEnd returns the length of the head at the start of b when its
// blank line is a bare LF ("\n\n", or "\n\r\n" after a bare-LF line), or
// 0 when b holds no such head.
func bareLFHeadEnd(b []byte) int {
	// fasthttp skips blank lines before the status line: so does the
	// search, or one that came in a read of its own ("\n", then the head)
	// would be taken for the end of an empty head.
	i := 0
	for {
		if i < len(b) && b[i] == '\n' {
			i++
		} else if i+1 < len(b) && b[i] == '\r' && b[i+1] == '\n' {
			i += 2
		} else {
			break
		}
	}
	for i+1 < len(b) {
		j := bytes.IndexByte(b[i:], '\n')
		if j < 0 {
			return 0
		}
		i += j + 1
		bare := j == 0 || b[i-2] != '\r'
		switch {
		case i < len(b) && b[i] == '\n':
			return i + 1
		case bare && i+1 < len(b) && b[i] == '\r' && b[i+1] == '\n':
			return i + 2
		case !bare && i+1 < len(b) && b[i] == '\r' && b[i+1] == '\n':
			return 0 // a CRLF CRLF: fasthttp's to parse
		}
	}
	return 0
}

// noteLines sets manyLines if head, a response head, has more than
// keptHeadLines lines.
func (c *upstreamConn) noteLines(head []byte) {
	if len(head) > keptHeadLines*4 && bytes.Count(head, []byte{'\n'}) > keptHeadLines {
		c.manyLines = true
	}
}

// readBareLFHead parses head, a bare-LF response head at the start of c.br,
// with its line ends made CRLF, and consumes it. A rare path: it allocates.
func (c *upstreamConn) readBareLFHead(h *fasthttp.ResponseHeader, head []byte) error {
	fixed := make([]byte, 0, len(head)+bytes.Count(head, []byte{'\n'}))
	for i, ch := range head {
		if ch == '\n' && (i == 0 || head[i-1] != '\r') {
			fixed = append(fixed, '\r')
		}
		fixed = append(fixed, ch)
	}
	n := len(head)
	c.noteLines(head)
	if err := h.Read(bufio.NewReaderSize(bytes.NewReader(fixed), len(fixed))); err != nil {
		return err
	}
	if err := checkStatus(h, fixed); err != nil {
		return err
	}
	if err := checkFraming(h, fixed); err != nil {
		return err
	}
	_, err := c.br.Discard(n)
	return err
}

// checkStatus refuses a head fasthttp parsed from raw whose status code is
// 000: fasthttp stores it as 0 and reports 0 as 200, so the client would
// get a 200 the sandbox never sent. Only a 200 is looked at, in place.
func checkStatus(h *fasthttp.ResponseHeader, raw []byte) error {
	if h.StatusCode() != fasthttp.StatusOK {
		return nil
	}
	// fasthttp skips blank lines before the status line, and spaces
	// before the code.
	raw = bytes.TrimLeft(raw, "\r\n")
	if i := bytes.IndexByte(raw, ' '); i >= 0 {
		raw = bytes.TrimLeft(raw[i:], " ")
	}
	if len(raw) >= 3 && string(raw[:3]) == "000" {
		return errors.New("invalid response status code 000")
	}
	return nil
}

// errLengthAndChunked is an answer framed both by Content-Length and by
// chunked coding.
var errLengthAndChunked = errors.New("response has both Content-Length and Transfer-Encoding")

// checkFraming refuses head, a response head as received, that frames its
// body both by Content-Length and by chunked coding. fasthttp takes the
// chunked coding and drops the Content-Length without a word, and the
// connection would be reused wherever the sandbox's own idea of the
// framing left it; RFC 9112 6.3 calls such a message a possible response
// splitting attempt, and newer nginx refuses it ("upstream sent
// Content-Length and Transfer-Encoding headers at the same time", 502;
// Debian 12's 1.22 still decodes it). Only a final
// chunked head is looked at, and only its field names: a 101's framing
// fields frame nothing (the tunnel's bytes follow) and are removed anyway.
func checkFraming(h *fasthttp.ResponseHeader, head []byte) error {
	if !h.IsHTTP11() {
		if err := frameHTTP10Chunked(h, head); err != nil {
			return err
		}
	}
	if h.ContentLength() != -1 || h.StatusCode() < 200 {
		return nil
	}
	const name = "content-length"
	for {
		i := bytes.IndexByte(head, '\n')
		if i < 0 {
			return nil
		}
		head = head[i+1:] // the status line is skipped
		if len(head) > len(name) && bytes.EqualFold(head[:len(name)], []byte(name)) {
			// fasthttp takes "Content-Length :" for the field too.
			if rest := bytes.TrimLeft(head[len(name):], " \t"); len(rest) > 0 && rest[0] == ':' {
				return errLengthAndChunked
			}
		}
	}
}

// errHTTP10TransferEncodings is an HTTP/1.0 answer with more than one
// Transfer-Encoding line, refused as fasthttp refuses an HTTP/1.1 one.
var errHTTP10TransferEncodings = errors.New("response has more than one Transfer-Encoding line")

// frameHTTP10Chunked frames by chunked coding an HTTP/1.0 answer whose head,
// as received, says "Transfer-Encoding: chunked", and marks its connection
// to be closed after it. fasthttp ignores the field on an HTTP/1.0 message
// (as Go's net/http does), so the chunk sizes reached the client as body
// bytes, where nginx decodes them, as curl, Python and Node do when they
// talk to the sandbox directly: Python's http.server answers HTTP/1.0
// unless told otherwise, and a handler that chunks its own output sends
// just this. Another coding is left to fasthttp, which frames the body by
// its Content-Length or else by the connection's close, as nginx 1.22
// does. Either way the connection is closed after the answer: RFC 9112
// 6.1 has a recipient of an HTTP/1.0 message with Transfer-Encoding treat
// its framing as faulty, even beside a Content-Length, and close (an
// answer "Connection: keep-alive", gzip and sized, whose sandbox framed it
// otherwise, left the rest of its body to be read as the next request's
// answer; nginx closes after every HTTP/1.0 answer). A folded line's value
// is not read: fasthttp rewrites the head's bytes in place when it joins
// a fold, so the line counts as another coding. A 204 or a 304 frames no
// body, but its connection is closed all the same (a sandbox that chunked
// it may send the last chunk after it).
func frameHTTP10Chunked(h *fasthttp.ResponseHeader, head []byte) error {
	sc := h.StatusCode()
	if sc < 200 {
		return nil
	}
	const name = "transfer-encoding"
	lines, chunked := 0, false
	for {
		i := bytes.IndexByte(head, '\n')
		if i < 0 {
			break
		}
		head = head[i+1:] // the status line is skipped
		if len(head) <= len(name) || !bytes.EqualFold(head[:len(name)], []byte(name)) {
			continue
		}
		// fasthttp takes "Transfer-Encoding :" for the field too.
		rest := bytes.TrimLeft(head[len(name):], " \t")
		if len(rest) == 0 || rest[0] != ':' {
			continue
		}
		lines++
		v := rest[1:]
		if j := bytes.IndexByte(v, '\n'); j >= 0 {
			v = v[:j]
		}
		chunked = bytes.EqualFold(bytes.Trim(v, " \t\r"), []byte("chunked"))
	}
	if lines > 0 {
		h.SetConnectionClose()
	}
	if sc == fasthttp.StatusNoContent || sc == fasthttp.StatusNotModified {
		return nil
	}
	if lines > 1 {
		return errHTTP10TransferEncodings
	}
	if chunked {
		h.SetContentLength(-1)
	}
	return nil
}

// release ends an exchange: the connection goes back to the pool when
// reuse is true and it holds nothing unread, else it is closed. Its reader
// goes back to the proxy's pool either way.
func (c *upstreamConn) release(p *Proxy, reuse bool) {
	if c.br != nil {
		if c.br.Buffered() > 0 {
			reuse = false // bytes past the response: the framing is lost
		}
		p.releaseReader(c.br)
		c.br = nil
	}
	c.heartbeat = time.Time{}
	if reuse && !c.interrupted.Load() {
		c.pool.put(c)
		return
	}
	c.pool.dropBusy(c)
}

func (p *Proxy) acquireReader(c *upstreamConn) *bufio.Reader {
	p.readersOut.Add(1)
	if br, ok := p.readers.Get().(*bufio.Reader); ok {
		br.Reset(c)
		return br
	}
	return bufio.NewReaderSize(c, p.cfg.UpstreamReadBufferSize)
}

func (p *Proxy) releaseReader(br *bufio.Reader) {
	p.readersOut.Add(-1)
	br.Reset(nil)
	p.readers.Put(br)
}

// dialError marks a failure to connect, as opposed to a failure on an
// established connection: the client gets 502 upstream_connect_failed.
type dialError struct {
	addr string
	err  error
	// first is the connect dial retried, when it did: this error is the
	// retry's.
	first *failedConnect
}

// failedConnect is a connect that failed and that dial retried: the
// request's span counts the retry, and tracing ends the failed attempt's
// client span when it failed (connectRetry).
type failedConnect struct {
	err error
	at  time.Time
}

func (e *dialError) Error() string { return fmt.Sprintf("connect %s: %v", e.addr, e.err) }
func (e *dialError) Unwrap() error { return e.err }

// dial connects to a backend with the connect timeout and retries once when
// the connect itself fails. client is the connection of the request it is
// for (nil: none): a client that left during a slow connect (a frozen
// sandbox, which answers no SYN) ends it as errClientLeft, as nginx ends
// one on EPOLLRDHUP, rather than have its request sent, a POST too, to a
// sandbox that thawed meanwhile, up to two connect timeouts after the
// client gave up (an agent that gave up has retried the call already).
func (p *Proxy) dial(addr string, client net.Conn) (*upstreamConn, error) {
	// No TCP keep-alive probes (Go's default sends them after 15 s idle):
	// a paused sandbox's VM acknowledges none, and the kernel aborted its
	// connections about 150 s into the pause, streams the proxy keeps
	// across a pause included. nginx sets none on upstream connections
	// either (proxy_socket_keepalive off); a dead sandbox is found by the
	// proxy's own timeouts, or a kill.
	d := net.Dialer{KeepAlive: -1}
	start := time.Now()
	c, err := d.DialContext(p.pools.connectCtx(start), "tcp", addr)
	if err != nil && resourceExhausted(err) && !p.pools.aborted.Load() && p.pools.shedIdle(shedOnShortage) > 0 {
		c, err = d.DialContext(p.pools.connectCtx(time.Now()), "tcp", addr)
	}
	var first *failedConnect
	if err != nil && !dialShortage(err) && !p.pools.aborted.Load() {
		// As after a connect that worked, only once it took clientCheck
		// (a frozen sandbox's timeout): one refused at once is retried at
		// once, and a client that half-closed after its request (an
		// HTTP/1.0 tool, a health check) is still waiting for the answer,
		// as the answer's wait treats it within clientCheck.
		if client != nil && time.Since(start) >= clientCheck && clientHungUp(client) {
			p.metrics.UpstreamConnectError() // the connect made did fail
			return nil, errClientLeft
		}
		p.metrics.UpstreamRetry()
		now := time.Now()
		first = &failedConnect{err: err, at: now}
		c, err = d.DialContext(p.pools.connectCtx(now), "tcp", addr)
	}
	if err != nil && p.pools.aborted.Load() {
		return nil, errDrainCut // the sandbox is not to blame
	}
	if err != nil {
		// The proxy out of descriptors or local ports is no failure of the
		// sandbox's: counted apart, and not retried (it would fail the same
		// way).
		if dialShortage(err) {
			p.metrics.UpstreamResourceError()
		} else {
			p.metrics.UpstreamConnectError()
		}
		// A client that left during the retry is a 499 as one that left
		// before it: the log must not blame the sandbox for a request
		// nobody waits for.
		if first != nil && client != nil && time.Since(first.at) >= clientCheck && clientHungUp(client) {
			err = errClientLeft
		}
		return nil, &dialError{addr: addr, err: err, first: first}
	}
	if p.dialedSelf(c) {
		_ = c.Close()
		return nil, errProxyLoop
	}
	// Only after a connect as long as the wait for an answer that has the
	// client watched (clientCheck): a prompt one pays no look.
	if client != nil && time.Since(start) >= clientCheck && clientHungUp(client) {
		_ = c.Close()
		if first != nil {
			// The retry made is in the access log (connectRetry), as in
			// the metrics.
			return nil, &dialError{addr: addr, err: errClientLeft, first: first}
		}
		return nil, errClientLeft
	}
	// Go sets TCP_NODELAY on every new TCPConn already: a second
	// setsockopt per new sandbox connection is a measurable cost in cold
	// starts.
	uc := &upstreamConn{Conn: c, headerTimeout: p.cfg.ResponseHeaderTimeout, idleTimeout: p.cfg.IdleStreamTimeout, firstConnect: first, hups: p.hangups}
	uc.answer.c = uc
	return uc, nil
}

// connectCtx is the context of one connect begun at now: dialCtx, bounded
// by connect_timeout.
func (ps *pools) connectCtx(now time.Time) context.Context {
	return &deadlineCtx{Context: ps.dialCtx, deadline: now.Add(ps.cfg.ConnectTimeout)}
}

// deadlineCtx is its Context with a deadline that no timer enforces: a
// connect under a context that already has its deadline hands it to the
// poller as the socket's write deadline (net's netFD.connect), and
// net.Dialer makes no context of its own. Its Timeout made one per new
// sandbox connection (a context, a timer, a channel, and an entry in
// dialCtx's children beside the one net's cancel watch still adds):
// ≈ 600 B of garbage, an eighth of a cold lookup's. A cancel of dialCtx
// (abort) still ends the connect at once.
type deadlineCtx struct {
	context.Context
	deadline time.Time
}

// Deadline implements context.Context.
func (c *deadlineCtx) Deadline() (time.Time, bool) { return c.deadline, true }

// errProxyLoop is a sandbox connection that reached one of the proxy's own
// listeners: the route names the proxy itself.
var errProxyLoop = errors.New("the route's address is one of the proxy's own listeners")

// addListener records addr as one of this process's listeners, once
// (Server.Claim and Serve both record it).
func (p *Proxy) addListener(addr net.Addr) {
	ta, ok := addr.(*net.TCPAddr)
	if !ok {
		return
	}
	ap := ta.AddrPort()
	ap = netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
	p.listenersMu.Lock()
	defer p.listenersMu.Unlock()
	var own []netip.AddrPort
	if cur := p.listeners.Load(); cur != nil {
		if slices.Contains(*cur, ap) {
			return
		}
		own = append(own, *cur...)
	}
	own = append(own, ap)
	p.listeners.Store(&own)
}

// dialedSelf reports whether c, just connected, reached one of this
// process's own listeners. A route that names the proxy (a host port mapped
// onto the proxy's, this node's IP with the proxy's port) sent each request
// back in, to be routed again, once per pool slot: a thousand hops, each
// with two descriptors and a log line, ending in a 503 that said to retry.
// A listener on a wildcard address takes every local address, and a
// connection to a local address has it as its source too (loopback ones
// come from 127.0.0.1 or ::1). A loop through address translation (a
// container's published port) is not seen here.
func (p *Proxy) dialedSelf(c net.Conn) bool {
	own := p.listeners.Load()
	if own == nil {
		return false
	}
	ra, ok := c.RemoteAddr().(*net.TCPAddr)
	la, ok2 := c.LocalAddr().(*net.TCPAddr)
	if !ok || !ok2 {
		return false
	}
	remote := ra.AddrPort()
	rip := remote.Addr().Unmap()
	local := rip.IsLoopback() || rip == la.AddrPort().Addr().Unmap()
	for _, l := range *own {
		if l.Port() != remote.Port() {
			continue
		}
		if (l.Addr().IsUnspecified() && local) || l.Addr() == rip {
			return true
		}
	}
	return false
}

// connectRetry takes the connect that dial retried to get c, or to fail
// with err, nil when there was none. It is taken once: a reused
// connection's retry belonged to the request that dialed it.
func connectRetry(c *upstreamConn, err error) *failedConnect {
	if c != nil && c.firstConnect != nil {
		first := c.firstConnect
		c.firstConnect = nil
		return first
	}
	if err != nil {
		// Declared here: errors.As makes de escape, and a request that got
		// a connection must not pay that allocation.
		var de *dialError
		if errors.As(err, &de) {
			return de.first
		}
	}
	return nil
}

// connectErrCode is the proxy's error code for a failed connect (err not
// the proxy's own shortage, which dial does not retry), as upstreamError
// answers it.
func connectErrCode(err error) string {
	if isTimeout(err) {
		return CodeUpstreamConnectTimeout
	}
	return CodeUpstreamConnect
}

// dialShortage reports a failed dial that is the proxy's own shortage:
// descriptors or buffers (resourceExhausted), or local ports
// (EADDRNOTAVAIL: every ephemeral port towards that address is taken, by
// open connections or ones in TIME_WAIT).
func dialShortage(err error) bool {
	return resourceExhausted(err) || errors.Is(err, syscall.EADDRNOTAVAIL)
}

// errHeartbeatDue is returned by upstreamConn.Read when the heartbeat
// deadline passed with no data. It is recoverable: the connection and the
// HTTP framing are intact (no byte was consumed), the stream simply has not
// spoken for a while.
var errHeartbeatDue = errors.New("heartbeat due")

// upstreamConn wraps a backend connection with the deadlines a streaming
// proxy needs: a response-header timeout measured from the last byte
// written, an idle timeout between body reads (a stream may last hours but
// not be silent for hours), and an optional heartbeat deadline for silent
// SSE streams.
type upstreamConn struct {
	net.Conn
	pool          *upstream // nil for a WebSocket tunnel's connection
	br            *bufio.Reader
	headerTimeout time.Duration
	idleTimeout   time.Duration
	idleSince     int64 // unix nanos, while in the idle list
	// reuseWithin is how long c may sit idle and still be reused (nanos;
	// 0: up to upstream.idle_conn_timeout), from the Keep-Alive timeout
	// hint of the sandbox's last answer (keepAliveReuse).
	reuseWithin int64

	nread int64 // bytes read since the current request was sent

	firstConnect *failedConnect // its connect needed dial's retry; see connectRetry

	// interrupted is set when the proxy closes the connection under a
	// stream or a request: drain, a kill (killed set too), or the client
	// left (bodyStream.hangUp, upstreamConn.hangUp).
	interrupted atomic.Bool
	killed      atomic.Bool
	// changed: a route change cut the exchange (rejudge): cutMoved or
	// cutRevoked, with interrupted set too.
	changed atomic.Uint32
	// grant is what the exchange on c was let through on (under pool.mu:
	// set at checkout, read and refreshed by rejudge).
	grant grant

	// While a large request body is sent (roundTrip): the watch for the
	// sandbox's answer (hangups.watchReadable), and whether one came that
	// ends the send (earlyAnswer.hangUp; also set when the sandbox's answer
	// was read after a failed write).
	answer    earlyAnswer
	answerKey uint64
	answered  atomic.Bool
	// untold: the sandbox sent bytes that do not tell yet whether they
	// refuse the body; the send looks at them again (writeUntold).
	untold atomic.Bool

	// The pool's busy list (under pool.mu) while checked out.
	busyPrev, busyNext *upstreamConn
	// upload is the streamed client body being sent (under pool.mu).
	upload *clientBody

	// For waitReadable (detached SSE streams), set on first use.
	raw     syscall.RawConn
	peekFn  func(fd uintptr) bool
	peekErr error
	peekBuf [1]byte

	// client is the request's client while the answer's head is awaited,
	// or while a streamed body that is not an event stream is sent (nil
	// otherwise): its socket is looked at clientCheck after the request
	// (or the body's start), at checkAt, and then watched by hups (hupKey)
	// or, where it cannot be, looked at every clientCheck. The watch tells
	// hupTo (the body's stream) or, when that is nil, c; clientGone is set
	// when c was found closed, by hangUp from the watch's goroutine.
	client     net.Conn
	hupTo      hangUpper
	checkAt    time.Time
	checking   bool // armRead armed checkAt, not a timeout
	clientGone atomic.Bool
	hups       *hangups
	hupKey     uint64

	// slowBody: the request being sent has a body that may take long to
	// send (roundTrip's watchAnswer); a write of it that waits clientCheck
	// has the client watched (writeWatched).
	slowBody bool

	// For idleOK (reuse of a keep-alive connection).
	checkFn  func(fd uintptr)
	idleGood bool

	// For answerWaiting: its callback, the buffer it peeks into and what
	// it saw. Fields, not a closure's variables, which cost allocations
	// each time a sandbox answered while its request body was being sent.
	answerFn   func(fd uintptr)
	answerBuf  []byte
	answerN    int
	answerStop bool

	// manyLines: the answer's head (or an interim one before it) had more
	// than keptHeadLines lines; see headDrop.
	manyLines bool

	// Only one goroutine uses the connection at a time (the exchange that
	// acquired it), so these fields need no lock.
	inBody         bool
	noWait         bool // Read reports errNoWait instead of reading (readHead)
	starved        bool // a Read found noWait set
	headerDeadline time.Time
	heartbeat      time.Time // zero = no heartbeat pending
	heartbeatSlack time.Duration
	idleDeadline   time.Time // body wait's idle deadline; zero = none since the backend last sent a byte
	readDeadline   time.Time // last deadline set on the socket
	writeDeadline  time.Time
}

// Write starts (or continues) a request: the header deadline counts from
// the last byte sent, so a long upload does not eat into it.
func (c *upstreamConn) Write(b []byte) (int, error) {
	now := time.Now()
	c.inBody = false
	c.heartbeat = time.Time{}
	c.idleDeadline = time.Time{}
	c.headerDeadline = time.Time{}
	if c.headerTimeout > 0 {
		c.headerDeadline = now.Add(c.headerTimeout)
	}
	if c.client != nil {
		c.checkAt = now.Add(clientCheck)
	}
	watch := c.slowBody && c.client != nil && c.hupKey == 0
	if watch {
		c.writeDeadline = setDeadline(c.Conn, false, c.writeDeadline, now.Add(clientCheck), slack(clientCheck))
	} else if c.idleTimeout > 0 {
		c.writeDeadline = setDeadline(c.Conn, false, c.writeDeadline, now.Add(c.idleTimeout), slack(c.idleTimeout))
	}
	if c.answered.Load() {
		// After the deadline above: earlyAnswer's, set after answered, wins.
		return 0, errAnsweredEarly
	}
	if c.untold.Load() {
		return c.writeUntold(b)
	}
	n, err := c.Conn.Write(b)
	if watch && err != nil && isTimeout(err) && !c.answered.Load() && !c.untold.Load() {
		m, werr := c.writeWatched(b[n:], now)
		n, err = n+m, werr
	}
	if err != nil && isTimeout(err) && c.untold.Load() {
		// The watch found untold bytes while this write was under way
		// (blocked on a sandbox that reads no more): its short deadline
		// is what ended the write, not a timeout of the sandbox's.
		m, err := c.writeUntold(b[n:])
		return n + m, err
	}
	return n, err
}

// writeWatched goes on with a write of a request body that has waited
// clientCheck (since start) on a sandbox that reads slowly, or no more (a
// stuck or busy app): from now on the client's socket is watched, as it is
// while the answer's head is awaited (checkClient), so a client that leaves
// ends the exchange at once (499), as the platform's nginx ends it ("client
// prematurely closed connection ... while sending request to upstream").
// Without the watch the write held the departed client's socket, the
// sandbox's connection and the request's max_streams_per_sandbox slot
// until upstream.idle_timeout (7206 s). The write still gives up at
// upstream.idle_timeout from start.
func (c *upstreamConn) writeWatched(b []byte, start time.Time) (int, error) {
	var end time.Time
	if c.idleTimeout > 0 {
		end = start.Add(c.idleTimeout)
	}
	n := 0
	for {
		c.writeDeadline = time.Time{} // expired: the next one is set whatever it is
		if err := c.checkClient(); err != nil {
			return n, err
		}
		d := end
		if c.hupKey == 0 {
			// Not watched (no descriptor): looked at again in clientCheck.
			d = c.checkAt
			if !end.IsZero() && end.Before(d) {
				d = end
			}
		}
		c.writeDeadline = d
		_ = c.Conn.SetWriteDeadline(d)
		// earlyAnswer's deadline, set after answered or untold, may have
		// been undone above.
		if c.answered.Load() {
			return n, errAnsweredEarly
		}
		if c.untold.Load() {
			m, err := c.writeUntold(b[n:])
			return n + m, err
		}
		m, err := c.Conn.Write(b[n:])
		n += m
		// A timeout with untold set is Write's to hand on (writeUntold).
		if err == nil || !isTimeout(err) || c.hupKey != 0 || c.answered.Load() || c.untold.Load() ||
			!end.IsZero() && !time.Now().Before(end) {
			return n, err
		}
	}
}

// writeUntold is Write while the sandbox has sent bytes that do not tell
// yet whether it refuses the body (earlyAnswer.hangUp): they are looked at
// again before the write and every clientCheck while it waits, since a
// sandbox that sent its refusal behind them may read no more, and the
// client would wait upstream.idle_timeout for the answer that came.
func (c *upstreamConn) writeUntold(b []byte) (int, error) {
	var end time.Time
	if c.idleTimeout > 0 {
		end = time.Now().Add(c.idleTimeout)
	}
	n := 0
	for {
		switch c.answerWaiting() {
		case answerRefuses:
			c.answered.Store(true)
			return n, errAnsweredEarly
		case answerGoesOn:
			c.untold.Store(false)
			if c.slowBody && c.client != nil && c.hupKey == 0 {
				m, err := c.writeWatched(b[n:], time.Now())
				return n + m, err
			}
			c.writeDeadline = end
			_ = c.Conn.SetWriteDeadline(end)
			m, err := c.Conn.Write(b[n:])
			return n + m, err
		}
		d := time.Now().Add(clientCheck)
		if !end.IsZero() && end.Before(d) {
			d = end
		}
		c.writeDeadline = d
		_ = c.Conn.SetWriteDeadline(d)
		m, err := c.Conn.Write(b[n:])
		n += m
		if err == nil || !isTimeout(err) || !end.IsZero() && !time.Now().Before(end) {
			return n, err
		}
		if c.slowBody && c.client != nil && c.hupKey == 0 {
			// The client is watched from now on, as in writeWatched.
			c.writeDeadline = time.Time{}
			if err := c.checkClient(); err != nil {
				return n, err
			}
		}
	}
}

func (c *upstreamConn) Read(b []byte) (int, error) {
	if c.noWait {
		c.starved = true
		return 0, errNoWait
	}
	for {
		hb := c.armRead()
		n, err := c.Conn.Read(b)
		if n == 0 && err == io.EOF && c.interrupted.Load() {
			return 0, errInterrupted // wake's end of input, not the sandbox's
		}
		c.nread += int64(n)
		if n > 0 {
			c.idleDeadline = time.Time{} // the backend spoke: the next wait counts afresh
		}
		if err == nil || n > 0 || !errors.Is(err, os.ErrDeadlineExceeded) {
			return n, err
		}
		switch {
		case hb:
			c.heartbeatFired()
			return 0, errHeartbeatDue
		case c.checking:
			if err := c.checkClient(); err != nil {
				return 0, err
			}
		default:
			return n, err
		}
	}
}

// checkClient follows a wait that ended at the client check (armRead's
// checking): the sandbox is still working on the answer, or the body is
// silent. Is anybody still waiting for it? From now on the watch tells at
// once (it reports a client already gone too), at the cost of two
// epoll_ctl calls that an exchange within clientCheck never pays. Where the
// client cannot be watched, its socket is looked at now and every
// clientCheck: errClientLeft when it is gone.
func (c *upstreamConn) checkClient() error {
	c.readDeadline = time.Time{} // expired: the next one is set whatever it is
	to := c.hupTo
	if to == nil {
		to = c // the head is awaited: the exchange ends
	}
	if c.hupKey = c.hups.watch(c.client, to); c.hupKey != 0 {
		return nil
	}
	if clientHungUp(c.client) {
		shut(to.hangUp()) // as the watch would have
		return errClientLeft
	}
	c.checkAt = time.Now().Add(clientCheck)
	return nil
}

// clientCheck is how long a request waits for the head of its answer
// before its client's socket is watched for a hang-up (or, where it cannot
// be watched, how often the socket is looked at). A client that left (an
// agent cancelling a long tool call, an HTTP client's own timeout) ends the
// request: the sandbox's connection closes, so its server can stop the
// work, and the request's max_streams_per_sandbox slot is free again, as
// nginx ends such a request (499) on EPOLLRDHUP. A request answered within
// clientCheck costs nothing more: the check is the deadline its read has
// anyway.
const clientCheck = 100 * time.Millisecond

// hangUp is called by hups (under its lock, so the watch cannot end
// meanwhile) when the client left while the answer's head was awaited: it
// returns the connection to shut, which unblocks the pending read, and the
// exchange ends as errClientLeft.
func (c *upstreamConn) hangUp() net.Conn {
	c.clientGone.Store(true)
	c.interrupted.Store(true) // never pooled: closed under the exchange
	return c.Conn
}

// endClientWait ends the client's watch once the answer's head is in (or
// the exchange failed) and reports whether the client left meanwhile: then
// the connection is closed, whatever the read made of it.
func (c *upstreamConn) endClientWait() (gone bool) {
	c.hups.unwatch(c.hupKey)
	c.hupKey = 0
	c.client = nil
	c.hupTo = nil
	return c.clientGone.Load()
}

// watchClientAfter has client watched for a hang-up, which tells to, once
// the body being read has lasted clientCheck from start: a body that ends
// sooner never pays the watch. The stream ends the watch (endClientWait).
func (c *upstreamConn) watchClientAfter(client net.Conn, to hangUpper, start time.Time) {
	c.client, c.hupTo, c.checkAt = client, to, start.Add(clientCheck)
}

// armRead sets the read deadline for the next wait: the header deadline
// (or the client check, when earlier) before the response head, else the
// idle timeout or the heartbeat, whichever comes first. It reports whether
// the heartbeat is the one armed, and sets checking for the client check.
func (c *upstreamConn) armRead() (heartbeat bool) {
	var deadline time.Time
	var sl time.Duration
	c.checking = false
	if !c.inBody {
		deadline, sl = c.headerDeadline, slack(c.headerTimeout)
		if c.client != nil && c.hupKey == 0 && (deadline.IsZero() || c.checkAt.Before(deadline)) {
			deadline, sl, c.checking = c.checkAt, slack(clientCheck), true
		}
	} else {
		if c.idleTimeout > 0 {
			// Counted from the first wait since the backend last sent a
			// byte, not from this one: a heartbeat that woke the previous
			// wait is the proxy's own write and must not make a silent
			// stream look busy (it would never time out).
			if c.idleDeadline.IsZero() {
				c.idleDeadline = time.Now().Add(c.idleTimeout)
			}
			deadline, sl = c.idleDeadline, slack(c.idleTimeout)
		}
		if !c.heartbeat.IsZero() && (deadline.IsZero() || c.heartbeat.Before(deadline)) {
			// An eighth of the interval early at most, a second at most:
			// a fixed second let a 1 s interval's heartbeat follow an event
			// at once. heartbeatFired keeps an expired one from being kept.
			deadline, sl, heartbeat = c.heartbeat, c.heartbeatSlack, true
		}
		if c.client != nil && c.hupKey == 0 && (deadline.IsZero() || c.checkAt.Before(deadline)) {
			deadline, sl, heartbeat, c.checking = c.checkAt, slack(clientCheck), false, true
		}
	}
	c.readDeadline = setDeadline(c.Conn, true, c.readDeadline, deadline, sl)
	return heartbeat
}

// setDeadline arms want unless the armed deadline cur is earlier by less
// than slack: moving a socket deadline costs a runtime timer update, and a
// timeout may fire that little early. Earlier (or zero) deadlines are
// always set, so heartbeats stay exact.
func setDeadline(c net.Conn, read bool, cur, want time.Time, slack time.Duration) time.Time {
	if !cur.IsZero() && !want.IsZero() && !want.Before(cur) && want.Sub(cur) < slack {
		return cur
	}
	if read {
		_ = c.SetReadDeadline(want)
	} else {
		_ = c.SetWriteDeadline(want)
	}
	return want
}

// slack is how early a timeout of d may fire so that its deadline moves at
// most once a second (an eighth of d for short ones). A deadline renewed
// as now+d is then never kept once it has passed.
func slack(d time.Duration) time.Duration { return min(time.Second, d/8) }

// heartbeatFired records that the heartbeat deadline passed. The socket's
// deadline has expired, so it is forgotten: the next one is set whatever
// it is (setDeadline could keep the expired one for a heartbeat due less
// than a second later, and every read would time out at once).
func (c *upstreamConn) heartbeatFired() {
	c.heartbeat = time.Time{}
	c.readDeadline = time.Time{}
}

// setHeartbeat arms the heartbeat deadline d from now, or with d zero
// disarms it.
func (c *upstreamConn) setHeartbeat(d time.Duration) {
	if d == 0 {
		c.heartbeat = time.Time{}
		return
	}
	c.heartbeat, c.heartbeatSlack = time.Now().Add(d), slack(d)
}

func isConnReset(err error) bool {
	var oe *net.OpError
	return errors.As(err, &oe) && !oe.Timeout()
}
