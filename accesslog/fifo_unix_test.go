//go:build unix

package accesslog

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// A FIFO (a log shipper's named pipe) whose reader is not there yet, or
// left: New must not wait for one (open(2) of a FIFO for writing does,
// which hung a proxy started before its shipper, before it listened), and
// a reader that comes back gets the lines, where a write-only end would
// fail every write with EPIPE until the next reopen.
func TestFIFOWithoutReader(t *testing.T) {
	fifo := filepath.Join(t.TempDir(), "access.fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	// Unblocks an open that waits for a reader, so a failing test ends.
	t.Cleanup(func() {
		if r, err := os.OpenFile(fifo, os.O_RDONLY|syscall.O_NONBLOCK, 0); err == nil {
			r.Close()
		}
	})
	opened := make(chan *Logger, 1)
	go func() {
		l, err := New(Config{Format: FormatCube, Path: fifo}, nil)
		if err != nil {
			t.Errorf("New: %v", err)
		}
		opened <- l
	}()
	var l *Logger
	select {
	case l = <-opened:
	case <-time.After(5 * time.Second):
		t.Fatal("New waits for a reader of the FIFO")
	}
	if l == nil {
		return
	}
	defer l.Close()

	for _, id := range []string{"first", "second"} {
		l.Log(&Entry{Time: testTime, RequestID: id})
		// The reader comes after the line was written (or after the last
		// reader left): the line waits in the pipe for it.
		r, err := os.Open(fifo)
		if err != nil {
			t.Fatal(err)
		}
		r.SetReadDeadline(time.Now().Add(5 * time.Second))
		ln, err := bufio.NewReader(r).ReadString('\n')
		r.Close()
		if err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatal(err)
		}
		if f := strings.Split(ln, "||"); len(f) != 22 || f[19] != id {
			t.Fatalf("reader got %q, want the %s line", ln, id)
		}
	}
	if l.Dropped() != 0 {
		t.Errorf("%d lines dropped", l.Dropped())
	}
}

// CheckPath (cubeproxy check) passes what New opens and refuses what it
// cannot, and changes nothing: an existing log keeps its bytes, a missing
// one is not created, and a FIFO without a reader does not hang it.
func TestCheckPath(t *testing.T) {
	dir := t.TempDir()
	existing := filepath.Join(dir, "access.log")
	if err := os.WriteFile(existing, []byte("old line\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	fifo := filepath.Join(dir, "access.fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	// A refusal names the log and its directory, not the probe file the
	// check tried there.
	if err := CheckPath(filepath.Join(dir, "none", "access.log")); err == nil ||
		!strings.Contains(err.Error(), "access.log: cannot create it in "+filepath.Join(dir, "none")+": ") ||
		strings.Contains(err.Error(), ".cubeproxy-check") {
		t.Errorf("CheckPath in a missing directory: %v; want it to name the log and the directory only", err)
	}
	for _, tc := range []struct {
		path string
		ok   bool
	}{
		{"-", true},
		{"", true},
		{existing, true},
		{fifo, true},
		{filepath.Join(dir, "new.log"), true},
		{filepath.Join(dir, "none", "access.log"), false},
		{dir, false}, // a directory is no file to append to
	} {
		if err := CheckPath(tc.path); (err == nil) != tc.ok {
			t.Errorf("CheckPath(%q) = %v, want ok %v", tc.path, err, tc.ok)
		}
	}
	if b, err := os.ReadFile(existing); err != nil || string(b) != "old line\n" {
		t.Errorf("existing log after the check: %q %v", b, err)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 2 {
		t.Errorf("the check left files behind: %v", entries)
	}
}

// A FIFO may have other writers (a second proxy instance on the node, the
// old process of a reuse_port takeover, both logging to the shipper's
// pipe). A pipe keeps a write whole only up to PIPE_BUF bytes: a write of
// the whole 64 KiB buffer that found the pipe full went in in pieces, and
// the other writer's bytes came between them, inside a line. Each round
// fills the pipe from both loggers before the reader reads, so that both
// wait on it; the race is then theirs, and it broke lines in most rounds.
func TestFIFOSharedByTwoWriters(t *testing.T) {
	fifo := filepath.Join(t.TempDir(), "access.fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	const perRound, rounds = 400, 5
	var ls []*Logger
	for range 2 {
		l, err := New(Config{Format: FormatCube, Path: fifo, BufferLines: 2 * perRound}, nil)
		if err != nil {
			t.Fatal(err)
		}
		ls = append(ls, l)
	}
	r, err := os.Open(fifo) // does not wait: the loggers hold the pipe open
	if err != nil {
		t.Fatal(err)
	}
	_ = r.SetReadDeadline(time.Now().Add(20 * time.Second))
	t.Cleanup(func() {
		// A failed round leaves lines in a full pipe: read them, or
		// Close waits for a writer that cannot write.
		go io.Copy(io.Discard, r)
		for _, l := range ls {
			_ = l.Close()
		}
		r.Close()
	})
	br := bufio.NewReader(r)
	// Lines under any system's PIPE_BUF (512 on macOS), and no divisor
	// of 64 KiB.
	long := "/" + strings.Repeat("p", 149)
	e := &Entry{Time: testTime, Method: "GET", RequestURI: long, URI: long, Status: 200}
	want := cubeLine(e) + "\n"
	if len(want) >= 512 || 64<<10%len(want) == 0 {
		t.Fatalf("test line of %d bytes", len(want))
	}
	for round := range rounds {
		for range perRound {
			for _, l := range ls {
				l.Log(e)
			}
		}
		for n := range 2 * perRound {
			ln, err := br.ReadString('\n')
			if err != nil {
				t.Fatalf("round %d, line %d: %v", round, n, err)
			}
			if ln != want {
				t.Fatalf("round %d, line %d is broken: %q", round, n, ln)
			}
		}
	}
	for i, l := range ls {
		if d := l.Dropped(); d != 0 {
			t.Errorf("logger %d dropped %d lines", i, d)
		}
	}
}

// A reopen still waiting for the writer when Close is called is refused,
// not served after it. serve gives a stalled sink (a FIFO nobody reads) a
// few seconds at exit and then leaves the writer behind; once the sink
// took the line, the writer picked the waiting reopen as often as the
// close, and the reopen created a new file at the path (logrotate had
// moved the old one) in a directory the caller believed it was done with.
func TestReopenWaitingAtCloseIsRefused(t *testing.T) {
	for range 20 {
		dir := t.TempDir()
		fifo, rd := testenv.StalledFIFO(t, dir, "access.fifo")

		l, err := New(Config{Format: FormatCube, Path: fifo}, nil)
		if err != nil {
			t.Fatal(err)
		}
		l.Log(&Entry{Time: testTime, RequestID: "stalled"}) // the writer blocks on the full pipe
		reopened := make(chan error, 1)
		go func() { reopened <- l.Reopen() }()
		closed := make(chan error, 1)
		go func() { closed <- l.Close() }()
		testenv.WaitFor(t, 5*time.Second, "Reopen and Close waiting on the stalled writer", func() bool {
			return l.closed.Load() && goroutinesIn("accesslog.(*Logger).Reopen(") == 1
		})
		// What logrotate does; a reopen served from now on creates a file.
		if err := os.Remove(fifo); err != nil {
			t.Fatal(err)
		}
		go io.Copy(io.Discard, rd) // the sink moves on: EOF once the logger closed its ends
		select {
		case <-closed:
		case <-time.After(5 * time.Second):
			t.Fatal("Close did not return once the sink took the line")
		}
		rd.Close()
		if err := <-reopened; !errors.Is(err, ErrClosed) {
			t.Errorf("Reopen waiting at Close returned %v, want ErrClosed", err)
		}
		if _, err := os.Stat(fifo); err == nil {
			t.Fatalf("a reopen served after Close created %s", fifo)
		}
	}
}

// goroutinesIn counts the goroutines whose stacks have fn in them.
func goroutinesIn(fn string) int {
	buf := make([]byte, 1<<20)
	n := 0
	for _, g := range bytes.Split(buf[:runtime.Stack(buf, true)], []byte("\n\n")) {
		if bytes.Contains(g, []byte(fn)) {
			n++
		}
	}
	return n
}

// Abandon ends a writer stalled on a FIFO nobody reads, which Close waits
// for: the file is closed under the write, Close returns, and the queued
// line is counted as dropped.
func TestAbandonEndsStalledWriter(t *testing.T) {
	fifo, _ := testenv.StalledFIFO(t, t.TempDir(), "access.fifo")

	l, err := New(Config{Format: FormatCube, Path: fifo}, nil)
	if err != nil {
		t.Fatal(err)
	}
	l.Log(&Entry{Time: testTime, RequestID: "stalled"})
	closed := make(chan error, 1)
	go func() { closed <- l.Close() }()
	testenv.WaitFor(t, 5*time.Second, "Close waiting on the stalled writer", l.closed.Load)
	select {
	case <-closed:
		t.Fatal("Close returned while the sink took nothing")
	default:
	}
	if !l.Abandon(5 * time.Second) {
		t.Fatal("Abandon: the writer did not end")
	}
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
		t.Fatal("the writer still runs after Abandon")
	}
	if l.Dropped() != 1 {
		t.Errorf("%d lines dropped, want the stalled one", l.Dropped())
	}
}

// A FIFO whose name is removed while its reader reads (a shipper that
// cleans up the name it made) still carries every line to that reader:
// not a loss, unlike a regular file deleted, though the path no longer
// leads to it.
func TestRemovedFIFOStillCarriesLines(t *testing.T) {
	path := testenv.Mkfifo(t, t.TempDir(), "access.fifo")
	l, plog := cubeLogTo(t, path)
	rd, err := os.Open(path) // the logger holds the pipe open: no wait
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rd.Close() })
	lines := bufio.NewScanner(rd)
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	// The move is said once the file watcher has looked movedChecks times.
	testenv.WaitFor(t, 5*time.Second, "the removed name in the process log", func() bool {
		l.Log(&Entry{Time: testTime, RequestID: "carried"})
		if !lines.Scan() || !strings.Contains(lines.Text(), "carried") {
			t.Fatalf("reader got %q (%v), want the line logged", lines.Text(), lines.Err())
		}
		return len(plog.records(t, "access log file was moved or replaced")) > 0
	})
	if l.Dropped() != 0 {
		t.Errorf("dropped %d lines its reader read", l.Dropped())
	}
	if got := plog.records(t, "access log file was deleted"); len(got) != 0 {
		t.Errorf("the FIFO's removal said as a loss: %v", got)
	}
}

// holdWriter has l, writing to a FIFO whose reader rd reads nothing, take
// one line into a write the kernel holds (in blocking mode, not in the
// poller), and returns what lets the write go: reading the FIFO. A sink
// that is Config.Output (stdout) stays as it is: Abandon does not close
// it, so a write parked in the poller is held too. It is
// let go at the test's end too, before a cleanup's Close registered
// after it, should the test fail early.
func holdWriter(t *testing.T, l *Logger, rd io.Reader) (release func()) {
	t.Helper()
	release = sync.OnceFunc(func() { go io.Copy(io.Discard, rd) })
	t.Cleanup(release)
	if l.file != nil {
		l.file.Fd() // blocking mode
	}
	l.Log(&Entry{Time: testTime, RequestID: "held"})
	testenv.WaitFor(t, 5*time.Second, "the writer in the write", func() bool { return l.pending.Load() == 1 && len(l.lines) == 0 })
	return release
}

// abandonHeld closes l while its writer is held (holdWriter), abandons it,
// which must report that the writer did not end, and returns Close's
// result, which comes once the write is let go.
func abandonHeld(t *testing.T, l *Logger) <-chan error {
	t.Helper()
	closed := make(chan error, 1)
	go func() { closed <- l.Close() }()
	testenv.WaitFor(t, 5*time.Second, "Close waiting on the held writer", l.closed.Load)
	if l.Abandon(50 * time.Millisecond) {
		t.Fatal("Abandon reports the writer ended, while the kernel holds it")
	}
	return closed
}
