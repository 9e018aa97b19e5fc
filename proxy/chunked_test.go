package proxy

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http/httputil"
	"os"
	"strings"
	"testing"
	"time"
)

// done reports whether the last chunk and the trailer section were read
// completely, so the connection stands at the next response. The proxy
// learns this from Read's io.EOF; the tests check the state directly.
func (c *chunkedReader) done() bool { return c.state == chunkDone }

// chunkValidCases are well-formed bodies and what they decode to.
var chunkValidCases = []struct {
	name, in, want string
}{
	{"empty body", "0\r\n\r\n", ""},
	{"one chunk", "5\r\nhello\r\n0\r\n\r\n", "hello"},
	{"two chunks", "5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n", "hello world"},
	{"upper and lower hex", "A\r\n0123456789\r\na\r\nabcdefghij\r\n0\r\n\r\n", "0123456789abcdefghij"},
	{"leading zeros", "000000000000005\r\nhello\r\n000\r\n\r\n", "hello"},
	{"extensions", "5;foo=bar\r\nhello\r\n1;a;b=\"q;\\\"x\"\r\n!\r\n0;last\r\n\r\n", "hello!"},
	{"empty extension", "5;\r\nhello\r\n0\r\n\r\n", "hello"},
	{"whitespace before extension", "5 \t;x=y\r\nhello\r\n0\r\n\r\n", "hello"},
	{"whitespace before line end", "5  \r\nhello\r\n0\r\n\r\n", "hello"},
	{"trailers", "5\r\nhello\r\n0\r\nX-Checksum: abc\r\nX-Empty:\r\n\r\n", "hello"},
	{"data looks like framing", "7\r\n0\r\n\r\n\r\n\r\n0\r\n\r\n", "0\r\n\r\n\r\n"},
	{"many tiny chunks", strings.Repeat("1\r\nx\r\n", 500) + "0\r\n\r\n", strings.Repeat("x", 500)},
	{"chunk larger than buffer", "1388\r\n" + chunkPattern(5000) + "\r\n0\r\n\r\n", chunkPattern(5000)},
	{"size line at limit", "1;" + strings.Repeat("e", maxChunkLine-4) + "\r\nz\r\n0\r\n\r\n", "z"},
	{"trailers at limit", "1\r\nz\r\n0\r\nX: " + strings.Repeat("v", maxChunkTrailer-7) + "\r\n\r\n", "z"},
}

// chunkInvalidCases are broken bodies and the error class each must give.
var chunkInvalidCases = []struct {
	name, in string
	err      error
}{
	{"nothing", "", io.ErrUnexpectedEOF},
	{"size without line end", "5", io.ErrUnexpectedEOF},
	{"truncated data", "5\r\nhel", io.ErrUnexpectedEOF},
	{"no CRLF after data yet", "5\r\nhello", io.ErrUnexpectedEOF},
	{"no last chunk", "5\r\nhello\r\n", io.ErrUnexpectedEOF},
	{"no trailer end", "5\r\nhello\r\n0\r\n", io.ErrUnexpectedEOF},
	{"trailer cut", "0\r\nX-A: 1\r\n", io.ErrUnexpectedEOF},
	{"final CR only", "0\r\n\r", io.ErrUnexpectedEOF},
	{"huge size, no data", "fffffffffffffff\r\nabc", io.ErrUnexpectedEOF},
	{"bare LF after size", "5\nhello\r\n0\r\n\r\n", errBadChunk},
	{"bare LF after extension", "5;x\nhello\r\n0\r\n\r\n", errBadChunk},
	{"bare LF last line", "5\r\nhello\r\n0\r\n\n", errBadChunk},
	{"bare LF in trailer", "5\r\nhello\r\n0\r\nX-A: 1\n\r\n", errBadChunk},
	{"empty size", "\r\nhello\r\n0\r\n\r\n", errBadChunk},
	{"only extension", ";x\r\nhello\r\n0\r\n\r\n", errBadChunk},
	{"non-hex size", "xyz\r\n", errBadChunk},
	{"0x prefix", "0x5\r\nhello\r\n0\r\n\r\n", errBadChunk},
	{"sign", "+5\r\nhello\r\n0\r\n\r\n", errBadChunk},
	{"negative", "-1\r\n", errBadChunk},
	{"leading space", " 5\r\nhello\r\n0\r\n\r\n", errBadChunk},
	{"space inside size", "5 5\r\n", errBadChunk},
	{"sixteen digits", "0000000000000005\r\nhello\r\n0\r\n\r\n", errBadChunk},
	{"overflow", "10000000000000000\r\n", errBadChunk},
	{"size line too long", "1;" + strings.Repeat("e", maxChunkLine-3) + "\r\nz\r\n0\r\n\r\n", errBadChunk},
	{"endless extension", "1;" + strings.Repeat("e", 10000), errBadChunk},
	{"CR inside size line", "5\r \nhello\r\n0\r\n\r\n", errBadChunk},
	{"CR inside extension", "5;a\rb\r\nhello\r\n0\r\n\r\n", errBadChunk},
	{"data too long", "5\r\nhelloX\r\n0\r\n\r\n", errBadChunk},
	{"data too short", "5\r\nhell\r\n0\r\n\r\n", errBadChunk},
	{"bare LF after data", "5\r\nhello\n0\r\n\r\n", errBadChunk},
	{"CR then junk after data", "5\r\nhello\rX0\r\n\r\n", errBadChunk},
	{"trailer without colon", "0\r\nX-A\r\n\r\n", errBadChunk},
	{"next response as trailer", "0\r\nHTTP/1.1 200 OK\r\n\r\n", errBadChunk},
	{"trailer with empty name", "0\r\n: v\r\n\r\n", errBadChunk},
	{"trailer folded", "0\r\nX-A: 1\r\n more\r\n\r\n", errBadChunk},
	{"space before colon", "0\r\nX-A : 1\r\n\r\n", errBadChunk},
	{"CR inside trailer", "0\r\nX-A: 1\r2\r\n\r\n", errBadChunk},
	{"junk after final CR", "0\r\n\rX", errBadChunk},
	{"trailers too large", "1\r\nz\r\n0\r\nX: " + strings.Repeat("v", maxChunkTrailer-6) + "\r\n\r\n", errBadChunk},
	{"endless trailers", "0\r\n" + strings.Repeat("X-A: 1\r\n", 3000), errBadChunk},
}

// chunkNext is a second body after each test body on the same connection:
// decoding it proves the first one stopped exactly at its end.
const chunkNext = "3\r\nxyz\r\n0\r\n\r\n"

// chunkPattern returns n bytes that do not repeat with any short period,
// so a misplaced copy shows up.
func chunkPattern(n int) string {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte('a' + (i*7+i/26)%26)
	}
	return string(b)
}

// chunkPieces hands out data at most max bytes per Read, like a slow
// network, so buffer refills land everywhere.
type chunkPieces struct {
	data []byte
	max  int
}

// Read returns the next piece.
func (r *chunkPieces) Read(p []byte) (int, error) {
	if len(r.data) == 0 {
		return 0, io.EOF
	}
	n := copy(p[:min(len(p), r.max)], r.data)
	r.data = r.data[n:]
	return n, nil
}

// errNotYet is arrivedSoFar's answer once its bytes are read: a
// connection with nothing more to read yet.
var errNotYet = errors.New("nothing more yet")

// arrivedSoFar is a connection that brought data and then nothing more
// yet.
type arrivedSoFar struct{ data []byte }

func (r *arrivedSoFar) Read(p []byte) (int, error) {
	if len(r.data) == 0 {
		return 0, errNotYet
	}
	n := copy(p, r.data)
	r.data = r.data[n:]
	return n, nil
}

// chunkReadAll reads c to its end and fails the test if it never ends.
func chunkReadAll(t testing.TB, c *chunkedReader, readSize int) ([]byte, error) {
	t.Helper()
	var out []byte
	p := make([]byte, readSize)
	for idle := 0; idle < 1000 && len(out) < 1<<28; {
		n, err := c.Read(p)
		if n < 0 || n > len(p) {
			t.Fatalf("Read returned n=%d for len(p)=%d", n, len(p))
		}
		out = append(out, p[:n]...)
		if err != nil {
			return out, err
		}
		if n == 0 {
			idle++
		} else {
			idle = 0
		}
	}
	t.Fatal("Read never reached an error or EOF")
	return nil, nil
}

// chunkConfigs are the buffer, read and piece sizes every table case runs with.
var chunkConfigs = []struct{ buf, read, piece int }{
	{16, 1, 1}, {16, 7, 5}, {16, 4096, 1 << 20},
	{64, 3, 1}, {64, 64, 1 << 20}, {64, 10000, 13},
	{4096, 1, 1 << 20}, {4096, 4096, 1}, {4096, 10000, 1 << 20},
}

// TestChunkedValid decodes well-formed bodies through many buffer layouts.
func TestChunkedValid(t *testing.T) {
	for _, tc := range chunkValidCases {
		for _, cfg := range chunkConfigs {
			t.Run(fmt.Sprintf("%s/buf%d/read%d/piece%d", tc.name, cfg.buf, cfg.read, cfg.piece), func(t *testing.T) {
				br := bufio.NewReaderSize(&chunkPieces{data: []byte(tc.in + chunkNext), max: cfg.piece}, cfg.buf)
				var c chunkedReader
				c.reset(br)
				got, err := chunkReadAll(t, &c, cfg.read)
				if err != io.EOF {
					t.Fatalf("err = %v, want io.EOF", err)
				}
				if string(got) != tc.want {
					t.Fatalf("body = %q, want %q", chunkShort(got), chunkShort([]byte(tc.want)))
				}
				if !c.done() {
					t.Fatal("done() = false after io.EOF")
				}
				if n, err := c.Read(make([]byte, 8)); n != 0 || err != io.EOF {
					t.Fatalf("Read after EOF = %d, %v", n, err)
				}

				c.reset(br)
				if c.done() {
					t.Fatal("done() = true after reset")
				}
				got, err = chunkReadAll(t, &c, cfg.read)
				if err != io.EOF || string(got) != "xyz" || !c.done() {
					t.Fatalf("next body = %q, %v, done=%v; want \"xyz\", EOF, true", got, err, c.done())
				}
				if rest, _ := io.ReadAll(br); len(rest) != 0 {
					t.Fatalf("%d bytes left after the next body", len(rest))
				}
			})
		}
	}
}

// chunkShort abbreviates long bodies in failure messages.
func chunkShort(b []byte) string {
	if len(b) > 80 {
		return fmt.Sprintf("%s...(%d bytes)", b[:80], len(b))
	}
	return string(b)
}

// TestChunkedInvalid checks that broken bodies fail, with a sticky error,
// under every buffer layout.
func TestChunkedInvalid(t *testing.T) {
	for _, tc := range chunkInvalidCases {
		for _, cfg := range chunkConfigs {
			t.Run(fmt.Sprintf("%s/buf%d/read%d/piece%d", tc.name, cfg.buf, cfg.read, cfg.piece), func(t *testing.T) {
				br := bufio.NewReaderSize(&chunkPieces{data: []byte(tc.in), max: cfg.piece}, cfg.buf)
				var c chunkedReader
				c.reset(br)
				_, err := chunkReadAll(t, &c, cfg.read)
				if !errors.Is(err, tc.err) {
					t.Fatalf("err = %v, want %v", err, tc.err)
				}
				if c.done() {
					t.Fatal("done() = true after an error")
				}
				for range 2 {
					if n, again := c.Read(make([]byte, 8)); n != 0 || again != err {
						t.Fatalf("Read after error = %d, %v; want 0, %v", n, again, err)
					}
				}
			})
		}
	}
}

// chunkScript replays a connection: a string is data (handed out across
// Reads if p is short), an error is returned once as (0, err) with nothing
// consumed, as a deadline on a net.Conn does; io.EOF follows the last step.
type chunkScript struct{ steps []any }

// Read plays the next step.
func (r *chunkScript) Read(p []byte) (int, error) {
	if len(r.steps) == 0 {
		return 0, io.EOF
	}
	switch s := r.steps[0].(type) {
	case error:
		r.steps = r.steps[1:]
		return 0, s
	case string:
		n := copy(p, s)
		if n == len(s) {
			r.steps = r.steps[1:]
		} else {
			r.steps[0] = s[n:]
		}
		return n, nil
	}
	panic("bad script step")
}

// TestChunkedResumesAfterError checks that a timeout-like error at any
// point of the framing is passed up once and the body then continues.
func TestChunkedResumesAfterError(t *testing.T) {
	hb := errors.New("heartbeat due")
	dl := os.ErrDeadlineExceeded
	cases := []struct {
		name  string
		steps []any
		want  string
	}{
		{"before first size line", []any{hb, "5\r\nhello\r\n0\r\n\r\n"}, "hello"},
		{"between chunks", []any{"5\r\nhello\r\n", hb, "3\r\nabc\r\n0\r\n\r\n"}, "helloabc"},
		{"inside size line", []any{"5\r\nhello\r\n1", hb, "0\r\n0123456789abcdef\r\n0\r\n\r\n"}, "hello0123456789abcdef"},
		{"between size CR and LF", []any{"5\r", dl, "\nhello\r\n0\r\n\r\n"}, "hello"},
		{"inside extension", []any{"5;na", hb, "me=v\r\nhello\r\n0\r\n\r\n"}, "hello"},
		{"after size line", []any{"5\r\n", hb, "hello\r\n0\r\n\r\n"}, "hello"},
		{"inside data", []any{"5\r\nhel", hb, "lo\r\n0\r\n\r\n"}, "hello"},
		{"before CRLF after data", []any{"5\r\nhello", hb, "\r\n0\r\n\r\n"}, "hello"},
		{"between CR and LF after data", []any{"5\r\nhello\r", dl, "\n0\r\n\r\n"}, "hello"},
		{"in last chunk line", []any{"5\r\nhello\r\n0", hb, "\r\n\r\n"}, "hello"},
		{"in trailers", []any{"0\r\nX-A: 1\r", hb, "\nX-B", dl, ": 2\r\n", hb, "\r", hb, "\n"}, ""},
		{"repeated errors", []any{"5\r\nhel", hb, hb, dl, "lo\r\n", dl, hb, "0\r\n\r\n"}, "hello"},
		{"long data with errors", []any{"40\r\n" + chunkPattern(20), hb, chunkPattern(64)[20:50], dl, chunkPattern(64)[50:] + "\r\n0\r\n\r\n"}, chunkPattern(64)},
	}
	for _, tc := range cases {
		var wantErrs []error
		for _, s := range tc.steps {
			if err, ok := s.(error); ok {
				wantErrs = append(wantErrs, err)
			}
		}
		for _, buf := range []int{16, 64} {
			for _, read := range []int{1, 5, 64} {
				t.Run(fmt.Sprintf("%s/buf%d/read%d", tc.name, buf, read), func(t *testing.T) {
					steps := append([]any(nil), tc.steps...)
					var c chunkedReader
					c.reset(bufio.NewReaderSize(&chunkScript{steps: steps}, buf))
					var got []byte
					var gotErrs []error
					p := make([]byte, read)
					for range 10000 {
						n, err := c.Read(p)
						got = append(got, p[:n]...)
						if err == io.EOF {
							break
						}
						if err != nil {
							if n != 0 {
								t.Fatalf("Read = %d, %v: data and a timeout together", n, err)
							}
							if c.done() {
								t.Fatal("done() = true mid-body")
							}
							gotErrs = append(gotErrs, err)
						}
					}
					if string(got) != tc.want {
						t.Fatalf("body = %q, want %q", got, tc.want)
					}
					if !c.done() {
						t.Fatal("done() = false after the body")
					}
					if fmt.Sprint(gotErrs) != fmt.Sprint(wantErrs) {
						t.Fatalf("errors = %v, want %v", gotErrs, wantErrs)
					}
				})
			}
		}
	}
}

// chunkStall hands out data in one Read, then blocks until released, as a
// backend that has nothing more to say yet.
type chunkStall struct {
	data    string
	release chan struct{}
}

// Read returns the data, then blocks.
func (r *chunkStall) Read(p []byte) (int, error) {
	if r.data != "" {
		n := copy(p, r.data)
		r.data = r.data[n:]
		return n, nil
	}
	<-r.release
	return 0, io.EOF
}

// chunkReadWithin runs one Read and fails the test if it blocks.
func chunkReadWithin(t *testing.T, c *chunkedReader, p []byte) (int, error) {
	t.Helper()
	type result struct {
		n   int
		err error
	}
	ch := make(chan result, 1)
	go func() {
		n, err := c.Read(p)
		ch <- result{n, err}
	}()
	select {
	case r := <-ch:
		return r.n, r.err
	case <-time.After(5 * time.Second):
		t.Fatal("Read blocked although it had data to return")
		return 0, nil
	}
}

// TestChunkedCoalescesWithoutBlocking checks that one Read returns every
// chunk already buffered and never waits for more once it has data.
func TestChunkedCoalescesWithoutBlocking(t *testing.T) {
	cases := []struct {
		name, sent, want string
		err              error
		done             bool
	}{
		{"two chunks", "3\r\nabc\r\n4\r\ndefg\r\n", "abcdefg", nil, false},
		{"many chunks", strings.Repeat("2\r\nab\r\n", 8), strings.Repeat("ab", 8), nil, false},
		{"ends after data", "3\r\nabc", "abc", nil, false},
		{"ends in CRLF after data", "3\r\nabc\r", "abc", nil, false},
		{"ends before size line", "3\r\nabc\r\n", "abc", nil, false},
		{"ends in size line", "3\r\nabc\r\n4", "abc", nil, false},
		{"ends before size LF", "3\r\nabc\r\n4\r", "abc", nil, false},
		{"ends in extension", "3\r\nabc\r\n4;x=", "abc", nil, false},
		{"ends in next data", "3\r\nabc\r\n4\r\nde", "abcde", nil, false},
		{"ends in trailers", "3\r\nabc\r\n0\r\nX-A: 1\r\n", "abc", nil, false},
		{"whole body", "3\r\nabc\r\n4\r\ndefg\r\n0\r\nX-A: 1\r\n\r\n", "abcdefg", io.EOF, true},
	}
	for _, tc := range cases {
		for _, buf := range []int{64, 4096} {
			t.Run(fmt.Sprintf("%s/buf%d", tc.name, buf), func(t *testing.T) {
				release := make(chan struct{})
				t.Cleanup(func() { close(release) })
				var c chunkedReader
				c.reset(bufio.NewReaderSize(&chunkStall{data: tc.sent, release: release}, buf))
				p := make([]byte, 64)
				n, err := chunkReadWithin(t, &c, p)
				if string(p[:n]) != tc.want || err != tc.err {
					t.Fatalf("Read = %q, %v; want %q, %v", p[:n], err, tc.want, tc.err)
				}
				if c.done() != tc.done {
					t.Fatalf("done() = %v, want %v", c.done(), tc.done)
				}
			})
		}
	}
}

// TestChunkedZeroLengthRead checks that an empty Read neither blocks nor
// touches the connection.
func TestChunkedZeroLengthRead(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	var c chunkedReader
	c.reset(bufio.NewReaderSize(&chunkStall{release: release}, 16))
	if n, err := chunkReadWithin(t, &c, nil); n != 0 || err != nil {
		t.Fatalf("Read(nil) = %d, %v; want 0, nil", n, err)
	}
	if n, err := chunkReadWithin(t, &c, []byte{}); n != 0 || err != nil {
		t.Fatalf("Read([]byte{}) = %d, %v; want 0, nil", n, err)
	}
}

// TestChunkedRoundTrip decodes what net/http's chunked writer produces, for
// random chunk sizes, buffer sizes and read sizes.
func TestChunkedRoundTrip(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	src := []byte(chunkPattern(1 << 16))
	for i := range 300 {
		var enc bytes.Buffer
		cw := httputil.NewChunkedWriter(&enc)
		var want []byte
		for range rng.IntN(20) {
			size := 1 + rng.IntN(3000)
			off := rng.IntN(len(src) - size)
			piece := src[off : off+size]
			if _, err := cw.Write(piece); err != nil {
				t.Fatal(err)
			}
			want = append(want, piece...)
		}
		if err := cw.Close(); err != nil {
			t.Fatal(err)
		}
		if rng.IntN(2) == 0 {
			enc.WriteString("X-Trailer: v\r\n")
		}
		enc.WriteString("\r\n" + chunkNext)

		buf := []int{16, 64, 4096}[rng.IntN(3)]
		read := 1 + rng.IntN(5000)
		piece := 1 + rng.IntN(5000)
		br := bufio.NewReaderSize(&chunkPieces{data: enc.Bytes(), max: piece}, buf)
		var c chunkedReader
		c.reset(br)
		got, err := chunkReadAll(t, &c, read)
		if err != io.EOF || !bytes.Equal(got, want) || !c.done() {
			t.Fatalf("case %d (buf %d, read %d, piece %d): %d bytes, %v, done=%v; want %d bytes, EOF, done",
				i, buf, read, piece, len(got), err, c.done(), len(want))
		}
		if rest, _ := io.ReadAll(br); string(rest) != chunkNext {
			t.Fatalf("case %d: left %q, want the next body", i, rest)
		}
	}
}

// TestChunkedNoAllocs checks that decoding, extensions and trailers
// included, allocates nothing per Read.
func TestChunkedNoAllocs(t *testing.T) {
	var body strings.Builder
	for i := range 200 {
		fmt.Fprintf(&body, "%x;i=%d\r\n%s\r\n", 1+i%97, i, chunkPattern(1+i%97))
	}
	body.WriteString("0\r\nX-A: 1\r\nX-B: 2\r\n\r\n")
	in := []byte(body.String())

	src := bytes.NewReader(in)
	br := bufio.NewReaderSize(src, 64)
	var c chunkedReader
	p := make([]byte, 100)
	reads := 0
	allocs := testing.AllocsPerRun(20, func() {
		src.Reset(in)
		br.Reset(src)
		c.reset(br)
		for {
			n, err := c.Read(p)
			reads++
			if err == io.EOF {
				return
			}
			if err != nil || n == 0 {
				panic(fmt.Sprintf("Read = %d, %v", n, err))
			}
		}
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per body (%d Reads each), want 0", allocs, reads/21)
	}
}

// FuzzChunkedReader checks that any input decodes without panic or hang,
// the same way under different buffering, and like net/http where both
// decoders accept it.
func FuzzChunkedReader(f *testing.F) {
	// The multi-kilobyte cases stay out: they make every mutation slow to
	// run and to minimize, and the table tests already cover them.
	for _, tc := range chunkValidCases {
		if len(tc.in) <= 1024 {
			f.Add([]byte(tc.in))
		}
	}
	for _, tc := range chunkInvalidCases {
		if len(tc.in) <= 1024 {
			f.Add([]byte(tc.in))
		}
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		decode := func(buf, read, piece int) ([]byte, []byte, error) {
			br := bufio.NewReaderSize(&chunkPieces{data: in, max: piece}, buf)
			var c chunkedReader
			c.reset(br)
			got, err := chunkReadAll(t, &c, read)
			if c.done() != (err == io.EOF) {
				t.Fatalf("done() = %v with err %v", c.done(), err)
			}
			if err != io.EOF && !errors.Is(err, errBadChunk) && err != io.ErrUnexpectedEOF {
				t.Fatalf("unexpected error class: %v", err)
			}
			rest, _ := io.ReadAll(br)
			return got, rest, err
		}
		// ready() says whether a Read would return without waiting for
		// the connection: a Read on what came so far must agree, wherever
		// the bytes that came so far end.
		for _, k := range []int{len(in) / 3, len(in) / 2, len(in)} {
			if k > 4096 {
				continue
			}
			br := bufio.NewReaderSize(&arrivedSoFar{data: in[:k]}, 4096)
			_, _ = br.Peek(k)
			var c chunkedReader
			c.reset(br)
			ready := c.ready()
			n, err := c.Read(make([]byte, 64))
			if waited := n == 0 && err == errNotYet; waited == ready {
				t.Fatalf("%q arrived: ready() = %v, but Read gave %d, %v", in[:k], ready, n, err)
			}
		}

		got, rest, err := decode(16, 3, 1)
		got2, rest2, err2 := decode(4096, 4096, len(in)+1)
		if err != err2 || !bytes.Equal(got, got2) {
			t.Fatalf("buffering changed the result: %q, %v vs %q, %v", got, err, got2, err2)
		}
		if err == io.EOF && !bytes.Equal(rest, rest2) {
			t.Fatalf("buffering changed where the body ends: %q vs %q", rest, rest2)
		}

		hbr := bufio.NewReader(bytes.NewReader(in))
		want, herr := io.ReadAll(httputil.NewChunkedReader(hbr))
		hrest, _ := io.ReadAll(hbr)
		// httputil stops after the last-chunk line; compare only bodies
		// whose trailer section is empty.
		if herr != nil || !bytes.HasPrefix(hrest, []byte("\r\n")) {
			return
		}
		if err != io.EOF {
			// We may be stricter, but never short of data net/http found.
			if !errors.Is(err, errBadChunk) {
				t.Fatalf("net/http decoded %q, we failed with %v", want, err)
			}
			return
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("body = %q, net/http decoded %q", got, want)
		}
		if !bytes.Equal(rest, hrest[2:]) {
			t.Fatalf("left %q after the body, net/http left %q", rest, hrest[2:])
		}
	})
}

// ready tells a chunked body whose buffered bytes hold data (or its end,
// or a framing error) from one that has only framing buffered, which a
// Read would wait past; it consumes nothing.
func TestChunkedReady(t *testing.T) {
	for _, tc := range []struct {
		name string
		read string // bytes the decoder took first,
		n    int    // n of them body bytes, by one Read
		buf  string // then buffered, unread
		want bool
	}{
		{"nothing", "", 0, "", false},
		{"size line", "", 0, "5\r\n", false},
		{"size line with extension", "", 0, "5;x=1\r\n", false},
		{"size line and data", "", 0, "5\r\nh", true},
		{"last chunk's line", "", 0, "0\r\n", false},
		{"last chunk", "", 0, "0\r\n\r\n", true},
		{"a trailer, no end", "", 0, "0\r\nX-T: 1\r\n", false},
		{"bad size", "", 0, "x\r\n", true},
		{"after data, its line end", "5\r\nhello", 5, "\r\n", false},
		{"after data, the next chunk", "5\r\nhello", 5, "\r\n3\r\nabc", true},
		{"mid chunk", "5\r\nhel", 3, "lo", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			br := bufio.NewReaderSize(strings.NewReader(tc.read+tc.buf), 64)
			c := decodedThenBuffered(t, br, tc.read, tc.n, tc.buf)
			if got := c.ready(); got != tc.want {
				t.Errorf("ready() = %v, want %v", got, tc.want)
			}
			if br.Buffered() != len(tc.buf) {
				t.Errorf("ready consumed %d bytes", len(tc.buf)-br.Buffered())
			}
		})
	}
}

// framingError judges every byte buffered, the last one too ("3\n" is
// broken only by its LF), consumes none, and leaves a decoder already in
// chunk data alone: what follows is the body's, reported by Read.
func TestChunkedFramingError(t *testing.T) {
	for _, tc := range []struct {
		name string
		read string // bytes the decoder took first,
		n    int    // n of them body bytes, by one Read
		buf  string // then buffered, unread
		want bool   // an error
	}{
		{"nothing", "", 0, "", false},
		{"size line", "", 0, "5\r\n", false},
		{"size line and data", "", 0, "5\r\nhello\r\n", false},
		{"incomplete size line", "", 0, "5\r", false},
		{"size not hex", "", 0, "zz\r\n", true},
		{"bare LF after size, last byte", "", 0, "3\n", true},
		{"size line too long", "", 0, "3;" + strings.Repeat("e", maxChunkLine) + "\r\n", true},
		{"bad trailer", "", 0, "0\r\n:x\r\n\r\n", true},
		{"mid chunk, broken after", "5\r\nhel", 3, "lo\r\nzz\r\n", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			br := bufio.NewReaderSize(strings.NewReader(tc.read+tc.buf), 2*maxChunkLine)
			c := decodedThenBuffered(t, br, tc.read, tc.n, tc.buf)
			if err := c.framingError(); (err != nil) != tc.want {
				t.Errorf("framingError() = %v, want an error: %v", err, tc.want)
			}
			if br.Buffered() != len(tc.buf) {
				t.Errorf("framingError consumed %d bytes", len(tc.buf)-br.Buffered())
			}
		})
	}
}

// decodedThenBuffered returns a chunked decoder over br that has taken read
// (n of its bytes as body, by one Read) and has buf buffered behind it,
// unread: the state ready and framingError judge.
func decodedThenBuffered(t *testing.T, br *bufio.Reader, read string, n int, buf string) *chunkedReader {
	t.Helper()
	c := new(chunkedReader)
	c.reset(br)
	if n > 0 {
		if _, err := br.Peek(len(read)); err != nil {
			t.Fatal(err)
		}
		if got, err := c.Read(make([]byte, n)); got != n || err != nil {
			t.Fatalf("read %d, %v", got, err)
		}
	}
	if len(buf) > 0 {
		if _, err := br.Peek(len(buf)); err != nil {
			t.Fatal(err)
		}
	}
	return c
}
