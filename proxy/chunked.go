package proxy

import (
	"bufio"
	"errors"
	"fmt"
	"io"
)

const (
	// maxChunkLine bounds a chunk-size line (extensions and line end
	// included), so a peer cannot make us skip an endless extension.
	maxChunkLine = 4096
	// maxChunkTrailer bounds the trailer section (final line end
	// included): trailers are discarded, so there is no reason to read many.
	maxChunkTrailer = 16 << 10
	// maxChunkDigits keeps a chunk size below 1<<60, far from overflowing
	// the int64 that counts the bytes left in a chunk.
	maxChunkDigits = 15
)

// errBadChunk is the root of every malformed-framing error: the connection
// is no longer at a known position and must not be reused.
var errBadChunk = errors.New("malformed chunked encoding")

// The details wrap errBadChunk once, here, so a failing Read allocates nothing.
var (
	errChunkSize     = fmt.Errorf("%w: bad chunk size", errBadChunk)
	errChunkTooLarge = fmt.Errorf("%w: chunk size too large", errBadChunk)
	errChunkLineLong = fmt.Errorf("%w: chunk size line too long", errBadChunk)
	errChunkCR       = fmt.Errorf("%w: CR not followed by LF", errBadChunk)
	errChunkLF       = fmt.Errorf("%w: LF not preceded by CR", errBadChunk)
	errChunkDataEnd  = fmt.Errorf("%w: missing CRLF after chunk data", errBadChunk)
	errChunkTrailer  = fmt.Errorf("%w: bad trailer field", errBadChunk)
	errChunkTrailers = fmt.Errorf("%w: trailer section too large", errBadChunk)
)

// chunkState is where the decoder stands in the chunked framing. Every
// framing byte moves it on by itself, so bytes can be consumed as soon as
// they are looked at: a line split across reads, or longer than the bufio
// buffer, needs no buffering of our own, and an error from the connection
// at any point leaves nothing half-consumed.
//
// Every framing line ends in CRLF: a bare LF is an error (errChunkLF),
// though RFC 9112 section 2.2 lets a recipient accept it, because net/http
// rejects it since CVE-2025-22871, a request-smuggling fix, and so does
// fasthttp; the sandbox's framing must read the same to every parser. The
// CRLF after chunk data is required exactly, as in net/http.
type chunkState uint8

const (
	chunkSize           chunkState = iota // in the hex digits of a size line
	chunkSizeWS                           // in whitespace after the digits
	chunkExt                              // in a chunk extension (skipped)
	chunkSizeLF                           // after the CR ending a size line
	chunkData                             // in chunk data; left bytes remain
	chunkDataCR                           // after chunk data, CR expected
	chunkDataLF                           // after chunk data and CR, LF expected
	chunkTrailerStart                     // at the start of a trailer line
	chunkTrailerName                      // in a trailer field name
	chunkTrailerValue                     // in a trailer field value (skipped)
	chunkTrailerFieldLF                   // after the CR ending a trailer field
	chunkTrailerEndLF                     // after the CR of the final empty line
	chunkDone                             // last chunk and trailers consumed
)

// chunkedReader decodes a chunked body (RFC 9112 section 7.1) read from br.
type chunkedReader struct {
	br      *bufio.Reader
	state   chunkState
	left    int64 // data bytes still to come in the current chunk
	size    int64 // chunk size parsed so far from the size line
	digits  int   // hex digits seen on the size line
	line    int   // bytes of the size line consumed so far
	trailer int   // bytes of the trailer section consumed so far
	err     error // sticky: malformed framing, premature EOF, or io.EOF at the end
}

// reset prepares the reader for a new body on br (the value is reused from a pool; no allocation).
func (c *chunkedReader) reset(br *bufio.Reader) { *c = chunkedReader{br: br} }

// Read returns decoded body bytes.
//
// Only a Read that has nothing yet may wait for the connection; once p holds
// data, Read goes on only through bytes already buffered, so a streamed
// event is never held back waiting for the next one. Errors from the
// connection (timeouts, heartbeat deadlines) are returned as they are and
// leave the reader able to resume; malformed framing and a premature EOF
// are sticky.
func (c *chunkedReader) Read(p []byte) (int, error) {
	if c.err != nil {
		return 0, c.err
	}
	if len(p) == 0 {
		return 0, nil
	}
	n, empty := 0, 0
	for n < len(p) {
		switch c.state {
		case chunkDone:
			c.err = io.EOF
			return n, io.EOF
		case chunkData:
			want := min(int64(len(p)-n), c.left)
			if n > 0 {
				want = min(want, int64(c.br.Buffered()))
				if want == 0 {
					return n, nil
				}
			}
			// With nothing buffered this is one read of the connection,
			// straight into p when p is at least as large as the buffer.
			m, err := c.br.Read(p[n : n+int(want)])
			n += m
			c.left -= int64(m)
			if c.left == 0 {
				c.state = chunkDataCR
			}
			if err != nil {
				return n, c.connErr(err)
			}
			if m == 0 {
				// A reader stuck at (0, nil) must not spin us forever.
				if empty++; empty >= 100 {
					return n, io.ErrNoProgress
				}
			}
		default:
			if c.br.Buffered() == 0 {
				if n > 0 {
					return n, nil
				}
				// Peek fills the buffer without consuming, so an error here
				// leaves both br and the decoder where they were.
				if _, err := c.br.Peek(1); err != nil {
					return 0, c.connErr(err)
				}
			}
			buf, _ := c.br.Peek(c.br.Buffered())
			k, err := c.parse(buf)
			_, _ = c.br.Discard(k) // k <= Buffered: cannot fail
			if err != nil {
				c.err = err
				return n, err
			}
		}
	}
	return n, nil
}

// ready reports whether Read would return at once, without waiting for
// the connection: the bytes buffered hold a body byte, the end of the
// body, or an error. Framing alone (a chunk-size line whose data has not
// come yet) is not ready. It is worked out on a copy of the decoder, so
// nothing is consumed.
func (c *chunkedReader) ready() bool {
	if c.err != nil {
		return true
	}
	buf, _ := c.br.Peek(c.br.Buffered())
	if c.state == chunkData {
		return len(buf) > 0
	}
	probe := *c
	k, err := probe.parse(buf)
	return err != nil || probe.state == chunkDone || probe.state == chunkData && k < len(buf)
}

// skipFraming consumes the bytes buffered when they hold framing alone
// (ready is false): no body byte, no end of the body, no error. A Read
// would otherwise go on to wait for the connection.
func (c *chunkedReader) skipFraming() {
	if c.ready() {
		return
	}
	buf, _ := c.br.Peek(c.br.Buffered())
	k, _ := c.parse(buf) // ready: no error
	_, _ = c.br.Discard(k)
}

// atFraming reports whether the next bytes to come are framing, not a
// chunk's data (nor is the body over).
func (c *chunkedReader) atFraming() bool {
	return c.err == nil && c.state != chunkData && c.state != chunkDone
}

// framingError returns the error Read would fail with before its first
// body byte when the bytes buffered already show the framing broken there
// (a size that is no number, a size line too long, a bare LF, a bad
// trailer), or nil. Worked out on a copy of the decoder, as ready is:
// nothing is consumed.
func (c *chunkedReader) framingError() error {
	if c.state == chunkData {
		return nil
	}
	buf, _ := c.br.Peek(c.br.Buffered())
	probe := *c
	_, err := probe.parse(buf)
	return err
}

// connErr turns an error from br into Read's result: EOF before the last
// chunk ends the body for good, anything else may pass (a timeout).
func (c *chunkedReader) connErr(err error) error {
	if err == io.EOF {
		c.err = io.ErrUnexpectedEOF
		return c.err
	}
	return err
}

// parse consumes framing bytes from buf and returns how many it used; it
// stops at chunk data, at the end of the body, or when buf runs out.
func (c *chunkedReader) parse(buf []byte) (int, error) {
	for i, b := range buf {
		switch c.state {
		case chunkSize, chunkSizeWS, chunkExt, chunkSizeLF:
			if c.line++; c.line > maxChunkLine {
				return i, errChunkLineLong
			}
			end, err := c.sizeByte(b)
			if err != nil {
				return i, err
			}
			if !end {
				continue
			}
			if c.size > 0 {
				c.left, c.state = c.size, chunkData
				return i + 1, nil
			}
			c.state = chunkTrailerStart
		case chunkDataCR:
			if b != '\r' {
				return i, errChunkDataEnd
			}
			c.state = chunkDataLF
		case chunkDataLF:
			if b != '\n' {
				return i, errChunkDataEnd
			}
			c.state, c.size, c.digits, c.line = chunkSize, 0, 0, 0
		default:
			if c.trailer++; c.trailer > maxChunkTrailer {
				return i, errChunkTrailers
			}
			if err := c.trailerByte(b); err != nil {
				return i, err
			}
			if c.state == chunkDone {
				return i + 1, nil
			}
		}
	}
	return len(buf), nil
}

// sizeByte takes one byte of a chunk-size line and reports whether it ended
// the line.
func (c *chunkedReader) sizeByte(b byte) (end bool, err error) {
	switch c.state {
	case chunkSize:
		if v, ok := hexDigit(b); ok {
			if c.digits == maxChunkDigits {
				return false, errChunkTooLarge
			}
			c.size = c.size<<4 | int64(v)
			c.digits++
			return false, nil
		}
		if c.digits == 0 {
			return false, errChunkSize
		}
		switch b {
		case ' ', '\t':
			c.state = chunkSizeWS
		case ';':
			c.state = chunkExt
		case '\r':
			c.state = chunkSizeLF
		default:
			return false, errChunkSize
		}
	case chunkSizeWS:
		// RFC 9112 allows BWS before an extension; net/http also accepts
		// it before the line end.
		switch b {
		case ' ', '\t':
		case ';':
			c.state = chunkExt
		case '\r':
			c.state = chunkSizeLF
		default:
			return false, errChunkSize
		}
	case chunkExt:
		// Extensions are ignored, but a lone CR is not let through: peers
		// that take it for a line end would frame the body differently.
		switch b {
		case '\r':
			c.state = chunkSizeLF
		case '\n':
			return false, errChunkLF
		}
	case chunkSizeLF:
		if b != '\n' {
			return false, errChunkCR
		}
		return true, nil
	}
	return false, nil
}

// trailerByte takes one byte of the trailer section. Fields are checked for
// a name and a colon: a backend that forgot the final empty line would
// otherwise have its next response swallowed as trailers.
func (c *chunkedReader) trailerByte(b byte) error {
	switch c.state {
	case chunkTrailerStart:
		switch {
		case b == '\r':
			c.state = chunkTrailerEndLF
		case isTokenChar(b):
			c.state = chunkTrailerName
		default:
			return errChunkTrailer
		}
	case chunkTrailerName:
		switch {
		case b == ':':
			c.state = chunkTrailerValue
		case !isTokenChar(b):
			return errChunkTrailer
		}
	case chunkTrailerValue:
		switch b {
		case '\r':
			c.state = chunkTrailerFieldLF
		case '\n':
			return errChunkLF
		}
	case chunkTrailerFieldLF, chunkTrailerEndLF:
		if b != '\n' {
			return errChunkCR
		}
		if c.state == chunkTrailerEndLF {
			c.state = chunkDone
		} else {
			c.state = chunkTrailerStart
		}
	}
	return nil
}

// hexDigit returns the value of the hex digit b.
func hexDigit(b byte) (byte, bool) {
	switch {
	case '0' <= b && b <= '9':
		return b - '0', true
	case 'a' <= b && b <= 'f':
		return b - 'a' + 10, true
	case 'A' <= b && b <= 'F':
		return b - 'A' + 10, true
	}
	return 0, false
}

// isTokenChar reports whether b may appear in a field name (RFC 9110 tchar).
func isTokenChar(b byte) bool {
	switch {
	case 'a' <= b && b <= 'z', 'A' <= b && b <= 'Z', '0' <= b && b <= '9':
		return true
	}
	switch b {
	case '!', '#', '$', '%', '&', '\'', '*', '+', '-', '.', '^', '_', '`', '|', '~':
		return true
	}
	return false
}
