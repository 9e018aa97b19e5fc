package proxy

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/valyala/fasthttp"
)

// errBodyTooLarge stops a chunked upload at the cap.
var errBodyTooLarge = errors.New("request body too large")

// clientBody is a streamed request body on its way to the sandbox. It caps
// a chunked body's size, and it renews the client's read deadline before
// each read: client.body_timeout bounds each wait for the client (as
// nginx's client_body_timeout does), not the whole upload, so the time the
// proxy spends blocked on a slow sandbox is not charged to the client.
// It counts what it read, for a chunked body's logs and metrics. Two
// parties let go of it, in either order: fasthttp closes it once the body
// is sent (or when the request is reset, if it never was), and forward
// when it has read the count; the second returns it to its pool.
type clientBody struct {
	ctx      *fasthttp.RequestCtx
	r        io.Reader
	left     int64 // bytes still allowed
	n        int64 // bytes read
	timeout  time.Duration
	deadline time.Time
	size     int64 // Content-Length, or -1 for a chunked body
	eof      bool  // the client's body was read to its end
	// gone: the client closed its connection before the end of its body
	// (a reset, or a close cut it short), rather than sending a malformed one.
	gone    bool
	closed  bool // fasthttp is done with it
	counted bool // forward is done with it
	// cut is the sandbox connection's interrupted flag while the body is
	// sent on it: set, the drain deadline has come (pools.abort).
	cut *atomic.Bool
	// answered is the sandbox connection's flag for an answer that ends
	// the send (earlyAnswer).
	answered *atomic.Bool
	// bw is the writer the request goes out through while send writes it,
	// and dst the body writer fasthttp hands WriteTo (see uploadWriter).
	bw  *bufio.Writer
	dst io.Writer
	// hold is the client connection, when its reads can be held
	// (readHold); bulk says the copy reads into its 64 KiB buffer
	// (copyGrowing), and held is the end of the hold armed (zero: none).
	// empty says the last read ended empty at the hold's end: no progress,
	// which the next read must not renew the body's deadline for.
	hold  readHolder
	bulk  bool
	held  time.Time
	empty bool
	// grow is the copy's buffers (copyGrowing); framing says a read of a
	// chunk's size line is under way, into no buffer of the copy's
	// (nextChunk), which a hold that runs out then gives back (heldOut).
	grow    growingBuf
	framing bool
	// traceFields are the proxy's (Proxy.traceFields), which a chunked
	// body's trailer may not name (stripTrailerFields).
	traceFields []string
	// coalesce says the copy's small pieces of a chunked body wait in
	// pend (an uploadBufPool buffer, nil when none wait) until the client
	// connection is read again (uploadWriter.beforeRead). werr is the
	// failure of a write to the sandbox made there, which the read that
	// ran the hook returns.
	coalesce bool
	pend     *[]byte
	werr     error
}

var clientBodyPool = sync.Pool{New: func() any { return new(clientBody) }}

func (b *clientBody) Read(p []byte) (int, error) {
	if b.empty {
		b.empty = false
	} else {
		b.renew()
	}
	if b.hold != nil {
		b.holdBulk()
	}
	if err := b.stopped(); err != nil {
		return 0, err
	}
	if b.left <= 0 {
		// One byte more than allowed tells an exact-size body from an
		// oversized one. Only io.EOF means the body ended there: a chunked
		// body cut or botched right at the cap is incomplete, and taking
		// its error for the end would hand the sandbox a complete body.
		var one [1]byte
		n, err := b.r.Read(one[:])
		if err != nil && b.werr != nil {
			return 0, b.werr // the sandbox's failure, not the client's
		}
		if n > 0 {
			return 0, errBodyTooLarge
		}
		if err != nil && b.size < 0 && framingStalled(err) {
			err = errChunkStalled
		}
		if err == nil {
			b.held, b.empty = time.Time{}, true // as below
		}
		return 0, b.ended(err)
	}
	if int64(len(p)) > b.left {
		p = p[:b.left]
	}
	n, err := b.r.Read(p)
	if err != nil && b.werr != nil {
		// The read hook's write failed (uploadWriter.beforeRead): the
		// sandbox's failure, which ended the read, not the client's.
		b.left -= int64(n)
		b.n += int64(n)
		return n, b.werr
	}
	if err != nil && b.size < 0 && framingStalled(err) {
		err = errChunkStalled
	}
	if n == 0 && err == nil && len(p) > 0 {
		// The hold's end (readHold.ranOut), which ended it.
		b.held, b.empty = time.Time{}, true
	}
	b.left -= int64(n)
	b.n += int64(n)
	return n, b.ended(err)
}

// renew moves the client's read deadline to client.body_timeout from now,
// when that is more than a little later than the one set.
func (b *clientBody) renew() {
	if b.timeout > 0 {
		if want := time.Now().Add(b.timeout); want.Sub(b.deadline) >= slack(b.timeout) {
			_ = b.ctx.SetReadDeadline(want)
			b.deadline = want
		}
	}
}

// stopped is the error that ends the copy before its next read of the
// client: the drain's cut, or an early answer. It is checked after a
// renewal of the deadline (renew): abort's and earlyAnswer's deadlines,
// set after their flags, win.
func (b *clientBody) stopped() error {
	if b.cut != nil && b.cut.Load() {
		return errDrainCut
	}
	if b.answered != nil && b.answered.Load() {
		return errAnsweredEarly
	}
	return nil
}

// holdBulk keeps the connection's hold in step with the copy (readHold):
// while the copy reads into its 64 KiB buffer, a read that waits bulkHold
// for the client ends empty, and the copy gives the buffer back
// (copyGrowing), as a download's copy does when its sandbox is silent. An
// upload whose client went silent mid-body held it until
// client.body_timeout: ≈ 132 KiB counted against GOMEMLIMIT a connection,
// for 60 s by default, where one waiting for its answer counts ≈ 63 KiB.
// The hold's end moves at most twice a second (a runtime timer update and
// a lock each), so bulk gives the buffer back (a pool round trip) at most
// once a second, and only when a read waits at the hold's end.
func (b *clientBody) holdBulk() {
	switch {
	case b.bulk:
		if want := time.Now().Add(bulkHold); b.held.IsZero() || want.Sub(b.held) >= bulkHold/2 {
			b.hold.holdReads(want, b)
			b.held = want
		}
	case !b.held.IsZero():
		b.hold.holdReads(time.Time{}, nil)
		b.held = time.Time{}
	}
}

// endHold ends the hold, if one is armed: the connection's reads are
// fasthttp's again.
func (b *clientBody) endHold() {
	b.bulk = false
	if !b.held.IsZero() {
		b.hold.holdReads(time.Time{}, nil)
		b.held = time.Time{}
	}
}

// nextChunk reads what comes before a chunked body's next data, when the
// copy is in bulk: a read of no bytes, which fasthttp's reader turns into
// a read of the next chunk's size line when the chunk before has ended
// (and of the trailer after the last, io.EOF). The copy holds its 64 KiB
// buffer through its own frame only, which makes no use of it meanwhile:
// a hold that runs out while the line is awaited (fasthttp's reader takes
// that read up again, readHold) gives the buffer back there (heldOut), and
// the copy goes on in its small buffer. Read into the big buffer, the line
// kept it until client.body_timeout: a chunked upload whose client stopped
// between two chunks counted ≈ 120 KiB for 60 s, one that stopped within
// a chunk ≈ 64. A client that stops between a chunk's data and the CRLF
// after it still holds it: that CRLF is read with the data.
func (b *clientBody) nextChunk() error {
	b.bulk, b.framing = true, true
	_, err := b.Read(nil)
	b.framing = false
	return err
}

// heldOut is the hold's end in a read fasthttp's reader takes up again
// (readHold): one of a chunk's size line (nextChunk) gives the copy's big
// buffer back, which that read does not use. Any other such read is one of
// data into the big buffer, which keeps it.
func (b *clientBody) heldOut() {
	if b.framing {
		b.grow.shrink()
	}
}

// ended records what err, from a read of the body, says of its end: read
// to its end (eof), or left by a client that closed its connection (gone).
// A malformed body is neither. It returns the error the read is to
// return: err, or, for a chunked body whose trailer names a header the
// proxy sets (stripTrailerFields), that refusal, which the client is
// answered as for a malformed body and which leaves the sandbox's copy of
// the body unended.
func (b *clientBody) ended(err error) error {
	switch {
	case err == nil:
	case err == io.EOF && b.size >= 0 && b.n < b.size:
		// fasthttp ends a Content-Length body the client closed early with
		// a plain io.EOF (and then replaces it with a message of its own).
		b.gone = true
	case err == io.EOF:
		if b.size < 0 {
			if terr := stripTrailerFields(&b.ctx.Request.Header, b.traceFields); terr != nil {
				return terr
			}
		}
		b.eof = true
	default:
		b.gone = closedMidBody(err)
	}
	return err
}

// stripTrailerFields removes from the trailer of a chunked body, read
// with its end (after prepareRequest cleaned the head) and written after
// it, the fields the head loses: the proxy's token fields, so that the
// sandbox never sees the proxy's credential there either (fasthttp refuses
// only the standard credentials, Authorization and Cookie, in a trailer),
// and every name droppedTrailerName picks. A trailer that names a header
// the proxy sets in the head, Forwarded, X-Cube-Request-Id, or, with
// tracing on, one of traceFields, is refused (the error says which), as
// fasthttp refuses X-Forwarded-* and X-Real-IP there: PHP's built-in
// server (php -S) joins such a field onto the head's
// ($_SERVER["HTTP_FORWARDED"] "for=127.0.0.1, for=6.6.6.6", the request id
// "<id>, forged", a traceparent of two, which no tracer takes: the
// sandbox's spans left the proxy's trace), so that an app trusting the
// last Forwarded element took the client's. Removing only the
// trailer's copy is not to be had: fasthttp deletes a name from head and
// trailer at once, and the head's request id is still read after the
// body (the answer's id, the log). The names dropped here are ones the
// head no longer has, or never had.
// More than maxInvalidNames fields to drop refuse the trailer, as the
// head refuses as many names with a space.
func stripTrailerFields(h *fasthttp.RequestHeader, traceFields []string) error {
	for _, name := range h.PeekTrailerKeys() {
		refused := bytes.EqualFold(name, []byte("Forwarded")) || bytes.EqualFold(name, []byte(HeaderRequestID))
		for _, f := range traceFields {
			refused = refused || bytes.EqualFold(name, []byte(f))
		}
		if refused {
			return fmt.Errorf("request trailer field %q: the proxy sets it in the head", name)
		}
	}
	// fasthttp deletes a trailer line by moving the trailer's last line
	// into its place: a field sent there on several lines is put back in
	// its order after the deletes. Most bodies have no trailer.
	var order *lineOrder
	if len(h.PeekTrailerKeys()) > 0 {
		order = lineOrders.Get().(*lineOrder)
		order.rememberTrailer(h)
		defer order.release()
	}
	for _, name := range proxyTokenHeaders {
		h.Del(name)
	}
	// What the head's Connection lines named, read once: serve refused a
	// head naming more than maxConnectionOptions, so a trailer of many
	// fields costs a few comparisons each, not a walk over the head.
	var opts [maxConnectionOptions][]byte
	options := connectionOptions(opts[:0], h.RawHeaders())
	var found [4][]byte
	doomed := found[:0]
	for _, name := range h.PeekTrailerKeys() {
		if droppedTrailerName(name, options) {
			if len(doomed) == maxInvalidNames {
				// Each delete walks the whole header, as in the head
				// (dropInvalidNames), which refuses as many: 3,000 such
				// names in a 30 KB trailer cost ≈ 10 ms of CPU.
				return fmt.Errorf("request trailer holds more than %d fields the proxy drops", maxInvalidNames)
			}
			// A copy: deleting reuses the header's buffers.
			doomed = append(doomed, bytes.Clone(name))
		}
	}
	for _, name := range doomed {
		h.DelBytes(name)
	}
	if order != nil {
		order.restore(h)
	}
	return nil
}

// droppedTrailerName reports whether a request trailer field must not
// reach the sandbox: a name with a space, or the '_' or '.' spelling of a
// header the proxy strips or vouches for (the proxy's credentials,
// X-Real-IP, X-Forwarded-For, X-Forwarded-Host, X-Forwarded-Prefix), which the head loses too
// (dropInvalidNames, dropForwardingAliases); a hop-by-hop header
// (hopHeaders: fasthttp refuses all but Upgrade there), or one of the
// head's Connection options, which removeHopRequest took from the head as
// hop-by-hop by declaration. PHP's built-in server (php -S) reads a
// chunked body's trailer fields as request headers, each filed as the
// head's are ($_SERVER["HTTP_X_REAL_IP"] for X_Real_IP, X.Real.IP or
// "X Real IP") and overwriting the head's: relayed, a trailer forged the
// client address over the proxy's X-Real-IP and handed the sandbox's code
// a client's admin token (measured with PHP 8.2), and gave back a field
// the head's Connection named, or an Upgrade the proxy removed from a
// request that does not switch protocols.
// X-Forwarded-Host's and X-Forwarded-Prefix's are dropped whatever the
// route: fasthttp refuses the real names in a trailer, so only a spelling
// meant to pass for one comes.
// So is X-Cube-Request-Id's, which the head keeps: there it can replace
// only the client's own id (an id the proxy makes is added after it),
// while a trailer's replaced, in php -S, the id the proxy made or checked
// with any value. The routing headers (X-Cube-Sandbox-Id/-Port,
// E2b-Sandbox-Id/-Port) pass: the head passes them as sent, and their '_'
// spellings, which php -S files over them, so a trailer's copy (joined
// onto the head's there) tells the sandbox nothing the head could not.
func droppedTrailerName(name []byte, connOptions [][]byte) bool {
	if bytes.IndexByte(name, ' ') >= 0 {
		return true
	}
	if (bytes.IndexByte(name, '_') >= 0 || bytes.IndexByte(name, '.') >= 0) && droppedAlias(name, true, true) {
		return true
	}
	for _, hop := range hopHeaders {
		if bytes.EqualFold(name, []byte(hop)) {
			return true
		}
	}
	for _, opt := range connOptions {
		if bytes.EqualFold(name, opt) {
			return true
		}
	}
	return false
}

// errChunkStalled is a chunked body's read that reached the read deadline
// (client.body_timeout) inside the chunk framing: a timeout, as a stall
// anywhere else in the body is (the 408 request_body_timeout).
var errChunkStalled = fmt.Errorf("%w: client stalled within a chunk's framing", os.ErrDeadlineExceeded)

// framingStalled reports whether err, from fasthttp's reader of a chunked
// body, is a read of the chunk framing that reached the connection's read
// deadline, which fasthttp does not hand over as a timeout: it wraps it in
// an ErrBrokenChunk, without unwrapping, in the CRLF after a chunk's data
// and in a size line after its digits (an extension, the line's end), and
// returns its own ErrTimeout, no net.Error, at the trailer's start. Such a
// stall was answered as a malformed body, a 400 bad_request_body, where
// one in a chunk's data or digits was the 408 (nginx: 408 for all).
func framingStalled(err error) bool {
	// The end of every chunked body: errors.As's target escapes, an
	// allocation a chunked upload paid for nothing.
	if err == io.EOF {
		return false
	}
	if errors.Is(err, fasthttp.ErrTimeout) {
		return true
	}
	var bc fasthttp.ErrBrokenChunk
	return errors.As(err, &bc) && strings.HasSuffix(bc.Error(), ": "+os.ErrDeadlineExceeded.Error())
}

// closedMidBody reports whether err, from reading a request body, means
// that the client's connection ended under it: a reset, or a close in the
// middle of a chunked body, which fasthttp reports as io.ErrUnexpectedEOF,
// or, when the close cut a chunk's framing (its size line, the CRLF after
// its data), as an ErrBrokenChunk whose cause (unexported) is io.EOF.
func closedMidBody(err error) bool {
	if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET) {
		return true
	}
	var bc fasthttp.ErrBrokenChunk
	return errors.As(err, &bc) && strings.HasSuffix(bc.Error(), ": "+io.EOF.Error())
}

// SupportsBodyWriteTo has fasthttp's Request.Write copy the body with
// WriteTo (fasthttp.BodyWriterTo).
func (b *clientBody) SupportsBodyWriteTo() bool { return true }

// uploadSmallBuf is the buffer a body is read into while it comes in small
// pieces (a trickle, an agent's small chunks).
const uploadSmallBuf = 4 << 10

var uploadBufPool = sync.Pool{New: func() any { b := make([]byte, uploadSmallBuf); return &b }}

// WriteTo copies the body to w (the request's writer, which frames each
// write as a chunk for a chunked body) through Read, in pieces as large as
// the client sends them. fasthttp's own copy goes through a 4 KiB buffer:
// a write to the sandbox per 4 KiB, and for a chunked body a chunk and a
// flush per 4 KiB, which cost twice nginx's CPU for a large upload, and
// three and a half times for a chunked one. A trickling upload holds only
// a 4 KiB buffer (copyGrowing).
func (b *clientBody) WriteTo(w io.Writer) (int64, error) {
	small := uploadBufPool.Get().(*[]byte)
	defer uploadBufPool.Put(small)
	defer b.endHold()
	if b.bw == nil {
		return copyGrowing(w, b, *small)
	}
	if b.size < 0 {
		// fasthttp read none of a chunked body before the handler: its
		// first chunk may be a while coming (an upload fed by a command's
		// output), and the sandbox is not to wait for it to see the
		// request (or answer its head alone, a 401). A Content-Length body
		// has its first bytes read already (fasthttpPreRead).
		if err := b.bw.Flush(); err != nil {
			return 0, err
		}
	}
	b.dst = w
	if b.size < 0 && b.hold != nil {
		b.coalesce = true
		b.hold.setReadHook((*uploadWriter)(b))
	}
	n, err := copyGrowing((*uploadWriter)(b), b, *small)
	if b.coalesce {
		b.hold.setReadHook(nil)
		// What the copy read last, up to the body's end or a failure
		// (which the pieces before it reached the sandbox ahead of, as
		// they did before pieces waited).
		if ferr := (*uploadWriter)(b).flushPending(); err == nil {
			err = ferr
		}
		b.coalesce = false
	}
	b.dst = nil
	return n, err
}

// uploadWriter is a clientBody seen as the writer its pieces are copied
// to: each goes to fasthttp's body writer (dst), and then on to the
// sandbox at once. fasthttp frames and flushes each piece of a chunked
// body, but a Content-Length body only fills the request's 4 KiB writer
// (bw), which it flushes when full: what a client sent in smaller pieces
// waited there, unseen by the sandbox, for as long as the client paused
// (a slow uploader's last few KiB, the head of a file a sandbox checks
// before it takes the rest), and a sandbox's own body timeout saw silence
// the client never made. A piece that fills the writer goes straight to
// the connection and leaves nothing to flush: large uploads pay nothing.
type uploadWriter clientBody

// Write sends p on. A chunked body's small pieces wait (coalesce) while
// fasthttp's reader still holds the client's bytes: it hands the copy one
// chunk a read, and a body sent as 1-byte chunks cost a chunk, a flush and
// a write syscall to the sandbox each (256 KiB in 1-byte chunks: 0.89 s of CPU, against
// 5 ms in one chunk). They go out together before the next read of the
// client's connection (beforeRead), the read that may wait for the
// client: a trickle reaches the sandbox piece by piece, as before.
func (u *uploadWriter) Write(p []byte) (int, error) {
	if u.werr != nil {
		return 0, u.werr
	}
	if u.coalesce {
		if u.pend != nil && len(*u.pend)+len(p) > cap(*u.pend) {
			if err := u.flushPending(); err != nil {
				return 0, err
			}
		}
		if len(p) < uploadSmallBuf {
			if u.pend == nil {
				u.pend = uploadBufPool.Get().(*[]byte)
				*u.pend = (*u.pend)[:0]
			}
			*u.pend = append(*u.pend, p...)
			return len(p), nil
		}
	}
	return u.write(p)
}

// write sends p to the sandbox at once.
func (u *uploadWriter) write(p []byte) (int, error) {
	n, err := u.dst.Write(p)
	if err == nil && u.bw.Buffered() > 0 {
		err = u.bw.Flush()
	}
	return n, err
}

// flushPending sends the pieces waiting, if any, and gives their buffer
// back; a failure is kept (werr).
func (u *uploadWriter) flushPending() error {
	if u.pend == nil {
		return nil
	}
	_, err := u.write(*u.pend)
	*u.pend = (*u.pend)[:cap(*u.pend)]
	uploadBufPool.Put(u.pend)
	u.pend = nil
	if err != nil {
		u.werr = err
	}
	return err
}

// beforeRead is the client connection's read hook (readHook) while a
// chunked body is copied: the pieces waiting go to the sandbox before the
// read, which may wait for the client. The write's time is the sandbox's:
// the client's deadline is renewed after it, and the drain's cut or an
// early answer meanwhile ends the read as it would the copy's next one.
// A failed write ends the read too, with the sandbox's error, which the
// body's Read returns in place of what fasthttp's reader makes of it.
func (u *uploadWriter) beforeRead() error {
	if u.pend == nil {
		return nil
	}
	b := (*clientBody)(u)
	err := b.stopped()
	if err == nil {
		err = u.flushPending()
	}
	if err == nil {
		b.renew()
		err = b.stopped()
	}
	if err != nil && u.werr == nil {
		u.werr = err
	}
	return err
}

// Close is fasthttp letting go of b.
func (b *clientBody) Close() error {
	b.closed = true
	b.release()
	return nil
}

// bytesRead is forward letting go of b; it reports what b read, and
// whether that was the whole body.
func (b *clientBody) bytesRead() (n int64, ended bool) {
	n, ended = b.n, b.eof
	b.counted = true
	b.release()
	return n, ended
}

// fasthttpDiscardLimit is how much of a request body fasthttp reads and
// drops after the handler to keep the connection (maxUnreadStreamBodySize);
// with more left it closes the connection at once.
const fasthttpDiscardLimit = 256 << 10

// bodyLeft reports whether the client may still be sending more of its
// body than fasthttp would drop to keep the connection: the answer went
// out before the body was read (x.bytesIn is what was).
func bodyLeft(ctx *fasthttp.RequestCtx, x *exchange) bool {
	switch cl := ctx.Request.Header.ContentLength(); {
	case x.bodyEnded:
		return false
	case cl == -1: // chunked: what is left is unknown
		return true
	default:
		return int64(cl)-x.bytesIn > fasthttpDiscardLimit
	}
}

// release returns b to its pool once both fasthttp and forward are done.
// Both run on the connection's goroutine.
func (b *clientBody) release() {
	if b.closed && b.counted {
		*b = clientBody{}
		clientBodyPool.Put(b)
	}
}
