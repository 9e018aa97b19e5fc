package accesslog

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// interleaved is the access log's view of the shared stream: its first
// Write waits until the test has queued a burst, and before each later one
// the process log writes a line, as it may at any time.
type interleaved struct {
	out     *testenv.LogBuffer // stdout, which the process log shares: each Write lands whole
	process *slog.Logger
	entered chan struct{}
	release chan struct{}
	calls   int
}

func (w *interleaved) Write(p []byte) (int, error) {
	w.calls++
	if w.calls == 1 {
		close(w.entered)
		<-w.release
	} else {
		w.process.Warn("process log line between two access log writes")
	}
	return w.out.Write(p)
}

// Each write of the access log ends at the end of a line, so that a line
// of another writer of the same stream (the process log on stdout) cannot
// land inside one of its lines. A burst larger than the write buffer was
// written in buffer-sized pieces that ended mid-line: two broken lines
// each time the process log wrote between them.
func TestWritesEndAtLineEnds(t *testing.T) {
	for _, format := range []string{FormatJSON, FormatCube} {
		t.Run(format, func(t *testing.T) {
			out := &testenv.LogBuffer{}
			w := &interleaved{
				out: out, process: slog.New(slog.NewJSONHandler(out, nil)),
				entered: make(chan struct{}), release: make(chan struct{}),
			}
			l, err := New(Config{Format: format, Output: w}, nil)
			if err != nil {
				t.Fatal(err)
			}
			l.Log(&Entry{Time: testTime, RequestID: "first"})
			<-w.entered // the writer is held: what follows queues up
			// ≈ 3.5 write buffers of lines, none a divisor of the buffer.
			long := "/" + strings.Repeat("p", 997)
			const burst = 220
			for range burst {
				l.Log(&Entry{Time: testTime, Method: "GET", RequestURI: long, URI: long, Status: 200})
			}
			close(w.release)
			if err := l.Close(); err != nil {
				t.Fatal(err)
			}
			if l.Dropped() != 0 {
				t.Fatalf("Dropped = %d, want 0", l.Dropped())
			}
			var access, process int
			for i, ln := range strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n") {
				switch {
				case strings.Contains(ln, `"msg":"process log line`):
					var rec map[string]any
					if err := json.Unmarshal([]byte(ln), &rec); err != nil {
						t.Fatalf("line %d is broken (%v): %.200q", i, err, ln)
					}
					process++
				case format == FormatJSON:
					var rec map[string]any
					if err := json.Unmarshal([]byte(ln), &rec); err != nil {
						t.Fatalf("line %d is broken (%v): %.200q", i, err, ln)
					}
					access++
				default:
					if n := len(strings.Split(ln, cubeSep)); n != 22 {
						t.Fatalf("line %d has %d fields, want 22: %.200q", i, n, ln)
					}
					access++
				}
			}
			if access != burst+1 || process == 0 {
				t.Errorf("%d access log lines and %d process log lines, want %d and some", access, process, burst+1)
			}
		})
	}
}

// splitWriter holds its first Write until release is closed and keeps
// each write apart.
type splitWriter struct {
	entered, release chan struct{}
	writes           [][]byte // only read after Close
}

func (w *splitWriter) Write(p []byte) (int, error) {
	if len(w.writes) == 0 {
		close(w.entered)
		<-w.release
	}
	w.writes = append(w.writes, bytes.Clone(p))
	return len(p), nil
}

// Two queued lines go out in one write when they fill the write buffer
// exactly, and in two when they are one byte more: the second line then
// starts a write of its own, not the buffer's flush of its head.
func TestWriteBoundaryIsTheBufferSize(t *testing.T) {
	lineLen := func(k int) int {
		return len(cubeLine(&Entry{Time: testTime, RequestURI: "/" + strings.Repeat("p", k)})) + 1
	}
	base := lineLen(0) // a line of k 'p's is base+k bytes long
	for _, tc := range []struct {
		total  int // bytes of the two lines
		writes int // after the first line's own write
	}{
		{writeBufferSize - 1, 1},
		{writeBufferSize, 1},
		{writeBufferSize + 1, 2},
	} {
		a := writeBufferSize / 2
		b := tc.total - a
		w := &splitWriter{entered: make(chan struct{}), release: make(chan struct{})}
		l, err := New(Config{Format: FormatCube, Output: w}, nil)
		if err != nil {
			t.Fatal(err)
		}
		l.Log(&Entry{Time: testTime})
		<-w.entered // the writer is held: both lines queue up, drained together
		for _, n := range []int{a, b} {
			l.Log(&Entry{Time: testTime, RequestURI: "/" + strings.Repeat("p", n-base)})
		}
		close(w.release)
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		if got := len(w.writes) - 1; got != tc.writes {
			t.Errorf("lines of %d bytes in all: %d writes, want %d", tc.total, got, tc.writes)
		}
		for i, p := range w.writes {
			if !bytes.HasSuffix(p, []byte("\n")) {
				t.Errorf("lines of %d bytes in all: write %d (%d bytes) ends mid-line", tc.total, i, len(p))
			}
		}
	}
}
