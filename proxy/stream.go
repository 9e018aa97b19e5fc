package proxy

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/cube-sandbox/cubeproxy/accesslog"
)

// heartbeatLine is an SSE comment: parsers ignore it, but writing it tells
// the proxy whether the client is still there.
var heartbeatLine = []byte(": keep-alive\n\n")

// utf8BOM may open an event stream (WHATWG HTML 9.2.6).
const utf8BOM = "\uFEFF"

// errClientGone ends a stream whose client closed its connection before
// the stream started (see Proxy.hijack).
var errClientGone = errors.New("client connection closed before the stream started")

// errClientLeft ends a stream whose client closed its connection (told by
// hangups, or found when a heartbeat was due).
var errClientLeft = errors.New("client closed the connection")

// hangUpper is what a hangups watch tells of its client's hang-up (under
// the watch's lock: it is not released meanwhile). hangUp returns the
// sandbox connection to shut once the lock is released (wake), or nil: a
// mass hang-up shut thousands of sockets under the lock every new stream's
// watch takes.
type hangUpper interface{ hangUp() net.Conn }

// bodyStream hands an upstream response body to fasthttp's response writer.
// fasthttp reads it and writes one chunk per Read, so every piece the
// backend sends reaches the client at once. fasthttp closes it (with the
// write error, if any) when it is done; that is where the upstream
// connection goes back to its pool or is closed — never earlier, or the
// stream would be cut.
type bodyStream struct {
	p         *Proxy
	conn      *upstreamConn
	keepAlive bool // the backend allows reusing the connection

	mode    bodyMode
	left    int64 // bodyFixed: bytes still to read
	chunked chunkedReader
	eof     bool // the body was read to its end

	sse        bool
	coded      bool // a Content-Encoding: the bytes are not the events' text
	resumable  bool // an event stream a GET asked for: drain ends it at once (registry.endSSE); once registered, written under the registry lock
	probing    bool // resumable, and its first line not seen yet (probeFirstEvent)
	probeN     uint8
	fixed      bool // Content-Length body: copied by WriteTo in large pieces
	heartbeat  time.Duration
	atBoundary bool // bytes sent so far end an SSE event (or none were sent)
	// lineEnds counts the line ends the bytes sent so far end with (up to
	// 2), and cr says the last was a CR, which an LF may complete.
	lineEnds uint8
	cr       bool
	// fields: a line that is not a comment began since the last blank line
	// sent: an event is half received until the next one (betweenEvents).
	fields bool
	// beatFirst: a heartbeat went out before the sandbox's first byte, and
	// dataSeen: that byte came (see Read, on a leading BOM).
	beatFirst, dataSeen bool
	// bomN bytes that may begin a BOM came first, after a heartbeat, and
	// are held back (dropBOM).
	bomN uint8

	// probe holds the first bytes of a resumable stream until they tell
	// whether it opens an MCP HTTP+SSE session (opensLegacySession).
	probe [len(utf8BOM) + len("event: endpoint\r")]byte

	started time.Time
	sb      *sandboxState
	// countedOut: the request no longer counts against its sandbox
	// (countOut), which a stream does before its last bytes go out.
	countedOut bool
	x          exchange
	rc         *fasthttp.RequestCtx // for the access log at close; only read by fasthttp's own goroutine

	// A detached stream (detach.go) has left fasthttp: it owns the client
	// connection and logs the entry captured when it left.
	detached bool
	unframed bool // detached for an HTTP/1.0 client: no chunked framing
	status   int
	entry    *accesslog.Entry

	client         net.Conn // to refresh the per-write deadline
	writeTimeout   time.Duration
	clientDeadline time.Time

	// stopping is set by drain: the next failed upstream read ends the
	// stream cleanly (io.EOF) instead of as an error.
	stopping atomic.Bool
	// clientLeft is set by hangups when the client closes its connection:
	// the upstream read that fails next ends the stream as errClientLeft.
	clientLeft atomic.Bool
	hupKey     uint64 // in Proxy.hangups; 0 = not watched
	closed     bool

	// registry links.
	prev, next *bodyStream
}

// bodyMode is how the end of a response body is known.
type bodyMode uint8

const (
	bodyFixed      bodyMode = iota // Content-Length
	bodyChunked                    // Transfer-Encoding: chunked
	bodyUntilClose                 // neither: the backend closes the connection
)

var bodyStreamPool = sync.Pool{New: func() any { return new(bodyStream) }}

func (s *bodyStream) Read(b []byte) (int, error) {
	s.armHeartbeat()
	room := b
	if s.bomN > 0 && len(b) > int(s.bomN) {
		room = b[:len(b)-int(s.bomN)] // for the bytes held back, should they not be a BOM
	}
	n, err := s.readBody(room)
	if s.eof {
		// The sandbox's body is whole: what is left is to write its last
		// piece (and, chunked, the last chunk). The client may read it and
		// send its next request on another connection at once; at
		// max_streams_per_sandbox that request must find the slot free.
		s.countOut()
	}
	if n > 0 && !s.dataSeen {
		if s.beatFirst {
			// An event stream may begin with a BOM, which the client
			// strips only at the very start of the stream: behind our
			// heartbeat it would join the name of the first field
			// ("\uFEFFdata"), and the first event would be lost.
			n = s.dropBOM(b, n)
		} else {
			s.dataSeen = true
		}
	} else if n == 0 && err == io.EOF && s.bomN > 0 {
		n = s.releaseBOM(b, 0) // the stream ended in a BOM's first bytes
	}
	if s.writeTimeout > 0 && s.client != nil {
		// The client must take each piece within writeTimeout, counted from
		// when the backend delivered it: a slow backend must not use up the
		// client's time. A stream itself may last as long as both ends keep
		// talking. The socket's deadline moves once a second at most.
		s.clientDeadline = setDeadline(s.client, false, s.clientDeadline, time.Now().Add(s.writeTimeout), slack(s.writeTimeout))
	}
	if n > 0 {
		s.x.bytesOut += int64(n)
		if s.sse {
			s.trackBoundary(b[:n])
		}
		if s.probing {
			s.probeFirstEvent(b[:n])
		}
	}
	if err == io.EOF && s.mode == bodyUntilClose && s.sse && !s.coded && !s.betweenEvents() {
		// A body that ends with the connection has only the close for its
		// end, which a sandbox that dies sends as well: inside an event it
		// is a cut, and ended cleanly (the last chunk) the client would
		// take the event's first lines for the whole event (the go-sdk
		// dispatches them and fails the session on their cut JSON, where
		// a cut stream has it resume with Last-Event-ID). After a comment
		// line (": ping\n") no event is half received: a clean end.
		s.eof = false
		err = io.ErrUnexpectedEOF
	}
	if err != nil && s.clientLeft.Load() {
		return n, errClientLeft
	}
	if err != nil && n == 0 && errors.Is(err, errHeartbeatDue) {
		if s.fixed {
			return 0, err // WriteTo's bulk hold, never a heartbeat
		}
		if clientClosed(s.client) {
			return 0, errClientLeft
		}
		s.beatSent()
		// Body bytes the client gets, counted as the sandbox's are.
		n = copy(b, heartbeatLine)
		s.x.bytesOut += int64(n)
		return n, nil
	}
	if n == 0 && s.pausedIdle(err) {
		return 0, nil // fasthttp reads again: a new wait
	}
	if err != nil && err != io.EOF && s.drainEndsCleanly() {
		// Drain interrupted the upstream read: end the stream cleanly so an
		// SSE client reconnects (with Last-Event-ID) to another instance.
		// Where streams cannot detach (readable_other.go) this is the
		// drain's only path: fasthttp then writes the last chunk. On unix
		// a GET's event stream is detached, and the drain's wake-up ends
		// it in copyEvents; it comes here when a read fails on bytes
		// already buffered (the sandbox's framing broke) after the drain
		// marked it, or when it has a Content-Length over wholeBody, which
		// cannot end cleanly short of its length anyway (fasthttp's
		// fixed-size writer fails it: the client sees it cut).
		s.x.drained = true
		return n, io.EOF
	}
	if err != nil && err != io.EOF {
		s.cut(err)
	}
	return n, err
}

// drainEndsCleanly reports whether the drain, having interrupted the
// stream's upstream read, ends it cleanly (the client reconnects
// elsewhere). Not inside an SSE event: a client takes what a cleanly ended
// stream holds for a whole event (the go-sdk records its id and resumes
// after it, losing it, or fails the session on its cut data), so such a
// stream ends as cut, and the client resumes from the event before.
func (s *bodyStream) drainEndsCleanly() bool {
	return s.stopping.Load() && (!s.sse || s.betweenEvents())
}

// pausedIdle reports whether err is upstream.idle_timeout expiring while
// the stream's sandbox is pausing or paused, and if so re-arms it for the
// next wait. A paused VM is silent by nature, and its open streams are
// left for it to resume with (README, What an MCP agent sees): cut at
// idle_timeout, a session's GET stream was reconnected by the go-sdk into
// the pause's 503, which failed the session. Only a failed read pays the
// look at the state.
//
// A sandbox resumed during the wait gets a whole idle timeout from the
// resume (sandboxState.resumedAt) to speak: re-armed only from the expiries
// during the pause, the wait ended anywhere from at once to one timeout
// after the resume, and a command's output that came a moment after it
// found its stream cut.
func (s *bodyStream) pausedIdle(err error) bool {
	// errors.Is, not isTimeout: its errors.As target escapes, an
	// allocation at the end of every stream that ends with an empty read.
	if err == nil || err == io.EOF || !errors.Is(err, os.ErrDeadlineExceeded) || s.stopping.Load() || s.conn.interrupted.Load() {
		return false
	}
	switch s.sb.state() {
	case statePausing, statePaused:
		s.conn.idleDeadline = time.Time{} // counted afresh from now
	case stateRunning:
		resumed := time.Unix(0, s.sb.resumedAt.Load()).Add(s.conn.idleTimeout)
		if !resumed.After(s.conn.idleDeadline) || !resumed.After(time.Now()) {
			return false // no resume since the wait began: silent that long
		}
		s.conn.idleDeadline = resumed
	default:
		return false
	}
	// The socket's deadline has expired: forgotten, so that the next one
	// is set whatever it is (as heartbeatFired does).
	s.conn.readDeadline = time.Time{}
	return true
}

// dropBOM drops a BOM that opens the sandbox's stream, the first n bytes
// of b, and returns how many are left. A BOM may come in pieces (a chunk
// of its own, cut anywhere): bytes that may begin one are held back
// (bomN) until the next tell, and Read leaves room in b for them to go out
// in front of those should they not be one.
func (s *bodyStream) dropBOM(b []byte, n int) int {
	rest := utf8BOM[s.bomN:]
	m := min(n, len(rest))
	switch {
	case string(b[:m]) != rest[:m]:
		return s.releaseBOM(b, n) // no BOM
	case m == len(rest):
		s.dataSeen, s.bomN = true, 0
		return copy(b, b[m:n])
	}
	s.bomN += uint8(m) // all of b[:n] may begin a BOM
	return 0
}

// releaseBOM puts the bytes dropBOM held back in front of the n bytes at
// the start of b, and returns how many there are.
func (s *bodyStream) releaseBOM(b []byte, n int) int {
	k := int(s.bomN)
	s.dataSeen, s.bomN = true, 0
	copy(b[k:], b[:n])
	copy(b, utf8BOM[:k])
	return n + k
}

// beatSent records a heartbeat written to the client.
func (s *bodyStream) beatSent() { s.beatFirst = s.beatFirst || !s.dataSeen }

// cut records why the sandbox's side of the body failed. The status went
// out with the head, so the log and the span say it with an error code.
func (s *bodyStream) cut(err error) {
	if s.x.errCode != "" || s.clientLeft.Load() {
		return // the client left: the proxy closed the sandbox's side
	}
	switch {
	case s.conn.killed.Load():
		s.x.errCode = CodeSandboxKilled // POST /admin/meta/delete cut it
	case s.conn.changed.Load() != cutNone:
		s.x.errCode = changedCode(s.conn.changed.Load()) // a route change cut it (rejudge)
	case s.conn.interrupted.Load():
		s.x.errCode = CodeDrainTimeout // the proxy cut it, not the sandbox
	case isTimeout(err):
		s.x.errCode = CodeUpstreamTimeout
	case errors.Is(err, errBadChunk):
		s.x.errCode = CodeUpstreamBadHeader
	default:
		s.x.errCode = CodeUpstreamReset
	}
}

// clientEnded records why a body ended early on the client's side: cut
// records every failure of the sandbox's side, so a stream that failed
// without a code failed writing to its client, or was ended for its
// client's hang-up. The status went out with the head and stays; the code
// keeps a download the client aborted from passing for a complete one in
// the log, and says that the client ended it, not the sandbox, or that it
// stopped reading (a write it did not take within client.write_timeout).
func (s *bodyStream) clientEnded(err error) {
	left := s.clientLeft.Load() || errors.Is(err, errClientLeft)
	if s.p.afterLeftLook != nil {
		s.p.afterLeftLook(s)
	}
	switch {
	case left:
		s.x.errCode = CodeClientClosed
	case s.conn.killed.Load():
		s.x.errCode = CodeSandboxKilled // the kill closed the client's side too
	case s.conn.changed.Load() != cutNone:
		s.x.errCode = changedCode(s.conn.changed.Load())
	case s.conn.interrupted.Load():
		// The drain's cut: abort closed the client's side. Or the hangups
		// watch's hang-up, reported since the look above: its hangUp
		// interrupts the connection too, after it marks the client gone.
		s.x.errCode = CodeDrainTimeout
		if s.clientLeft.Load() {
			s.x.errCode = CodeClientClosed
		}
	case isTimeout(err):
		s.x.errCode = CodeClientWriteTimeout
	default:
		s.x.errCode = CodeClientClosed // a reset or a broken pipe
	}
}

// armHeartbeat arms the heartbeat for the next upstream wait, but only
// between events: a comment line inside an event would corrupt it.
func (s *bodyStream) armHeartbeat() {
	if !s.sse || s.heartbeat <= 0 || s.fixed {
		// A Content-Length body has no room for a comment: it would push
		// the body's last bytes out of the count.
		return
	}
	if s.betweenEvents() {
		s.conn.setHeartbeat(s.heartbeat)
	} else {
		s.conn.setHeartbeat(0)
	}
}

// bodyReady reports whether the first Read of the body would return
// without waiting for the sandbox: body bytes (or its end) came with the
// head. A chunk-size line alone is not enough: a head held back for the
// body bytes it announces would wait for them, and an event stream's
// head for its first event, however long the sandbox takes to send it.
func (s *bodyStream) bodyReady() bool {
	if s.mode == bodyChunked {
		return s.chunked.ready()
	}
	return s.conn.br.Buffered() > 0
}

// readBody reads the upstream body according to its framing.
func (s *bodyStream) readBody(b []byte) (int, error) {
	if s.eof {
		return 0, io.EOF
	}
	var n int
	var err error
	switch s.mode {
	case bodyFixed:
		if s.left == 0 {
			s.eof = true
			return 0, io.EOF
		}
		if int64(len(b)) > s.left {
			b = b[:s.left]
		}
		n, err = s.conn.br.Read(b)
		s.left -= int64(n)
		if err == io.EOF {
			err = io.ErrUnexpectedEOF // the backend closed before Content-Length bytes
		}
		s.eof = s.left == 0 && err == nil
	case bodyChunked:
		n, err = s.chunked.Read(b)
		s.eof = err == io.EOF
	default:
		n, err = s.conn.br.Read(b)
		s.eof = err == io.EOF
	}
	return n, err
}

// SupportsBodyWriteTo lets fasthttp hand a fixed-length body to WriteTo.
// Bodies of unknown length keep the Read path, where fasthttp writes and
// flushes one chunk per Read: that is what delivers each SSE event at once.
func (s *bodyStream) SupportsBodyWriteTo() bool { return s.fixed }

// WriteTo copies a fixed-length body to the client connection in pieces of
// up to 64 KiB. fasthttp's writer w would hold back whatever does not fill
// its buffer (its fixed-size writer has no flush), and a backend that sends
// a large body slowly must be seen making progress; so the pieces go
// straight to the connection, behind the head that fasthttp flushed
// (ImmediateHeaderFlush, set for every fixed-length stream).
//
// It reads into a 4 KiB buffer, and into a pooled 64 KiB one from the
// first read that fills the small one (bulk) until a read has waited
// bulkHold for a byte, as a tunnel does (copyTunnel): the 64 KiB buffer
// was held for the whole body, and a download whose sandbox went silent
// mid-body (a slow generator, a stuck app) counted ≈ 132 KiB against
// GOMEMLIMIT until upstream.idle_timeout, twice one waiting for its head.
// The hold's deadline is the heartbeat's, which a fixed-length body never
// arms otherwise (armHeartbeat); it moves an eighth of bulkHold at a time
// (setHeartbeat's slack), so bulk pays eight timer updates a second, and a
// read that waited seven eighths of bulkHold gives the buffer back.
func (s *bodyStream) WriteTo(_ io.Writer) (int64, error) {
	small := uploadBufPool.Get().(*[]byte)
	defer uploadBufPool.Put(small)
	g := growingBuf{small: *small}
	defer func() {
		if g.big != nil {
			g.shrink()
			s.conn.setHeartbeat(0)
		}
	}()
	var total int64
	for {
		if g.big != nil {
			s.conn.setHeartbeat(bulkHold)
		}
		buf := g.next()
		n, err := s.Read(buf)
		if n > 0 {
			m, werr := s.client.Write(buf[:n])
			total += int64(m)
			if werr != nil {
				// Read counted the piece as sent: only m of it was.
				s.x.bytesOut -= int64(n - m)
				return total, werr
			}
		}
		switch {
		case err == io.EOF:
			return total, nil
		case err == errHeartbeatDue && g.big != nil:
			// The hold ran out (heartbeatFired disarmed it).
			g.shrink()
		case err != nil:
			return total, err
		default:
			g.grow(n)
		}
	}
}

// copyBufPool holds WriteTo's copy buffers; one is in use only while a
// fixed-length body is being copied.
var copyBufPool = sync.Pool{New: func() any { b := make([]byte, 64<<10); return &b }}

// copyGrowing copies an upload, src, to dst until src ends (io.EOF,
// reported as nil) or either fails, and returns the bytes written. It
// reads into small, and into a pooled copyBufPool buffer from the first
// read that fills small (bulk) until a read brings less than small holds
// again: a copy that mostly idles or trickles holds only small, small
// pieces cost no extra call, and bulk costs a pool round trip per burst.
// A read in bulk that waits bulkHold for the client ends empty
// (clientBody.holdBulk), and so gives the big buffer back too; so does one
// of a chunk's size line, which is read apart (clientBody.nextChunk). The
// buffers are src's (grow), where that read finds them.
func copyGrowing(dst io.Writer, src *clientBody, small []byte) (int64, error) {
	g := &src.grow
	*g = growingBuf{small: small}
	defer func() {
		g.shrink()
		g.small = nil
	}()
	var written int64
	for {
		if g.big != nil && src.size < 0 {
			// No live reference to the big buffer here but g's.
			if err := src.nextChunk(); err == io.EOF {
				return written, nil
			} else if err != nil {
				return written, err
			}
		}
		b := g.next()
		src.bulk = g.big != nil
		n, rerr := src.Read(b)
		if n > 0 {
			m, werr := dst.Write(b[:n])
			written += int64(m)
			if werr != nil {
				return written, werr
			}
		}
		switch {
		case rerr == io.EOF:
			return written, nil
		case rerr != nil:
			return written, rerr
		case n < len(small):
			g.shrink()
		default:
			g.grow(n)
		}
	}
}

// growingBuf is a read buffer that stays small while reads are, and is a
// pooled 64 KiB one (copyBufPool) from the first read that fills the small
// one until its owner gives that back (shrink): bulk reads few and large,
// a copy that idles or trickles holds only the small one. Its owners
// differ in when the bulk is over: a read that brings less than the small
// one holds (copyGrowing), one that brings less than the big one holds
// (linger), or one that waited too long for a byte (copyTunnel,
// bodyStream.WriteTo).
type growingBuf struct {
	small []byte
	big   *[]byte // nil unless in bulk
}

// next returns the buffer to read into next.
func (g *growingBuf) next() []byte {
	if g.big != nil {
		return *g.big
	}
	return g.small
}

// grow takes the big buffer when a read of n bytes filled the small one,
// and reports whether it did.
func (g *growingBuf) grow(n int) bool {
	if g.big != nil || n < len(g.small) {
		return false
	}
	g.big = copyBufPool.Get().(*[]byte)
	return true
}

// shrink gives the big buffer back, if it holds it.
func (g *growingBuf) shrink() {
	if g.big != nil {
		copyBufPool.Put(g.big)
		g.big = nil
	}
}

// trackBoundary records whether the bytes forwarded so far end with a blank
// line, the only place a heartbeat comment can be inserted without
// splitting an event: whether they end with two line ends, each a CRLF, an
// LF or a lone CR (the SSE standard takes all three). Only the run of
// '\r' and '\n' at the end of b can say so, so b is read backwards to its
// start, then that run forwards. A loop over every byte cost more CPU than
// the stream's syscalls in the sse throughput scenario (46 % of the proxy's
// profile, 256 B events read many at a time by a detached stream).
//
// A CR at the very end may be the first half of a CRLF whose LF is still to
// come. It is counted as a line end all the same: a comment written after
// it ends that line for the client, and the LF that follows is then one
// more blank line, which dispatches nothing.
//
// It also keeps fields, for betweenEvents, which only a piece that does not
// end with a blank line has to look further back for.
func (s *bodyStream) trackBoundary(b []byte) {
	i := len(b)
	for i > 0 && (b[i-1] == '\n' || b[i-1] == '\r') {
		i--
	}
	lineEnds, cr := s.lineEnds, s.cr
	if i > 0 {
		lineEnds, cr = 0, false // the run follows a field's bytes
	}
	for _, c := range b[i:] {
		switch {
		case c == '\r':
			lineEnds, cr = min(lineEnds+1, 2), true
		case cr: // the LF of a CRLF already counted
			cr = false
		default:
			lineEnds = min(lineEnds+1, 2)
		}
	}
	switch {
	case lineEnds == 2:
		s.fields = false
	case i > 0:
		s.fields = s.fieldsAfter(b[:i]) // reads the state before b
	}
	s.lineEnds, s.cr = lineEnds, cr
	s.atBoundary = lineEnds == 2
}

// betweenEvents reports whether the bytes sent so far leave no event half
// received: they end with a blank line (or none were sent), or with a
// whole line, every line since the last blank one a comment. A client
// drops nothing at a clean end there, and misses nothing of a stream cut
// there; a sandbox's own keep-alive comment (": ping\n", no blank line)
// followed by its close is an end, not a cut.
func (s *bodyStream) betweenEvents() bool {
	return s.atBoundary || s.lineEnds > 0 && !s.fields
}

// fieldsAfter reports what fields is once b is sent, b ending inside a line
// (what trackBoundary found before its run of line ends), with the state
// of the bytes before b still in s. It reads b backwards line by line,
// only as far as the first line that is not a comment or the last blank
// line, so a piece that ends an event and begins the next costs that
// event's bytes; one inside a long line finds no line end at all, which
// IndexByte tells without a walk over each byte.
func (s *bodyStream) fieldsAfter(b []byte) bool {
	continues := s.lineEnds == 0 && !s.atBoundary // b's first line began before b
	if bytes.IndexByte(b, '\n') < 0 && bytes.IndexByte(b, '\r') < 0 {
		if continues {
			return s.fields // judged when it began
		}
		return b[0] != ':' || !s.atBoundary && s.fields
	}
	end := len(b)
	for {
		j := lineStart(b, end)
		if j == 0 {
			if continues {
				return s.fields
			}
			return b[0] != ':' || !s.atBoundary && s.fields
		}
		if b[j] != ':' {
			return true
		}
		k := j // the start of the run of line ends before that line
		for k > 0 && (b[k-1] == '\n' || b[k-1] == '\r') {
			k--
		}
		n := lineEndsIn(b[k:j])
		if k == 0 && !continues {
			// The run goes on from the one the bytes before b ended with.
			if s.atBoundary {
				return false
			}
			n += int(s.lineEnds)
			if s.cr && b[0] == '\n' {
				n-- // that CR's LF
			}
		}
		if n >= 2 {
			return false // a blank line, then comments only
		}
		if k == 0 {
			return s.fields
		}
		end = k
	}
}

// lineScan is how far back lineStart looks for a line end at a time: a
// window with none is passed over by IndexByte.
const lineScan = 512

// lineStart returns where the line that ends at end in b begins: after the
// last CR or LF before end, or 0. It walks back byte by byte only through
// the window that holds that line end: a read that ends one event and
// begins a long one (a tool's result as one data line) was walked back to
// its start a byte at a time, ≈ 40 µs a 64 KiB read, 30 times what IndexByte
// takes over a read with no line end at all.
func lineStart(b []byte, end int) int {
	for end > 0 {
		from := max(end-lineScan, 0)
		if w := b[from:end]; bytes.IndexByte(w, '\n') >= 0 || bytes.IndexByte(w, '\r') >= 0 {
			for j := end; j > from; j-- {
				if b[j-1] == '\n' || b[j-1] == '\r' {
					return j
				}
			}
		}
		end = from
	}
	return 0
}

// lineEndsIn counts the line ends in run, a run of CRs and LFs: a CRLF is
// one.
func lineEndsIn(run []byte) int {
	n := 0
	for i, c := range run {
		if c == '\r' || i == 0 || run[i-1] != '\r' {
			n++
		}
	}
	return n
}

// probeFirstEvent collects the first bytes of a GET's event stream until
// they tell whether it is an MCP HTTP+SSE session, which the drain must not
// end at once (see opensLegacySession); it copies at most 19 bytes, once.
func (s *bodyStream) probeFirstEvent(b []byte) {
	n := copy(s.probe[s.probeN:], b)
	got := s.probe[:int(s.probeN)+n]
	s.probeN = uint8(len(got))
	if len(got) < len(s.probe) && !bytes.ContainsAny(got, "\r\n") {
		return // the first line is not complete yet
	}
	s.probing = false
	if opensLegacySession(got) {
		s.p.streams.keepForDeadline(s)
	}
}

// opensLegacySession reports whether b, the start of a GET's event stream,
// is the endpoint event that opens a session of MCP's HTTP+SSE transport
// (protocol 2024-11-05, still shipped by the TypeScript, Python and Go
// SDKs). Such a stream carries the answer to every call of its session,
// and the session ends with it: its events have no ids, and a client that
// reconnects gets a new, uninitialized session, so the calls in flight
// would be lost. It is a session like a WebSocket, not a subscription a
// client resumes elsewhere.
func opensLegacySession(b []byte) bool {
	b = bytes.TrimPrefix(b, []byte(utf8BOM))
	b, ok := bytes.CutPrefix(b, []byte("event:"))
	if !ok {
		return false
	}
	b = bytes.TrimPrefix(b, []byte(" "))
	b, ok = bytes.CutPrefix(b, []byte("endpoint"))
	return ok && len(b) > 0 && (b[0] == '\r' || b[0] == '\n')
}

// CloseWithError is called by fasthttp once the body was written (err nil)
// or writing failed (the client went away). A non-nil err makes fasthttp
// close the upstream connection instead of pooling it, which is how the
// backend learns that its client is gone.
func (s *bodyStream) CloseWithError(err error) error {
	s.end(err)
	return nil
}

// countOut counts the stream's request out of its sandbox, once. A stream
// does it as soon as the sandbox's body is read whole (Read), before its
// last piece or last chunk goes out, and a detached stream before the last
// chunk a drain writes: the client may send its next request as soon as it
// reads the end (on a new connection: a detached stream's ends with it, and
// a client may well use another), and at max_streams_per_sandbox that
// request must find the slot free, not be refused 429 for a stream that has
// ended. fasthttp writes a stream's last bytes before end runs.
func (s *bodyStream) countOut() {
	if !s.countedOut {
		s.countedOut = true
		s.sb.done(time.Now().UnixMilli())
	}
}

// end releases everything the stream holds and records it; err is nil when
// the body was delivered whole (or drain ended an SSE stream cleanly).
func (s *bodyStream) end(err error) {
	if s.closed {
		return
	}
	s.closed = true
	if err != nil && s.x.errCode == "" {
		s.clientEnded(err)
	}
	s.p.hangups.unwatch(s.hupKey) // first: hangUp may not run on a released stream
	s.hupKey = 0
	s.conn.endClientWait() // the same for the connection's watch (watchClientAfter)
	// Off the list before its connections are released (a pooled sandbox
	// connection must not be cut by a drain), but still counted open
	// until its line is logged (ended, below).
	p := s.p
	p.streams.remove(s)
	s.conn.release(s.p, err == nil && s.eof && s.keepAlive && s.mode != bodyUntilClose)
	s.countOut()
	if s.detached {
		s.p.finish(nil, &s.x, s.status, err, s.entry)
		if c := s.client; c != nil {
			switch {
			case s.unframed && err != nil:
				c = resetOnClose(c)
			case err == nil && clientSentMore(c):
				s.p.goLingerClose(c, nil)
				c = nil
			}
			if c != nil {
				_ = c.Close()
				s.p.clientConnClosed()
			}
		}
	} else {
		s.p.finish(s.rc, &s.x, s.rc.Response.StatusCode(), err, nil)
	}
	*s = bodyStream{}
	bodyStreamPool.Put(s)
	p.streams.ended()
}

// resetOnClose makes closing c reset the connection, and returns what to
// close. An HTTP/1.0 client knows the end of a body of unknown length only
// by the end of the connection: a FIN (or a TLS close_notify) after a body
// the sandbox broke off would pass the truncated body for a complete one.
// So the socket under TLS is closed, with SO_LINGER 0.
func resetOnClose(c net.Conn) net.Conn {
	if tc, ok := c.(interface{ NetConn() net.Conn }); ok {
		c = tc.NetConn()
	}
	if cc, ok := c.(*clientConn); ok {
		c = cc.TCPConn // closed as it is, never lingering
	}
	if tcp, ok := c.(*net.TCPConn); ok {
		_ = tcp.SetLinger(0)
	}
	return c
}

// hangUp is called by hangups (under its lock, so the stream cannot be
// released meanwhile) when the client has closed its connection: it
// returns the sandbox connection, which hangups shuts after the lock to
// unblock the pending upstream read (interrupted: never pooled, so it is
// still the stream's or closed by then), and the stream ends as
// errClientLeft.
func (s *bodyStream) hangUp() net.Conn {
	s.clientLeft.Store(true)
	s.conn.interrupted.Store(true) // never pooled: closed under the stream
	return s.conn.Conn
}

// interrupt is called by drain (from another goroutine, under the registry
// lock, so the stream cannot be released meanwhile): it unblocks the
// pending upstream read without waiting for the stream to run (wake); the
// stream closes the connection as it ends.
func (s *bodyStream) interrupt() {
	s.conn.interrupted.Store(true)
	if !wake(s.conn.Conn) {
		_ = s.conn.Close()
	}
}

// abort is interrupt at the drain deadline, with the client's side closed
// too: fasthttp (or a detached stream) may be blocked writing to a client
// that stopped reading, which only client.write_timeout would end, long
// after the process exited under the stream. It runs under the registry
// lock, so the stream cannot be released meanwhile, and returns what to
// shut once the lock is released (abortAll): a close of a socket with
// unsent data is the kernel's work, not to be done under a lock every
// stream takes to end. The sandbox connection is marked interrupted here
// (never pooled, so it is still the stream's or closed when it is shut).
// The socket under TLS is closed, not the TLS connection, whose
// close_notify could block on that same full buffer. The owner's own
// close and count of the connection follow as usual. An HTTP/1.0 client's
// body ends with its connection, so that connection is reset (see
// resetOnClose).
func (s *bodyStream) abort() streamCut {
	s.conn.interrupted.Store(true)
	c := s.client
	if tc, ok := c.(interface{ NetConn() net.Conn }); ok && !s.unframed {
		c = tc.NetConn()
	}
	return streamCut{upstream: s.conn.Conn, client: c, reset: s.unframed}
}

// streamCut is what abort leaves to shut after the registry lock.
type streamCut struct {
	upstream, client net.Conn // client may be nil (abandon)
	reset            bool     // close client with a reset (resetOnClose)
}

// shut wakes the stream's sandbox connection and closes its client's. A
// stream that ended meanwhile closed both already: the closes are no-ops.
func (c streamCut) shut() {
	shut(c.upstream)
	if c.client == nil {
		return
	}
	if c.reset {
		c.client = resetOnClose(c.client)
	}
	_ = c.client.Close()
}

// registry tracks what is open so that shutdown can end it: body streams and
// hijacked WebSocket tunnels, which fasthttp's Shutdown does not see.
type registry struct {
	mu      sync.Mutex
	head    *bodyStream // intrusive list: no allocation per stream
	tunnels map[*tunnel]struct{}
	// streams counts the body streams from add until ended, after their
	// access-log line is queued: the drain's wait ends when it is 0, and
	// the process then closes the access log. A stream leaves the list
	// (remove) before that, as it releases its connections; counted out
	// there, its line could come after the log's close, and was lost (one
	// line in 2 of 7 drains of a few hundred event streams).
	streams atomic.Int64
	// draining is set by endSSE: a GET's event stream whose head arrives
	// later ends at once as well. aborted is set by abortAll: whatever registers
	// later is cut at once too.
	draining, aborted bool
	// coming counts the tunnels whose 101 is to go out (reserveTunnel)
	// and that are not listed yet: fasthttp counts their connection out
	// as the handler returns, and the hijack handler lists the tunnel
	// only after, so a drain that looked in between found nothing open,
	// ended, and left the tunnel running unwaited for and unlogged.
	coming int
}

// reserveTunnel counts open a tunnel about to be listed (addTunnel) or
// dropped (unreserveTunnel), from its handler on.
func (r *registry) reserveTunnel() {
	r.mu.Lock()
	r.coming++
	r.mu.Unlock()
}

// unreserveTunnel counts out a reserved tunnel that will not be listed:
// fasthttp skipped its hijack handler.
func (r *registry) unreserveTunnel() {
	r.mu.Lock()
	r.coming--
	r.mu.Unlock()
}

// add lists s and counts it open.
func (r *registry) add(s *bodyStream) {
	r.mu.Lock()
	s.next = r.head
	if r.head != nil {
		r.head.prev = s
	}
	r.head = s
	r.streams.Add(1)
	if r.draining && s.resumable {
		s.stopping.Store(true)
		s.interrupt()
	} else if r.aborted {
		// Not abort: the head has yet to go out, and the client that gets
		// it learns from the cut body that the answer is incomplete.
		s.interrupt()
	}
	r.mu.Unlock()
}

// remove takes s off the list: the drain no longer cuts it. It stays
// counted open until ended.
func (r *registry) remove(s *bodyStream) {
	r.mu.Lock()
	if s.prev != nil {
		s.prev.next = s.next
	} else if r.head == s {
		r.head = s.next
	}
	if s.next != nil {
		s.next.prev = s.prev
	}
	s.prev, s.next = nil, nil
	r.mu.Unlock()
}

// ended counts out a stream that remove took off the list, once its end
// is logged.
func (r *registry) ended() { r.streams.Add(-1) }

// addTunnel lists t, which reserveTunnel counted open.
func (r *registry) addTunnel(t *tunnel) {
	r.mu.Lock()
	r.coming--
	if r.tunnels == nil {
		r.tunnels = make(map[*tunnel]struct{})
	}
	r.tunnels[t] = struct{}{}
	if r.aborted {
		t.drainCut.Store(true)
		t.close()
	}
	r.mu.Unlock()
	if t.pool != nil {
		// Where a kill finds it (and cuts it, when the kill came first).
		t.pool.addTunnel(t)
	}
}

func (r *registry) removeTunnel(t *tunnel) {
	r.mu.Lock()
	delete(r.tunnels, t)
	r.mu.Unlock()
	if t.pool != nil {
		t.pool.removeTunnel(t)
	}
}

// endSSE ends every open event stream that a GET asked for cleanly: its
// client reconnects elsewhere (EventSource and an MCP agent's standalone
// stream do, with Last-Event-ID when they have one). A stream that opened
// an MCP HTTP+SSE session is not one of them (keepForDeadline). Other bodies keep
// going until the drain deadline: a clean end of a download would look
// like a complete file, and an event stream answering a POST (an MCP tool
// call's answer, a streamed LLM completion) cannot be asked for again; it
// can be resumed only if its events carry ids, which the go-sdk gateway's
// do only with an event store. Such an answer usually ends well within the
// drain, and one the deadline cuts ends as an error, which a client that
// has an event id resumes all the same.
func (r *registry) endSSE() {
	r.mu.Lock()
	r.draining = true
	conns := make([]net.Conn, 0, r.streams.Load())
	for s := r.head; s != nil; s = s.next {
		if s.resumable {
			s.stopping.Store(true)
			// Set while the stream is listed, so before its release:
			// its connection is never pooled, and is still the stream's
			// or closed when it is woken below, after the stream (itself
			// pooled once it ends) may be gone.
			s.conn.interrupted.Store(true)
			conns = append(conns, s.conn.Conn)
		}
	}
	r.mu.Unlock()
	// Outside the lock, which each stream takes to end: streams end while
	// the rest are woken.
	for _, c := range conns {
		if !wake(c) {
			_ = c.Close()
		}
	}
}

// keepForDeadline makes s, a GET's event stream found to be an MCP HTTP+SSE
// session, one the drain leaves open until its deadline, as it does
// WebSockets: the answers to its calls in flight still come on it. A stream
// the drain has already ended is left to end.
func (r *registry) keepForDeadline(s *bodyStream) {
	r.mu.Lock()
	if !s.stopping.Load() {
		s.resumable = false
	}
	r.mu.Unlock()
}

// abortAll cuts whatever is still open at the drain deadline. What is
// open is marked under the lock and its sockets closed after it (see
// abort).
func (r *registry) abortAll() {
	r.mu.Lock()
	r.aborted = true
	cuts := make([]streamCut, 0, r.streams.Load())
	for s := r.head; s != nil; s = s.next {
		cuts = append(cuts, s.abort())
	}
	tunnels := make([]*tunnel, 0, len(r.tunnels))
	for t := range r.tunnels {
		t.drainCut.Store(true)
		tunnels = append(tunnels, t)
	}
	r.mu.Unlock()
	for _, c := range cuts {
		c.shut()
	}
	for _, t := range tunnels {
		t.close() // a tunnel is never reused: one that ended meanwhile closes again, a no-op
	}
}

// open reports the number of open body streams and tunnels, those about
// to be listed included.
func (r *registry) open() (streams, tunnels int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return int(r.streams.Load()), len(r.tunnels) + r.coming
}
