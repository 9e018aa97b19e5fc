package accesslog

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func readLines(t *testing.T, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
}

func TestReopenAfterRename(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "access.log")
	l, err := New(Config{Format: FormatCube, Path: path}, nil)
	if err != nil {
		t.Fatal(err)
	}
	l.Log(&Entry{Time: testTime, RequestID: "first"})
	rotated := path + ".1"
	if err := os.Rename(path, rotated); err != nil { // what logrotate does
		t.Fatal(err)
	}
	if err := l.Reopen(); err != nil { // what SIGHUP triggers
		t.Fatalf("Reopen: %v", err)
	}
	l.Log(&Entry{Time: testTime, RequestID: "second"})
	if err := l.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	old, cur := readLines(t, rotated), readLines(t, path)
	if len(old) != 1 || strings.Split(old[0], "||")[19] != "first" {
		t.Errorf("rotated file: %q, want only the first line", old)
	}
	if len(cur) != 1 || strings.Split(cur[0], "||")[19] != "second" {
		t.Errorf("new file: %q, want only the second line", cur)
	}
}

func TestReopenFailureKeepsOldFile(t *testing.T) {
	base := t.TempDir()
	dir := filepath.Join(base, "logs")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	l, err := New(Config{Format: FormatCube, Path: filepath.Join(dir, "access.log")}, nil)
	if err != nil {
		t.Fatal(err)
	}
	l.Log(&Entry{Time: testTime, RequestID: "a"})
	moved := filepath.Join(base, "moved")
	if err := os.Rename(dir, moved); err != nil {
		t.Fatal(err)
	}
	if err := l.Reopen(); err == nil {
		t.Fatal("Reopen into a missing directory succeeded")
	}
	l.Log(&Entry{Time: testTime, RequestID: "b"})
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if got := readLines(t, filepath.Join(moved, "access.log")); len(got) != 2 {
		t.Errorf("old file has %d lines, want both: %q", len(got), got)
	}
}

// stallWriter blocks every Write until release is closed.
type stallWriter struct {
	entered chan struct{}
	release chan struct{}
	once    sync.Once
	mu      sync.Mutex
	buf     bytes.Buffer
}

func (w *stallWriter) Write(p []byte) (int, error) {
	w.once.Do(func() { close(w.entered) })
	<-w.release
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.Write(p)
}

func TestStalledSinkDropsWithoutBlocking(t *testing.T) {
	w := &stallWriter{entered: make(chan struct{}), release: make(chan struct{})}
	var drops atomic.Int64
	const queue = 4
	l, err := New(Config{Format: FormatCube, BufferLines: queue, Output: w}, func() { drops.Add(1) })
	if err != nil {
		t.Fatal(err)
	}
	l.Log(&Entry{Time: testTime})
	<-w.entered // the writer goroutine now holds line 1 and is stuck in Write

	done := make(chan struct{})
	go func() {
		defer close(done)
		for range queue + 10 { // queue fills, then 10 are dropped
			l.Log(&Entry{Time: testTime})
		}
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Log blocked on a stalled sink")
	}
	if drops.Load() != 10 || l.Dropped() != 10 {
		t.Errorf("drops counted %d (Dropped %d), want 10", drops.Load(), l.Dropped())
	}
	close(w.release)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(w.buf.String(), "\n"); n != 1+queue {
		t.Errorf("sink got %d lines, want %d", n, 1+queue)
	}
}

// flakyWriter fails while fail is set and reports every call on calls.
type flakyWriter struct {
	fail  atomic.Bool
	calls chan struct{}
	buf   bytes.Buffer
}

func (w *flakyWriter) Write(p []byte) (int, error) {
	failing := w.fail.Load()
	defer func() { w.calls <- struct{}{} }()
	if failing {
		return 0, errors.New("disk full")
	}
	return w.buf.Write(p)
}

func TestWriteErrorCountsDropsAndRecovers(t *testing.T) {
	w := &flakyWriter{calls: make(chan struct{}, 16)}
	w.fail.Store(true)
	l, err := New(Config{Format: FormatCube, Output: w}, nil)
	if err != nil {
		t.Fatal(err)
	}
	l.Log(&Entry{Time: testTime, RequestID: "lost"})
	<-w.calls
	w.fail.Store(false)
	l.Log(&Entry{Time: testTime, RequestID: "kept"})
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if got := w.buf.String(); strings.Count(got, "\n") != 1 || !strings.Contains(got, "||kept||") {
		t.Errorf("sink got %q, want only the line logged after recovery", got)
	}
	if l.Dropped() != 1 {
		t.Errorf("Dropped = %d, want 1", l.Dropped())
	}
}

// tearWriter accepts only the first cut bytes of its first write and fails
// it, as a disk that fills up does; later writes succeed.
type tearWriter struct {
	cut   int
	torn  bool
	calls chan struct{}
	buf   bytes.Buffer
}

func (w *tearWriter) Write(p []byte) (int, error) {
	defer func() { w.calls <- struct{}{} }()
	if !w.torn {
		w.torn = true
		w.buf.Write(p[:w.cut])
		return w.cut, errors.New("no space left on device")
	}
	return w.buf.Write(p)
}

// A write that failed part-way leaves part of a line in the sink; the
// next line must still start on a line of its own, or it is glued to that
// fragment and unparseable too.
func TestLineAfterTornWriteStartsOnItsOwnLine(t *testing.T) {
	tests := []struct {
		name string
		cut  int
		want int // lines in the sink: the fragment, if any, then "kept"
	}{
		{"nothing written", 0, 1},
		{"part of the line written", 10, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := &tearWriter{cut: tt.cut, calls: make(chan struct{}, 16)}
			l, err := New(Config{Format: FormatJSON, Output: w}, nil)
			if err != nil {
				t.Fatal(err)
			}
			l.Log(&Entry{Time: testTime, RequestID: "lost"})
			<-w.calls
			l.Log(&Entry{Time: testTime, RequestID: "kept"})
			if err := l.Close(); err != nil {
				t.Fatal(err)
			}
			got := strings.Split(strings.TrimSuffix(w.buf.String(), "\n"), "\n")
			if len(got) != tt.want || !strings.HasPrefix(got[len(got)-1], `{"time":`) ||
				!strings.Contains(got[len(got)-1], `"x_cube_request_id":"kept"`) {
				t.Errorf("sink got %q, want %d lines, the last one whole", w.buf.String(), tt.want)
			}
			if l.Dropped() != 1 {
				t.Errorf("Dropped = %d, want 1", l.Dropped())
			}
		})
	}
}

func TestCloseFlushesEverything(t *testing.T) {
	path := filepath.Join(t.TempDir(), "access.log")
	l, err := New(Config{Path: path, BufferLines: 5000}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for range 3000 {
		l.Log(fullEntry())
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	l.Log(fullEntry()) // discarded, must not panic
	if err := l.Reopen(); !errors.Is(err, ErrClosed) {
		t.Errorf("Reopen after Close = %v, want ErrClosed", err)
	}
	if got := readLines(t, path); len(got) != 3000 {
		t.Errorf("%d lines written, want 3000", len(got))
	}
}

func TestNewValidates(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
		want string
	}{
		{"bad format", Config{Format: "nginx", Output: io.Discard}, "format"},
		{"negative buffer", Config{BufferLines: -1, Output: io.Discard}, "buffer_lines"},
		{"unopenable path", Config{Path: filepath.Join(t.TempDir(), "missing", "access.log")}, "open access log"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := New(tt.cfg, nil); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("New error %v, want one mentioning %q", err, tt.want)
			}
		})
	}
}

func TestStdoutAndOutputIgnoreReopen(t *testing.T) {
	for _, cfg := range []Config{{Path: "-"}, {Path: ""}, {Output: io.Discard, Path: "/nonexistent/dir/ignored.log"}} {
		l, err := New(cfg, nil)
		if err != nil {
			t.Fatalf("New(%+v): %v", cfg, err)
		}
		if err := l.Reopen(); err != nil {
			t.Errorf("Reopen(%+v) = %v, want nil", cfg, err)
		}
		if err := l.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	}
}

func TestLogDoesNotAllocate(t *testing.T) {
	if raceEnabled {
		t.Skip("sync.Pool drops items at random under -race; run without -race (BenchmarkLog)")
	}
	for _, format := range []string{FormatJSON, FormatCube} {
		l, err := New(Config{Format: format, Output: io.Discard}, nil)
		if err != nil {
			t.Fatal(err)
		}
		e := fullEntry()
		// AllocsPerRun runs on one P; Gosched lets the writer goroutine
		// return the buffer to the pool, the steady state of a writer that
		// keeps up. (A queue that grows allocates its new buffers once.)
		if n := testing.AllocsPerRun(1000, func() { l.Log(e); runtime.Gosched() }); n != 0 {
			t.Errorf("%s: %v allocs per Log, want 0", format, n)
		}
		l.Close()
	}
}

func BenchmarkLog(b *testing.B) {
	for _, format := range []string{FormatJSON, FormatCube} {
		b.Run(format, func(b *testing.B) {
			l, err := New(Config{Format: format, Output: io.Discard, BufferLines: 1 << 16}, nil)
			if err != nil {
				b.Fatal(err)
			}
			defer l.Close()
			e := fullEntry()
			b.ReportAllocs()
			for b.Loop() {
				l.Log(e)
			}
		})
	}
}

// A stalled sink holds back a bounded amount of memory however long the
// lines are: a 15 KiB request target of bytes that need escaping becomes a
// JSON line over ten times that size, and a full queue of them would pin
// gigabytes while stdout's reader (a log shipper) lags.
func TestStalledSinkBoundsQueuedBytes(t *testing.T) {
	w := &stallWriter{entered: make(chan struct{}), release: make(chan struct{})}
	const queue = 64
	l, err := New(Config{Format: FormatJSON, BufferLines: queue, Output: w}, nil)
	if err != nil {
		t.Fatal(err)
	}
	e := &Entry{Time: testTime, RequestURI: "/?" + strings.Repeat("\xff", 15<<10)}
	l.Log(e)
	<-w.entered // the writer goroutine now holds line 1 and is stuck in Write
	for range queue {
		l.Log(e)
	}
	if l.Dropped() == 0 {
		t.Errorf("a stalled sink queued %d lines of %d bytes each, nothing dropped; want the queued bytes bounded",
			queue, len(appendJSON(nil, e, testTime, newStamps(jsonTime))))
	}
	close(w.release)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	line := len(appendJSON(nil, e, testTime, newStamps(jsonTime))) + 1
	if max := queue*queuedBytesPerLine + line; w.buf.Len() > max {
		t.Errorf("the sink got %d bytes queued behind a stall, want at most %d", w.buf.Len(), max)
	}
	if n := strings.Count(w.buf.String(), "\n"); n < 1 {
		t.Errorf("sink got %d lines, want at least the first", n)
	}
}

// A line longer than the byte budget is still written when nothing else
// is queued: the budget bounds a backlog, not the length of one line.
func TestLongLineWrittenWhenQueueEmpty(t *testing.T) {
	var buf bytes.Buffer
	l, err := New(Config{Format: FormatJSON, BufferLines: 1, Output: &buf}, nil)
	if err != nil {
		t.Fatal(err)
	}
	l.Log(&Entry{Time: testTime, RequestURI: "/" + strings.Repeat("a", 64<<10)})
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if l.Dropped() != 0 || strings.Count(buf.String(), "\n") != 1 {
		t.Errorf("dropped %d, sink has %d lines; want the one long line written", l.Dropped(), strings.Count(buf.String(), "\n"))
	}
}
