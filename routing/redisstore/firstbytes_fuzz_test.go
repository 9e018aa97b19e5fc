package redisstore

import (
	"bytes"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"unicode/utf8"
)

// FuzzFirstBytes holds the reply guard's reading of a server's first bytes
// (refusal, notRESP), the one place an unknown server's bytes are judged
// before any RESP parsing, to what TestLookupNamesWrongKindOfServer and
// TestLookupRefusedConnectionNamesRedisReason rely on, whatever the bytes
// and however reads cut them: go-redis gets a prefix of what the server
// sent and nothing else; a first read that cannot begin a RESP reply is a
// notRedisError naming the server, quoting at most 64 bytes of its first
// line; a first read holding Redis's refusal is a refusedConnError with
// that line.
func FuzzFirstBytes(f *testing.F) {
	f.Add([]byte("HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain\r\n\r\n"), []byte{200})
	f.Add([]byte("-DENIED Redis is running in protected mode\r\n"), []byte{3})
	f.Add([]byte("-ERR max number of clients reached\r\n"), []byte{0})
	f.Add([]byte("*4\r\n$6\r\nHostIP\r\n$8\r\n10.0.0.1\r\n"), []byte{1, 3, 7})
	f.Add([]byte("%1\r\n+server\r\n+redis\r\n"), []byte{})
	f.Add([]byte("\x16\x03\x01\x00\xa5\x01"), []byte{2})
	f.Add([]byte(strings.Repeat("x", 100)+"\n"), []byte{255})
	f.Fuzz(func(t *testing.T, data, cuts []byte) {
		const addr = "192.0.2.7:6379"
		src := &cutConn{data: data, cuts: cuts}
		c := guard(src, certNotAsked, true)
		var got []byte
		buf := make([]byte, 512)
		var err error
		reads := 0
		for err == nil && reads < len(data)+2 {
			var n int
			n, err = c.Read(buf)
			got = append(got, buf[:n]...)
			reads++
		}
		if !bytes.HasPrefix(data, got) {
			t.Fatalf("%q cut %v: go-redis got %q, no prefix of it", data, cuts, got)
		}
		if len(data) == 0 {
			if err != io.EOF {
				t.Fatalf("no bytes: err %v, want io.EOF", err)
			}
			return
		}
		first := src.first
		line, _, _ := bytes.Cut(first, []byte("\r\n"))
		isRefusal := bytes.HasPrefix(line, []byte("-DENIED ")) || bytes.HasPrefix(line, []byte("-ERR max number of clients reached"))
		var refused *refusedConnError
		var notRedis *notRedisError
		switch {
		case isRefusal:
			if !errors.As(err, &refused) || len(got) != 0 || refused.reason != string(line[1:]) {
				t.Fatalf("first read %q: err %v after %q, want the refusal %q alone", first, err, got, line[1:])
			}
		case strings.IndexByte("+-:$*_,#!=(%~>|", data[0]) < 0:
			if !errors.As(err, &notRedis) || len(got) != 0 {
				t.Fatalf("first read %q: err %v after %q, want a notRedisError alone", first, err, got)
			}
			q := []byte(notRedis.first)
			firstLine, _, _ := bytes.Cut(first, []byte("\n"))
			if len(q) > 64 || bytes.IndexByte(q, '\n') >= 0 || !bytes.HasPrefix(firstLine, q) {
				t.Fatalf("first read %q: quoted %q, want at most 64 bytes of its first line", first, q)
			}
			if msg := err.Error(); !strings.Contains(msg, addr) || !utf8.ValidString(msg) {
				t.Fatalf("first read %q: error %q does not name %s in valid UTF-8", first, msg, addr)
			}
		default:
			if errors.As(err, &refused) || errors.As(err, &notRedis) {
				t.Fatalf("%q: a RESP type byte first, refused as %v", data, err)
			}
		}
	})
}

// cutConn is a server that sends data in pieces whose sizes cuts gives in
// turn (0 as 1, the last size repeated), then closes; first is the piece
// of the first read.
type cutConn struct {
	net.Conn
	data, cuts, first []byte
	k                 int
}

func (c *cutConn) Read(p []byte) (int, error) {
	if len(c.data) == 0 {
		return 0, io.EOF
	}
	size := 1
	if len(c.cuts) > 0 {
		size = max(1, int(c.cuts[min(c.k, len(c.cuts)-1)]))
	}
	c.k++
	n := copy(p, c.data[:min(size, len(c.data))])
	if c.first == nil {
		c.first = c.data[:n]
	}
	c.data = c.data[n:]
	return n, nil
}

func (c *cutConn) RemoteAddr() net.Addr {
	return &net.TCPAddr{IP: net.IPv4(192, 0, 2, 7), Port: 6379}
}
