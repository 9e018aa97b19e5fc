package proxy

import (
	"bytes"
	"slices"
	"testing"
)

// sseEvent is one event an EventSource dispatches.
type sseEvent struct{ typ, data, id string }

// sseEvents parses an event stream as the WHATWG HTML standard says
// (9.2.6): lines end at CRLF, LF or CR; a blank line dispatches the data
// buffer; comments and unknown fields are ignored. It is the reference
// the heartbeat's placement is checked against.
func sseEvents(stream []byte) []sseEvent {
	var out []sseEvent
	var typ, id string
	var data bytes.Buffer
	stream = bytes.TrimPrefix(stream, []byte("\uFEFF"))
	for len(stream) > 0 {
		i := bytes.IndexAny(stream, "\r\n")
		if i < 0 {
			break // an unterminated line is never processed
		}
		line := stream[:i]
		if stream[i] == '\r' && i+1 < len(stream) && stream[i+1] == '\n' {
			i++
		}
		stream = stream[i+1:]
		if len(line) == 0 {
			if data.Len() > 0 {
				d := bytes.TrimSuffix(data.Bytes(), []byte("\n"))
				out = append(out, sseEvent{typ, string(d), id})
			}
			data.Reset()
			typ = ""
			continue
		}
		if line[0] == ':' {
			continue
		}
		name, value, _ := bytes.Cut(line, []byte(":"))
		value = bytes.TrimPrefix(value, []byte(" "))
		switch string(name) {
		case "event":
			typ = string(value)
		case "data":
			data.Write(value)
			data.WriteByte('\n')
		case "id":
			if bytes.IndexByte(value, 0) < 0 {
				id = string(value)
			}
		}
	}
	return out
}

// FuzzSSEHeartbeat checks where the proxy may write its heartbeat comment
// into an event stream: after any prefix the backend sent in any reads,
// when betweenEvents says the stream is between events, writing the
// heartbeat there changes no event a client receives, whatever comes next.
func FuzzSSEHeartbeat(f *testing.F) {
	for _, s := range []string{"data: a\n\ndata: b\n\n", "data: a\r\n\r\ndata: b\r\n\r\n", "data: a\r\rdata: b\r\r",
		"data: a\n\r\ndata: b\n", "event: e\ndata: a\n\n\r\ndata: c\n\n", "id: 1\ndata: x\n\n\r\r\n\ndata:y\n\n",
		": ping\ndata: a\n\n: c\r\ndata: b\n: d\n\n", ":\r:x\r\ndata: a\r\r"} {
		f.Add([]byte(s), uint8(3))
	}
	f.Fuzz(func(t *testing.T, stream []byte, step uint8) {
		if bytes.HasPrefix(stream, []byte("\uFEFF")) {
			// A heartbeat before the sandbox's first byte would move its
			// BOM off the start of the stream: Read drops that BOM
			// (TestSSEBOMAfterHeartbeat), out of trackBoundary's reach.
			stream = stream[3:]
		}
		want := sseEvents(stream)
		var s bodyStream
		s.atBoundary = true
		piece := int(step%16) + 1
		for at := 0; at <= len(stream); {
			if s.betweenEvents() {
				with := slices.Concat(stream[:at], heartbeatLine, stream[at:])
				if got := sseEvents(with); !slices.Equal(got, want) {
					t.Fatalf("heartbeat after %q of %q: events %q, without it %q", stream[:at], stream, got, want)
				}
			}
			end := min(at+piece, len(stream))
			if end == at {
				break
			}
			s.trackBoundary(stream[at:end])
			at = end
		}
	})
}

// boundaryWalk is trackBoundary's state kept by a walk over every byte:
// the reference that the backward scan must agree with.
type boundaryWalk struct {
	lineEnds int  // line ends in a row at the end
	cr       bool // the last byte was a CR
}

func (w boundaryWalk) feed(b []byte) boundaryWalk {
	for _, c := range b {
		switch {
		case c == '\n' && w.cr:
			w.cr = false // CRLF: one line end, counted at the CR
		case c == '\n':
			w.lineEnds++
		case c == '\r':
			w.lineEnds, w.cr = w.lineEnds+1, true
		default:
			w = boundaryWalk{}
		}
	}
	return w
}

// trackBoundary reads only the end of each piece; after every piece of
// every split of streams built from the bytes that matter ('\r', '\n' and
// one other), it must say what a walk over every byte says.
func TestTrackBoundaryMatchesByteWalk(t *testing.T) {
	alphabet := []byte("\r\na")
	next := xorshift(1)
	for range 20000 {
		stream := make([]byte, next(12))
		for i := range stream {
			stream[i] = alphabet[next(len(alphabet))]
		}
		var s bodyStream
		s.atBoundary = true
		var w boundaryWalk
		for at := 0; at < len(stream); {
			end := at + 1 + next(len(stream)-at)
			s.trackBoundary(stream[at:end])
			w = w.feed(stream[at:end])
			if want := w.lineEnds >= 2; s.atBoundary != want || s.cr != w.cr {
				t.Fatalf("after %q of %q: atBoundary %v, cr %v; a byte walk says %v, %v",
					stream[:end], stream, s.atBoundary, s.cr, want, w.cr)
			}
			at = end
		}
	}
}

// xorshift returns a generator of numbers in [0, n) that gives the same
// sequence for seed every run, so a failing split can be replayed.
func xorshift(seed uint32) func(n int) int {
	rng := seed
	return func(n int) int {
		rng ^= rng << 13
		rng ^= rng >> 17
		rng ^= rng << 5
		return int(rng % uint32(n))
	}
}

// checkBetweenEvents feeds stream to trackBoundary in pieces cut where next
// says and, after each piece, wants betweenEvents to say what eventWalk's
// walk over every byte says.
func checkBetweenEvents(t *testing.T, stream []byte, next func(int) int) {
	t.Helper()
	var s bodyStream
	s.atBoundary = true
	var w eventWalk
	for at := 0; at < len(stream); {
		end := at + 1 + next(len(stream)-at)
		s.trackBoundary(stream[at:end])
		w = w.feed(stream[at:end])
		if got, want := s.betweenEvents(), w.between(); got != want {
			t.Fatalf("after %q of %q (split at %d): betweenEvents %v; a byte walk says %v", stream[:end], stream, at, got, want)
		}
		at = end
	}
}

// eventWalk is betweenEvents' reference: a walk over every byte that
// knows where each line starts.
type eventWalk struct {
	lineEnds int  // line ends in a row at the end
	cr       bool // the last byte was a CR
	midLine  bool // the last byte is a line's
	fields   bool // a line that is not a comment began since the last blank line
	started  bool // a byte was fed
}

func (w eventWalk) feed(b []byte) eventWalk {
	for _, c := range b {
		w.started = true
		switch {
		case c == '\n' && w.cr:
			w.cr = false // CRLF: one line end, counted at the CR
			continue
		case c == '\n' || c == '\r':
			w.lineEnds, w.cr, w.midLine = w.lineEnds+1, c == '\r', false
			if w.lineEnds >= 2 {
				w.fields = false
			}
			continue
		}
		if !w.midLine && c != ':' {
			w.fields = true
		}
		w.lineEnds, w.cr, w.midLine = 0, false, true
	}
	return w
}

// between is what betweenEvents must say: no byte yet, a blank line, or
// a whole line with no field line since the last blank one.
func (w eventWalk) between() bool {
	return !w.started || w.lineEnds >= 2 || w.lineEnds == 1 && !w.fields
}

// betweenEvents reads back only as far as it must; after every piece of
// every split of streams of the bytes that matter (line ends, a comment's
// colon and one other), it must say what a walk over every byte says.
func TestBetweenEventsMatchesByteWalk(t *testing.T) {
	alphabet := []byte("\r\n:a")
	next := xorshift(7)
	for range 50000 {
		stream := make([]byte, next(14))
		for i := range stream {
			stream[i] = alphabet[next(len(alphabet))]
		}
		checkBetweenEvents(t, stream, next)
	}
}

// Lines longer than lineScan, cut anywhere by the reads: lineStart passes
// over a window without a line end by IndexByte and walks back only
// through the one that holds it, whose edges the short streams above never
// reach.
func TestBetweenEventsMatchesByteWalkOnLongLines(t *testing.T) {
	next := xorshift(99)
	for range 3000 {
		var stream []byte
		for range 1 + next(8) {
			switch next(4) {
			case 0:
				stream = append(stream, bytes.Repeat([]byte("a"), next(3*lineScan))...)
			case 1:
				stream = append(stream, ':')
			case 2:
				stream = append(stream, '\n')
			default:
				stream = append(stream, '\r')
			}
		}
		for range 5 {
			checkBetweenEvents(t, stream, next)
		}
	}
}

// TestTrackBoundaryFindsEachLineEnd: every line end the SSE standard takes
// (LF, CRLF, a lone CR, mixed) closes an event, so a stream that uses any
// of them gets its heartbeat once an event is complete, and none inside
// one. A stream of lone CRs used to get none at all.
func TestTrackBoundaryFindsEachLineEnd(t *testing.T) {
	for _, tc := range []struct {
		stream string
		want   bool
	}{
		{"data: a\n\n", true},
		{"data: a\r\n\r\n", true},
		{"data: a\r\r", true},
		{"data: a\n\r", true},
		{"data: a\r\n\r", true},
		{"data: a\n", false},
		{"data: a\r\n", false},
		{"data: a\r", false},
		{"data: a\r\rdata: b\r", false},
		{"data: a\r\rdata: b\r\r", true},
	} {
		for piece := 1; piece <= len(tc.stream); piece++ {
			var s bodyStream
			for at := 0; at < len(tc.stream); at += piece {
				s.trackBoundary([]byte(tc.stream[at:min(at+piece, len(tc.stream))]))
			}
			if s.atBoundary != tc.want {
				t.Errorf("%q read %d bytes at a time: at a boundary %v, want %v", tc.stream, piece, s.atBoundary, tc.want)
			}
		}
	}
}

// BenchmarkTrackBoundary measures the boundary check of one streamed read:
// one 256 B event, and 64 KiB of them (what a detached stream reads at once
// when the sandbox sends faster than the client takes).
func BenchmarkTrackBoundary(b *testing.B) {
	event := slices.Concat([]byte("data: "), bytes.Repeat([]byte("x"), 248), []byte("\n\n"))
	for _, bc := range []struct {
		name string
		read []byte
	}{
		{"256B", event},
		{"64KiB", bytes.Repeat(event, 256)},
		// A read that ends inside an event, which betweenEvents reads back
		// into: a burst cut mid-event, and a piece of one long data line.
		{"64KiB-mid-event", bytes.Repeat(event, 256)[:64<<10-100]},
		{"64KiB-one-line", bytes.Repeat([]byte("x"), 64<<10)},
		// A read that ends one event and begins a long one: the line it
		// ends inside has a line end before it, so betweenEvents walks
		// back over it byte by byte, not by IndexByte.
		{"64KiB-event-start", slices.Concat([]byte("\n\ndata: "), bytes.Repeat([]byte("x"), 64<<10-8))},
	} {
		b.Run(bc.name, func(b *testing.B) {
			var s bodyStream
			b.SetBytes(int64(len(bc.read)))
			for b.Loop() {
				s.trackBoundary(bc.read)
			}
		})
	}
}
