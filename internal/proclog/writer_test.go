package proclog

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// stalledPipe is a real pipe nobody reads yet, already full, so that the
// next write to it blocks. read starts reading it, in lines.
func stalledPipe(t *testing.T) (w *os.File, read func() <-chan string) {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close(); w.Close() })
	raw, err := w.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	testenv.Fill(t, raw) // NUL bytes, glued to the first line read
	return w, func() <-chan string {
		lines := make(chan string, 1<<16)
		go func() {
			defer close(lines)
			br := bufio.NewReader(r)
			for {
				s, err := br.ReadString('\n')
				if err != nil {
					return
				}
				lines <- strings.TrimLeft(strings.TrimSuffix(s, "\n"), "\x00")
			}
		}()
		return lines
	}
}

// With its output stalled, the Writer takes every record at once, keeps
// what fits its budget, drops the rest whole, and once the output is read
// again writes what it kept, in order, then reports the loss.
func TestWriterNeverBlocksAndReportsLoss(t *testing.T) {
	out, read := stalledPipe(t)
	w := New(out, 64<<10)
	log := slog.New(slog.NewTextHandler(w, nil))
	w.ReportLossTo(log)
	const n = 5000 // about 400 KiB of lines
	start := time.Now()
	for i := range n {
		log.Info("line", "i", i, "pad", strings.Repeat("x", 20))
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("%d records took %v with the output stalled", n, took)
	}
	dropped := w.Dropped()
	if dropped == 0 || dropped >= n {
		t.Fatalf("dropped %d of %d records, want some but not all", dropped, n)
	}
	if q := w.queued.Load(); q > 64<<10 {
		t.Errorf("%d bytes queued, over the 64 KiB budget", q)
	}

	lines := read()
	last := -1
	var report string
	timeout := time.After(10 * time.Second)
	for report == "" {
		select {
		case s, ok := <-lines:
			if !ok {
				t.Fatal("pipe closed")
			}
			if strings.Contains(s, "process log lines were lost") {
				report = s
				continue
			}
			var i int
			if _, err := fmt.Sscanf(s[strings.Index(s, " i=")+1:], "i=%d", &i); err != nil {
				t.Fatalf("broken line %q: %v", s, err)
			}
			if i <= last {
				t.Fatalf("line %d after line %d", i, last)
			}
			last = i
		case <-timeout:
			t.Fatalf("no report of the loss; last line %d", last)
		}
	}
	if want := fmt.Sprintf("dropped=%d ", dropped); !strings.Contains(report, want) {
		t.Errorf("report %q, want %s", report, want)
	}
	if err := w.Close(time.Second); err != nil {
		t.Fatal(err)
	}
}

// Close writes what is queued when the output takes it, and gives up
// after its wait when the output is stalled.
func TestWriterClose(t *testing.T) {
	for _, tc := range []struct {
		name    string
		stalled bool
		want    error
	}{
		{"output read", false, nil},
		{"output stalled", true, ErrStalled},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, read := stalledPipe(t)
			var lines <-chan string
			if !tc.stalled {
				lines = read()
			}
			w := New(out, 0)
			for i := range 1000 {
				fmt.Fprintf(w, "line %d\n", i)
			}
			start := time.Now()
			err := w.Close(500 * time.Millisecond)
			if !errors.Is(err, tc.want) {
				t.Fatalf("Close: %v, want %v", err, tc.want)
			}
			if took := time.Since(start); took > 2*time.Second {
				t.Errorf("Close took %v", took)
			}
			if tc.stalled {
				return
			}
			for i := range 1000 {
				if s := <-lines; s != fmt.Sprintf("line %d", i) {
					t.Fatalf("line %d is %q", i, s)
				}
			}
			fmt.Fprintf(w, "after close\n")
			if w.Dropped() != 1 {
				t.Errorf("a record after Close: dropped %d, want 1", w.Dropped())
			}
		})
	}
}

// A record larger than the whole budget still goes out when nothing else
// waits: a long line is kept rather than silently lost.
func TestWriterLongRecord(t *testing.T) {
	pr, pw := io.Pipe()
	w := New(pw, 1024)
	long := strings.Repeat("y", 8192) + "\n"
	got := make(chan string, 1)
	go func() {
		b, _ := bufio.NewReaderSize(pr, 16384).ReadString('\n')
		got <- b
	}()
	t.Cleanup(func() { pw.Close() }) // ends the reader if the record never comes
	io.WriteString(w, long)
	// Write decides to drop before it returns: fail here rather than wait
	// for a record that will never be read.
	if w.Dropped() != 0 {
		t.Fatalf("dropped %d", w.Dropped())
	}
	if s := testenv.Recv(t, got, 10*time.Second, "the long record"); s != long {
		t.Fatalf("read %d bytes, want %d", len(s), len(long))
	}
	go io.Copy(io.Discard, pr)
	if err := w.Close(time.Second); err != nil {
		t.Fatal(err)
	}
}

// failing fails its writes until healed.
type failing struct {
	mu     sync.Mutex
	healed bool
	got    []string
}

func (f *failing) Write(p []byte) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.healed {
		return 0, errors.New("write /dev/stdout: broken pipe")
	}
	f.got = append(f.got, string(p))
	return len(p), nil
}

// A record whose write fails is lost and counted, and the report, once a
// write succeeds again, names the error.
func TestWriterWriteErrors(t *testing.T) {
	f := &failing{}
	w := New(f, 0)
	log := slog.New(slog.NewTextHandler(w, nil))
	w.ReportLossTo(log)
	for range 3 {
		log.Info("lost")
	}
	deadline := time.Now().Add(5 * time.Second)
	for w.Dropped() < 3 {
		if time.Now().After(deadline) {
			t.Fatalf("dropped %d, want 3", w.Dropped())
		}
		time.Sleep(time.Millisecond)
	}
	f.mu.Lock()
	f.healed = true
	f.mu.Unlock()
	log.Info("written")
	if err := w.Close(time.Second); err != nil {
		t.Fatal(err)
	}
	// The report is queued by the writer goroutine after "written" went
	// out; Close may have stopped it first: only "written" is certain.
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.got) == 0 || !strings.Contains(f.got[0], "msg=written") {
		t.Fatalf("got %q", f.got)
	}
	if len(f.got) > 1 && (!strings.Contains(f.got[1], "dropped=3") || !strings.Contains(f.got[1], "broken pipe")) {
		t.Errorf("report %q, want dropped=3 and the error", f.got[1])
	}
}

// gated records its writes, each waiting first for the gate while one is
// set.
type gated struct {
	mu   sync.Mutex
	gate chan struct{}
	got  []string
}

func (g *gated) Write(p []byte) (int, error) {
	g.mu.Lock()
	gate := g.gate
	g.mu.Unlock()
	if gate != nil {
		<-gate
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.got = append(g.got, string(p))
	return len(p), nil
}

// reports returns the loss reports written so far.
func (g *gated) reports() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	var r []string
	for _, s := range g.got {
		if strings.Contains(s, "process log lines were lost") {
			r = append(r, s)
		}
	}
	return r
}

// Each report counts the records lost since the one before, and names a
// write error only when one happened since: a later loss to a full queue
// is no broken pipe, and a running total in "dropped" would have an
// operator count the first loss again.
func TestWriterReportsEachLossOnce(t *testing.T) {
	g := &gated{}
	w := New(&failOnce{g: g}, 100)
	t.Cleanup(func() { _ = w.Close(time.Second) })
	w.ReportLossTo(slog.New(slog.NewTextHandler(w, nil)))

	// First loss: a failed write; the next record goes out, then the report.
	w.Write([]byte("lost to the error\n"))
	w.Write([]byte("written\n"))
	testenv.WaitFor(t, 10*time.Second, "the first loss report", func() bool { return len(g.reports()) == 1 })
	if r := g.reports()[0]; !strings.Contains(r, "dropped=1 ") || !strings.Contains(r, "broken pipe") {
		t.Fatalf("first report %q, want dropped=1 and the error", r)
	}

	// Second loss: the output stalls on a record, and one that would take
	// the queue past its 100 bytes is dropped; no write fails.
	gate := make(chan struct{})
	g.mu.Lock()
	g.gate = gate
	g.mu.Unlock()
	w.Write([]byte(strings.Repeat("b", 60) + "\n"))
	w.Write([]byte(strings.Repeat("c", 60) + "\n"))
	if w.Dropped() != 2 {
		t.Fatalf("dropped %d, want 2: the second record should not have fit", w.Dropped())
	}
	g.mu.Lock()
	g.gate = nil
	g.mu.Unlock()
	close(gate)
	testenv.WaitFor(t, 10*time.Second, "the second loss report", func() bool { return len(g.reports()) == 2 })
	r := g.reports()[1]
	if !strings.Contains(r, "dropped=1 ") || !strings.Contains(r, "dropped_total=2") {
		t.Errorf("second report %q, want dropped=1 dropped_total=2", r)
	}
	if strings.Contains(r, "err=") {
		t.Errorf("second report %q names an error, but no write failed since the first", r)
	}
}

// failOnce fails its first write, then writes to g.
type failOnce struct {
	mu     sync.Mutex
	failed bool
	g      *gated
}

func (f *failOnce) Write(p []byte) (int, error) {
	f.mu.Lock()
	first := !f.failed
	f.failed = true
	f.mu.Unlock()
	if first {
		return 0, errors.New("write /dev/stdout: broken pipe")
	}
	return f.g.Write(p)
}
