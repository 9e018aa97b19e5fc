package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/valyala/fasthttp"
)

// rawConn is a minimal HTTP/1.1 keep-alive client over one TCP connection:
// requests are pre-built byte slices, response headers are parsed by
// fasthttp's zero-allocation parser and bodies are discarded in place, so the
// load generator spends its CPU on syscalls rather than on HTTP machinery.
type rawConn struct {
	addr string
	conn net.Conn
	br   *bufio.Reader
	hdr  fasthttp.ResponseHeader
	bufN int
	// deadline, when set, bounds every connection's life so that a hung
	// subject cannot hang the load generator.
	deadline time.Time
	// Redials counts reconnections after the server closed the connection.
	redials int64
}

func newRawConn(addr string, readBuf int) *rawConn {
	c := &rawConn{addr: addr, bufN: readBuf}
	c.hdr.DisableNormalizing()
	return c
}

func (c *rawConn) dial() error {
	conn, err := net.DialTimeout("tcp", c.addr, 5*time.Second)
	if err != nil {
		return fmt.Errorf("dial %s: %w", c.addr, err)
	}
	c.conn = conn
	if !c.deadline.IsZero() {
		_ = conn.SetDeadline(c.deadline)
	}
	if c.br == nil {
		c.br = bufio.NewReaderSize(conn, c.bufN)
	} else {
		c.br.Reset(conn)
	}
	return nil
}

func (c *rawConn) close() {
	if c.conn != nil {
		_ = c.conn.Close()
		c.conn = nil
	}
}

// roundTrip sends req and reads the whole response, returning the status
// and the number of body bytes (after de-chunking).
func (c *rawConn) roundTrip(req []byte) (status int, body int64, err error) {
	if c.conn == nil {
		if err := c.dial(); err != nil {
			return 0, 0, err
		}
		c.redials++
	}
	if _, err := c.conn.Write(req); err != nil {
		c.close()
		return 0, 0, fmt.Errorf("write request: %w", err)
	}
	if err := c.hdr.Read(c.br); err != nil {
		c.close()
		return 0, 0, fmt.Errorf("read response header: %w", err)
	}
	status = c.hdr.StatusCode()
	body, err = discardBody(c.br, c.hdr.ContentLength())
	if err != nil || c.hdr.ConnectionClose() || c.hdr.ContentLength() == -2 {
		c.close()
	}
	if err != nil {
		return status, body, fmt.Errorf("read response body: %w", err)
	}
	return status, body, nil
}

// discardBody consumes one response body framed by contentLength as
// fasthttp reports it (-1 chunked, -2 until EOF).
func discardBody(br *bufio.Reader, contentLength int) (int64, error) {
	switch {
	case contentLength >= 0:
		n, err := br.Discard(contentLength)
		return int64(n), err
	case contentLength == -1:
		var total int64
		for {
			size, err := readChunkSize(br)
			if err != nil {
				return total, err
			}
			if size == 0 {
				return total, skipTrailers(br)
			}
			n, err := br.Discard(int(size))
			total += int64(n)
			if err != nil {
				return total, err
			}
			if _, err := br.Discard(2); err != nil {
				return total, err
			}
		}
	default:
		n, err := io.Copy(io.Discard, br)
		return n, err
	}
}

var errBadChunk = errors.New("malformed chunk size line")

// readChunkSize parses "<hex>[;ext]\r\n".
func readChunkSize(br *bufio.Reader) (int64, error) {
	line, err := br.ReadSlice('\n')
	if err != nil {
		return 0, fmt.Errorf("read chunk size: %w", err)
	}
	var n int64
	digits := 0
	for _, b := range line {
		var d byte
		switch {
		case b >= '0' && b <= '9':
			d = b - '0'
		case b >= 'a' && b <= 'f':
			d = b - 'a' + 10
		case b >= 'A' && b <= 'F':
			d = b - 'A' + 10
		default:
			if digits == 0 {
				return 0, errBadChunk
			}
			return n, nil
		}
		if digits++; digits > 15 {
			return 0, errBadChunk
		}
		n = n<<4 | int64(d)
	}
	return 0, errBadChunk
}

func skipTrailers(br *bufio.Reader) error {
	for i := 0; i < 64; i++ {
		line, err := br.ReadSlice('\n')
		if err != nil {
			return fmt.Errorf("read trailer: %w", err)
		}
		if len(line) <= 2 {
			return nil
		}
	}
	return errors.New("too many trailer lines")
}

// bodyStream yields a response body piece by piece as it arrives, without
// copying: each slice is valid until the next call.
type bodyStream struct {
	br       *bufio.Reader
	mode     int // contentLength as fasthttp reports it
	left     int64
	needCRLF bool
	done     bool
}

func newBodyStream(br *bufio.Reader, contentLength int) *bodyStream {
	s := &bodyStream{br: br, mode: contentLength}
	if contentLength >= 0 {
		s.left = int64(contentLength)
	}
	return s
}

func (s *bodyStream) next() ([]byte, error) {
	if s.done {
		return nil, io.EOF
	}
	switch {
	case s.mode >= 0 && s.left == 0:
		s.done = true
		return nil, io.EOF
	case s.mode == -1 && s.left == 0:
		if s.needCRLF {
			if _, err := s.br.Discard(2); err != nil {
				return nil, err
			}
			s.needCRLF = false
		}
		size, err := readChunkSize(s.br)
		if err != nil {
			return nil, err
		}
		if size == 0 {
			s.done = true
			if err := skipTrailers(s.br); err != nil {
				return nil, err
			}
			return nil, io.EOF
		}
		s.left = size
	}
	if s.br.Buffered() == 0 {
		if _, err := s.br.Peek(1); err != nil {
			if err == io.EOF && s.mode == -2 {
				s.done = true
			}
			return nil, err
		}
	}
	n := s.br.Buffered()
	if s.mode != -2 && int64(n) > s.left {
		n = int(s.left)
	}
	b, _ := s.br.Peek(n)
	_, _ = s.br.Discard(n)
	if s.mode != -2 {
		s.left -= int64(n)
		if s.mode == -1 && s.left == 0 {
			s.needCRLF = true
		}
	}
	return b, nil
}
