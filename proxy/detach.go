package proxy

import (
	"errors"
	"io"
	"net"
	"time"

	"github.com/valyala/fasthttp"
)

// A long-lived SSE stream spends nearly all its life waiting for the next
// event. Written through fasthttp's response writer, every waiting stream
// keeps the connection's goroutine (with the deep stack of the response
// writer), its RequestCtx, read and write buffers, a copy buffer and the
// upstream reader: about 35 KiB of touched memory per stream. A detached
// stream hijacks the client connection once the response head is known,
// lets fasthttp recycle all of that, and waits for the backend's next byte
// without any buffer: what stays is one shallow goroutine (replacing
// fasthttp's, not added to it), the two connections and the bodyStream.
// Buffers are borrowed only while an event is being copied.

// detachable reports whether a response stream should leave fasthttp.
// GET event streams over HTTP/1.1 do: a detached stream closes the client
// connection when it ends, which suits a long-lived subscription (the
// client reconnects anyway) but not the short SSE answer to an MCP POST,
// whose connection the client reuses for its next call. So does every
// body of unknown length for an HTTP/1.0 client, which cannot read
// chunked framing (fasthttp would send it): it gets the bytes as they come
// and the end of the connection as the end of the body.
func detachable(req *fasthttp.Request, s *bodyStream) bool {
	if !canWaitReadable || s.mode == bodyFixed {
		return false
	}
	return !req.Header.IsHTTP11() || s.sse && req.Header.IsGet()
}

// detach hands the stream to its own goroutine once the handler returns.
func (p *Proxy) detach(ctx *fasthttp.RequestCtx, s *bodyStream) {
	s.detached = true
	s.unframed = !ctx.Request.Header.IsHTTP11()
	s.client = ctx.Conn()
	// fasthttp clears the connection's deadlines before the hijack: the
	// first write must arm one, not trust the deadline set for the head.
	s.clientDeadline = time.Time{}
	// The log entry is captured now, not in hijacked: an abandoned stream
	// is logged too, and fasthttp recycles the request with the connection.
	s.status = ctx.Response.StatusCode()
	s.entry = p.captureEntry(ctx, &s.x, s.status)
	p.hijack(ctx, s.hijacked, s.abandon)
	p.streams.add(s)
}

// abandon ends a stream whose hijack handler fasthttp skipped, having
// closed the client connection and recycled the request (see
// Proxy.hijack).
func (s *bodyStream) abandon() {
	s.rc = nil
	// Closed, and counted closed, by fasthttp. Under the registry lock:
	// abort, at the drain deadline, reads it under that lock from
	// another goroutine while the stream is registered.
	s.p.streams.mu.Lock()
	s.client = nil
	s.p.streams.mu.Unlock()
	s.headWritten(errClientGone)
	s.end(errClientGone)
}

// headWritten counts the request (exchange.headLater) once its head was
// written, err being the write's error. A client the write found gone
// (clientEnded: not a drain's or a kill's cut, nor a client that stopped
// reading) never got the head: logged and counted as nginx's 499, the
// sandbox's status staying in upstream_status, with no body bytes sent
// (what came with the head did not reach it either).
func (s *bodyStream) headWritten(err error) {
	if err != nil {
		s.clientEnded(err)
		if s.x.errCode == CodeClientClosed {
			s.status = statusClientClosed
			s.x.bytesOut = 0
		}
	}
	s.p.metrics.RequestDone(s.status, s.x.kind, time.Since(s.x.start)+s.x.judged)
}

// hijacked runs on fasthttp's hijack goroutine after the handler returned
// (so the response carries every header the handler set): it writes the
// response head and starts the pump. fasthttp recycles the request once it
// returns.
func (s *bodyStream) hijacked(net.Conn) {
	rc := s.rc
	s.rc = nil
	h := &rc.Response.Header
	// fasthttp may have added "Connection: keep-alive" for an HTTP/1.0
	// client, and the backend's Transfer-Encoding may still be listed.
	h.Del("Connection")
	if s.unframed {
		h.Del("Transfer-Encoding")
		h.SetContentLength(-2) // neither Content-Length nor chunked: ends with the connection
	} else {
		h.SetContentLength(-1) // chunked
	}
	h.SetConnectionClose() // the connection ends with the stream
	bp := copyBufPool.Get().(*[]byte)
	out, body, rerr := s.firstWrite(*bp, h)
	if rerr == io.EOF {
		s.countOut() // out holds the last chunk
	}
	err := s.writeBody(out, body)
	copyBufPool.Put(bp)
	s.headWritten(err)
	switch {
	case err != nil:
		s.end(err)
	case rerr == io.EOF:
		s.end(nil)
	case rerr != nil:
		s.end(rerr)
	default:
		go s.pump()
	}
}

// firstWrite renders the response head into buf and, when the first body
// bytes came with it (they usually do), frames them behind it, so the
// client gets both in one write without waiting for the pump goroutine to
// be scheduled. A body that already ended gets the last chunk too; rerr
// is then io.EOF. body is where in out the body bytes read (and counted
// out) are.
func (s *bodyStream) firstWrite(buf []byte, h *fasthttp.ResponseHeader) (out []byte, body span, rerr error) {
	out = h.AppendBytes(buf[:0])
	if !s.bodyReady() || len(out)+chunkHeadRoom+2+len(lastChunk) >= len(buf) {
		// A head that leaves no room in buf for a chunk (a sandbox may send
		// up to upstream.max_header_size, 1 MiB) goes out alone; the pump
		// sends what came with it. So does one that came with no body
		// byte (or only a chunk-size line): the head must not wait for it.
		return out, span{}, nil
	}
	start := len(out)
	if s.unframed {
		n, rerr := s.Read(buf[start:])
		return buf[:start+n], span{start, start + n}, rerr
	}
	n, rerr := s.Read(buf[start+chunkHeadRoom : len(buf)-2-len(lastChunk)])
	if n > 0 {
		chunk := frameChunk(buf[start:], n)
		// frameChunk leaves a gap before the chunk-size line when the size
		// takes fewer digits than the room kept for it: move the head up
		// against the chunk.
		gap := chunkHeadRoom + n + 2 - len(chunk)
		copy(buf[gap:gap+start], buf[:start])
		out = buf[gap : gap+start+len(chunk)]
		body = span{len(out) - 2 - n, len(out) - 2}
	}
	if rerr == io.EOF {
		out = append(out, lastChunk...)
	}
	return out, body, rerr
}

// span is where in a write the body bytes are: b[start:end].
type span struct{ start, end int }

// pump copies the body to the client until either side ends it.
func (s *bodyStream) pump() {
	err := s.copyEvents()
	if err != nil && s.clientLeft.Load() {
		err = errClientLeft
	}
	s.end(err)
}

var (
	lastChunk      = []byte("0\r\n\r\n")
	heartbeatChunk = []byte("e\r\n: keep-alive\n\n\r\n")
)

// chunkHeadRoom is reserved in front of the data for the chunk-size line.
const chunkHeadRoom = 10

// copyEvents is the detached stream's loop. Between events it holds no
// reader and no buffer: it waits until the backend's socket is readable,
// and takes the 64 KiB buffer only for a body byte. A chunked body's
// framing comes apart from its data (Go's server sends a large chunk's
// closing CRLF in a segment of its own): read with the buffer, a wake-up
// that brought only framing waited in it for the next chunk, and a
// sandbox silent after a burst held it, ≈ 78 KiB against GOMEMLIMIT
// instead of a few, until upstream.idle_timeout.
func (s *bodyStream) copyEvents() error {
	c := s.conn
	for {
		if c.br != nil && s.mode == bodyChunked {
			s.chunked.skipFraming()
		}
		if c.br != nil && c.br.Buffered() == 0 {
			s.p.releaseReader(c.br)
			c.br = nil
		}
		if c.br == nil {
			s.armHeartbeat()
			err := c.waitReadable()
			switch {
			case errors.Is(err, errHeartbeatDue):
				if clientClosed(s.client) {
					return errClientLeft
				}
				// Body bytes the client gets, counted as the sandbox's are
				// (writeBody takes off what a cut write did not send).
				s.x.bytesOut += int64(len(heartbeatLine))
				if err := s.writeBody(s.framed(heartbeatChunk, heartbeatLine), s.framedSpan(len(heartbeatChunk), len(heartbeatLine))); err != nil {
					return err
				}
				s.beatSent()
				continue
			case s.pausedIdle(err):
				continue
			case err != nil && s.drainEndsCleanly():
				s.x.drained = true
				s.countOut()
				return s.write(s.framed(lastChunk, nil)) // drain: end cleanly, the client reconnects elsewhere
			case err != nil:
				s.cut(err)
				return err
			}
			// Only for bytes to read: a heartbeat, a drain or a hang-up
			// reads nothing. A stream idle for minutes finds the pool
			// emptied by the collector, so each of those took a new
			// 16 KiB reader: a drain of 9,990 streams allocated 160 MiB.
			c.br = s.p.acquireReader(c)
			s.chunked.br = c.br
			if s.mode == bodyChunked && s.chunked.atFraming() {
				// What came may be framing alone (the CRLF after a chunk,
				// the next size line): skipFraming, at the top, consumes it
				// rather than Read wait for the chunk's data with the
				// 64 KiB buffer. Read would fill the reader here all the
				// same; in a chunk's data it reads on straight into the
				// buffer. A failed Peek is Read's to report.
				if _, err := c.br.Peek(1); err == nil {
					continue
				}
			}
		}
		bp := copyBufPool.Get().(*[]byte)
		buf := *bp
		n, rerr := s.Read(buf[chunkHeadRoom : len(buf)-2])
		var werr error
		if n > 0 {
			out := buf[chunkHeadRoom : chunkHeadRoom+n]
			body := span{0, n}
			if !s.unframed {
				out = frameChunk(buf, n)
				body = span{len(out) - 2 - n, len(out) - 2}
			}
			werr = s.writeBody(out, body)
		}
		copyBufPool.Put(bp)
		switch {
		case werr != nil:
			return werr
		case rerr == io.EOF:
			s.countOut()
			return s.write(s.framed(lastChunk, nil))
		case rerr != nil:
			return rerr
		}
	}
}

// framed picks what goes on the wire: chunked for HTTP/1.1 clients, the
// bare bytes for HTTP/1.0 ones (whose body ends with the connection).
func (s *bodyStream) framed(chunked, bare []byte) []byte {
	if s.unframed {
		return bare
	}
	return chunked
}

// framedSpan is where the n body bytes are in what framed picked: a
// chunk of size total ends with them and its CRLF.
func (s *bodyStream) framedSpan(total, n int) span {
	if s.unframed {
		return span{0, n}
	}
	return span{total - 2 - n, total - 2}
}

// frameChunk wraps the n data bytes at buf[chunkHeadRoom:] in chunk framing
// in place and returns the chunk.
func frameChunk(buf []byte, n int) []byte {
	end := chunkHeadRoom + n
	buf[end], buf[end+1] = '\r', '\n'
	i := chunkHeadRoom - 2
	buf[i], buf[i+1] = '\r', '\n'
	for v := n; ; v >>= 4 {
		i--
		buf[i] = "0123456789abcdef"[v&0xf]
		if v < 0x10 {
			break
		}
	}
	return buf[i : end+2]
}

// write sends b to the client within the client write timeout.
func (s *bodyStream) write(b []byte) error {
	_, err := s.writeN(b)
	return err
}

// writeN is write, which also returns how much of b went out.
func (s *bodyStream) writeN(b []byte) (int, error) {
	if len(b) == 0 {
		return 0, nil
	}
	if s.writeTimeout > 0 {
		s.clientDeadline = setDeadline(s.client, false, s.clientDeadline, time.Now().Add(s.writeTimeout), slack(s.writeTimeout))
	}
	return s.client.Write(b)
}

// writeBody writes b, whose bytes at body are the sandbox's, which Read
// counted out when it read them. A write the client cut (it stopped
// reading, it reset) takes off again those of them it did not send, as
// WriteTo does for a download: counted when read, a piece of up to 64 KiB
// was logged as sent that the client never got.
func (s *bodyStream) writeBody(b []byte, body span) error {
	m, err := s.writeN(b)
	if err != nil {
		sent := min(max(m-body.start, 0), body.end-body.start)
		s.x.bytesOut -= int64(body.end - body.start - sent)
	}
	return err
}
