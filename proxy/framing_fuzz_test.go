package proxy

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"testing"

	"github.com/valyala/fasthttp"
)

// framingFrom runs readHeader over in, in one read, and returns the
// response's status, fasthttp's framing (ContentLength: -1 chunked, -2 to
// the close, else the length) and the bytes the heads took.
func framingFrom(in []byte) (status, length int, heads []byte, err error) {
	c := &upstreamConn{}
	c.Conn = &piecesConn{chunkPieces: chunkPieces{data: in, max: len(in) + 1}}
	c.br = bufio.NewReaderSize(c, 4096)
	var resp fasthttp.Response
	err = c.readHeader(nil, &resp)
	rest, _ := io.ReadAll(c.br)
	heads = in[:len(in)-len(rest)]
	if err != nil {
		return 0, 0, heads, err
	}
	return resp.StatusCode(), resp.Header.ContentLength(), heads, nil
}

// fieldNamed reports whether line is a field line whose name, with the
// blanks before its colon, is name (any case).
func fieldNamed(line []byte, name string) bool {
	k, _, ok := bytes.Cut(line, []byte{':'})
	return ok && bytes.EqualFold(bytes.TrimRight(k, " \t"), []byte(name))
}

// renameField changes the first letter of every line of in named name,
// so that fasthttp no longer takes it for that field.
func renameField(in []byte, name string) []byte {
	out := bytes.Clone(in)
	for i := 0; i < len(out); {
		end := bytes.IndexByte(out[i:], '\n')
		if end < 0 {
			end = len(out) - i
		}
		if fieldNamed(out[i:i+end], name) {
			out[i] = 'X'
		}
		i += end + 1
	}
	return out
}

// The heads checkFraming judges, as readHeader reads them: a final answer
// with a Content-Length field (as fasthttp reads one: any case, blanks
// before the colon) and chunked coding is refused; a field that only
// contains the name, a body line that looks like the field, and a 101
// (whose framing fields frame nothing: the tunnel's bytes follow) pass.
func TestCheckFramingHeads(t *testing.T) {
	const te = "Transfer-Encoding: chunked\r\n"
	for _, tc := range []struct {
		name, in string
		refused  bool
	}{
		{"both", "HTTP/1.1 200 OK\r\nContent-Length: 3\r\n" + te + "\r\n", true},
		{"lower case", "HTTP/1.1 200 OK\r\n" + te + "content-length: 3\r\n\r\n", true},
		{"blank before the colon", "HTTP/1.1 200 OK\r\nContent-Length : 3\r\n" + te + "\r\n", true},
		{"bare LF head", "HTTP/1.1 200 OK\nContent-Length: 3\nTransfer-Encoding: chunked\n\n", true},
		{"after an interim answer", "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 3\r\n" + te + "\r\n", true},
		{"chunked alone", "HTTP/1.1 200 OK\r\n" + te + "\r\n0\r\n\r\n", false},
		{"length alone", "HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nabc", false},
		{"a longer field name", "HTTP/1.1 200 OK\r\nContent-Lengthy: 3\r\n" + te + "\r\n", false},
		{"a field named in a body line", "HTTP/1.1 200 OK\r\n" + te + "\r\n13\r\n\nContent-Length: 3\r\n\r\n0\r\n\r\n", false},
		{"an interim answer's length", "HTTP/1.1 103 Early Hints\r\nContent-Length: 3\r\n\r\nHTTP/1.1 200 OK\r\n" + te + "\r\n", false},
		{"101 Switching Protocols", "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nContent-Length: 0\r\n" + te + "\r\n", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, _, err := framingFrom([]byte(tc.in))
			if got := errors.Is(err, errLengthAndChunked); got != tc.refused {
				t.Fatalf("readHeader(%q) = %v; want refused as framed by both: %v", tc.in, err, tc.refused)
			}
			if !tc.refused && err != nil {
				t.Fatalf("readHeader(%q) = %v", tc.in, err)
			}
		})
	}
}

// FuzzCheckFraming checks the refusal of an answer framed both by
// Content-Length and by chunked coding on any bytes a sandbox may send:
// no panic; a refusal only when a head has a Content-Length line (by a
// plain scan of its lines; a body's lines do not count); and no answer fasthttp frames as chunked while it
// also reads a Content-Length field gets through. fasthttp drops that
// field once it sees chunked coding, so whether it read one is judged on
// the same bytes with the Transfer-Encoding lines renamed: if fasthttp
// then finds a length, the original carried both.
func FuzzCheckFraming(f *testing.F) {
	for _, s := range []string{
		"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\ncontent-length: 5\r\n\r\n",
		"HTTP/1.1 200 OK\nTransfer-Encoding: chunked\nContent-Length: 5\n\n",
		"HTTP/1.1 200 OK\r\nContent-Length : 5\r\nTransfer-Encoding: chunked\r\n\r\n",
		"HTTP/1.1 200 OK\r\nContent-Length\t: 5\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
		"HTTP/1.1 200 OK\r\nX-Content-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nabcde\r\n0\r\n\r\n",
		"HTTP/1.1 200 OK\r\nContent-Length-Range: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1a\r\n\nContent-Length: 3\r\n\r\n",
		"HTTP/1.1 100 Continue\r\nContent-Length: 3\r\n\r\nHTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
		"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nContent-Length: 0\r\nTransfer-Encoding: chunked\r\n\r\n",
		"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\nTransfer-Encoding: chunked\r\n\r\n",
		"\r\nHTTP/1.1 200 OK\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n",
		"HTTP/1.0 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
		"HTTP/1.0 200 OK\nTransfer-Encoding : Chunked\nContent-Length: 5\n\n",
		"HTTP/1.0 200 OK\r\nTransfer-Encoding: gzip\r\nContent-Length: 5\r\n\r\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		status, length, heads, err := framingFrom(in)
		if errors.Is(err, errLengthAndChunked) {
			// A bare-LF head is parsed from a copy and left unconsumed
			// when refused: it is the one at the start of the rest.
			heads = in[:len(heads)+bareLFHeadEnd(in[len(heads):])]
			found := false
			for line := range bytes.Lines(heads) {
				found = found || fieldNamed(line, "content-length")
			}
			if !found {
				t.Fatalf("refused as framed by both, with no Content-Length line in the head %q: %q", heads, in)
			}
			return
		}
		if err != nil || length != -1 || status < 200 {
			return
		}
		if _, l, _, err := framingFrom(renameField(in, "transfer-encoding")); err == nil && l >= 0 {
			t.Fatalf("chunked answer with a Content-Length fasthttp reads (%d) got through: %q", l, in)
		}
	})
}
