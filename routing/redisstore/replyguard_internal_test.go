package redisstore

import (
	"errors"
	"strconv"
	"strings"
	"testing"
)

// TestRespScannerChunks: go-redis reads through bufio, so a reply reaches
// the guard cut anywhere: in a header, in a string's data, between the
// CR and LF. Whatever the cuts, replies within the limits pass whole and
// the scanner ends each one (its size back to 0), and one over the limits
// is refused with none of its header handed on.
func TestRespScannerChunks(t *testing.T) {
	small := "+OK\r\n" + ":42\r\n" + "$-1\r\n" + "*-1\r\n" + "*0\r\n" + "-ERR no\r\n" +
		"*4\r\n$6\r\nHostIP\r\n$8\r\n10.0.0.1\r\n$5\r\n50005\r\n$0\r\n\r\n" +
		"*2\r\n*3\r\n:0\r\n:5460\r\n*2\r\n$9\r\n127.0.0.1\r\n:7000\r\n*1\r\n*1\r\n+x\r\n" // nested, as CLUSTER SLOTS
	big := small + "$" + strconv.Itoa(MaxReplyBytes-16) + "\r\n" + strings.Repeat("x", MaxReplyBytes-16) + "\r\n"
	bad := []string{
		"*" + strconv.Itoa(MaxReplyElems+1) + "\r\n",
		"$" + strconv.Itoa(MaxReplyBytes+1) + "\r\n",
		"*2\r\n$" + strconv.Itoa(MaxReplyBytes/2) + "\r\n" + strings.Repeat("x", MaxReplyBytes/2) + "\r\n$" + strconv.Itoa(MaxReplyBytes/2) + "\r\n",
		"$99999999999999999999999\r\n",
		strings.Repeat("*1\r\n", maxReplyDepth+1),
	}
	// Cut into pieces of a few bytes, the large replies would take seconds.
	for _, cut := range []int{1, 2, 3, 7, 4096, len(big)} {
		ok := small
		if cut >= 4096 {
			ok = big
		}
		var s respScanner
		for i := 0; i < len(ok); i += cut {
			p := []byte(ok[i:min(i+cut, len(ok))])
			if n := s.feed(p); n != len(p) || s.err != nil {
				t.Fatalf("cut %d at %d: passed %d of %d: %v", cut, i, n, len(p), s.err)
			}
		}
		if s.size != 0 || s.depth != 0 || s.state != scanType {
			t.Fatalf("cut %d: after whole replies size %d depth %d state %d, want all 0", cut, s.size, s.depth, s.state)
		}
		for _, b := range bad {
			if len(b) > 4096 && cut < 4096 {
				continue
			}
			var s respScanner
			stream := ok + b
			passed := 0
			for i := 0; i < len(stream) && s.err == nil; i += cut {
				p := []byte(stream[i:min(i+cut, len(stream))])
				passed += s.feed(p)
			}
			if s.err == nil || !errors.Is(s.err, ErrReplyTooLarge) {
				t.Fatalf("cut %d, %.40q: err %v, want ErrReplyTooLarge", cut, b, s.err)
			}
			// The replies before the bad one pass; its offending header
			// (its last line) never does whole.
			if passed < len(ok) || passed >= len(stream) {
				t.Fatalf("cut %d, %.40q: passed %d of %d bytes, want the %d before it and not the offending header's end", cut, b, passed, len(stream), len(ok))
			}
		}
	}
}
