package redisstore

import (
	"strconv"
	"strings"
	"testing"
)

// FuzzRespScanner holds the reply guard's scanner to two things a wrong
// count would break: a stream of valid RESP2 replies (built from the
// input, strings holding any bytes, CR and LF included) passes whole
// and counts each reply once, however reads cut it; and on any input at
// all, the cuts change nothing of what is refused or counted.
func FuzzRespScanner(f *testing.F) {
	f.Add([]byte("*4\r\n$6\r\nHostIP\r\n$8\r\n10.0.0.1\r\n"), []byte{1, 3, 7})
	f.Add([]byte{5, 3, 3, 4, 'a', '\r', '\n', 'b', 2, 9}, []byte{2})
	f.Add([]byte("$99999999999\r\n"), []byte{1})
	f.Add([]byte("*-1\r\n*0\r\n$-1\r\n+OK\r\n-ERR x\r\n:7\r\n"), []byte{0, 5})
	f.Fuzz(func(t *testing.T, data, cuts []byte) {
		// Valid replies, as a Redis server writes them.
		src := data
		var stream strings.Builder
		n := 0
		for len(src) > 0 && n < 64 {
			writeReply(&stream, &src, 0)
			n++
		}
		var s respScanner
		if passed := feedCut([]byte(stream.String()), cuts, &s); passed != stream.Len() || s.err != nil {
			t.Fatalf("%d valid replies (%q): passed %d of %d bytes, err %v", n, stream.String(), passed, stream.Len(), s.err)
		}
		if got := int(s.replies.Load()); got != n || s.depth != 0 || s.state != scanType || s.size != 0 {
			t.Fatalf("%d valid replies (%q): counted %d, left depth %d state %d size %d", n, stream.String(), got, s.depth, s.state, s.size)
		}

		// Any bytes: one read or many, the same verdict.
		var whole, cut respScanner
		pw := whole.feed(data)
		pc := feedCut(data, cuts, &cut)
		if (whole.err == nil) != (cut.err == nil) || whole.replies.Load() != cut.replies.Load() {
			t.Fatalf("%q: in one read err %v, %d replies; cut %v: err %v, %d replies", data, whole.err, whole.replies.Load(), cuts, cut.err, cut.replies.Load())
		}
		if whole.err != nil && (whole.err.Reason != cut.err.Reason || pc < pw) {
			t.Fatalf("%q: in one read %q after %d bytes; cut %v: %q after %d", data, whole.err.Reason, pw, cuts, cut.err.Reason, pc)
		}
		if pw < 0 || pw > len(data) || pc < 0 || pc > len(data) {
			t.Fatalf("%q: passed %d and %d of %d bytes", data, pw, pc, len(data))
		}
	})
}

// feedCut feeds p to s in pieces whose sizes cuts gives in turn (0 as 1,
// the last size repeated), as reads through bufio hand them on, and
// returns the bytes s passed, stopping at a refusal.
func feedCut(p, cuts []byte, s *respScanner) int {
	passed := 0
	for i, k := 0, 0; i < len(p) && s.err == nil; k++ {
		size := 1
		if len(cuts) > 0 {
			size = max(1, int(cuts[min(k, len(cuts)-1)]))
		}
		piece := p[i:min(i+size, len(p))]
		passed += s.feed(piece)
		i += len(piece)
	}
	return passed
}

// writeReply writes one valid RESP2 reply to b, its shape taken from the
// front of src, which it consumes.
func writeReply(b *strings.Builder, src *[]byte, depth int) {
	next := func() byte {
		if len(*src) == 0 {
			return 0
		}
		c := (*src)[0]
		*src = (*src)[1:]
		return c
	}
	switch c := next(); c % 7 {
	case 0:
		b.WriteString("+OK\r\n")
	case 1:
		b.WriteString("-ERR " + strconv.Itoa(int(next())) + "\r\n")
	case 2:
		b.WriteString(":-" + strconv.Itoa(int(next())) + "\r\n")
	case 3: // a string of any bytes
		l := min(int(next()), len(*src))
		b.WriteString("$" + strconv.Itoa(l) + "\r\n")
		b.Write((*src)[:l])
		b.WriteString("\r\n")
		*src = (*src)[l:]
	case 4:
		b.WriteString("$-1\r\n")
	case 5:
		if depth >= maxReplyDepth-1 {
			b.WriteString("*-1\r\n")
			return
		}
		n := int(next() % 5)
		b.WriteString("*" + strconv.Itoa(n) + "\r\n")
		for range n {
			writeReply(b, src, depth+1)
		}
	case 6:
		b.WriteString("*0\r\n")
	}
}
