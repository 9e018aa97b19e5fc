package accesslog

import (
	"strings"
	"testing"
)

// At a drain every open connection ends with a line, many at once (every
// GET event stream), while the writer waits on a slow sink or for the CPU:
// a queue shorter than the connections dropped the lines it had no room
// for (measured on the built binary, 9,900 event streams and a SIGTERM, a
// shipper reading a FIFO at 3 MB/s: 4,141 of 9,900 lost with the default
// 4,096 lines). After StartDrain they wait beyond the queue, within 2 KiB
// a connection, and Close writes them; before it, and beyond that budget,
// a full queue still drops.
func TestDrainKeepsLinesBeyondTheQueue(t *testing.T) {
	const queue, lines = 4, 200
	for _, tc := range []struct {
		name    string
		drain   bool
		conns   int
		dropped func(n uint64) bool
		want    string
	}{
		{"no drain: the queue bounds", false, 0, func(n uint64) bool { return n == lines-queue }, "every line beyond the queue dropped"},
		{"drain: every line kept", true, lines, func(n uint64) bool { return n == 0 }, "none dropped"},
		{"drain with few connections: the byte budget bounds", true, 1, func(n uint64) bool { return n > 0 && n < lines-queue }, "some dropped, fewer than without the drain"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := &stallWriter{entered: make(chan struct{}), release: make(chan struct{})}
			l, err := New(Config{Format: FormatCube, BufferLines: queue, Output: w}, nil)
			if err != nil {
				t.Fatal(err)
			}
			l.Log(&Entry{Time: testTime})
			<-w.entered // the writer holds line 1, stuck in Write
			if tc.drain {
				l.StartDrain(tc.conns)
			}
			for range lines {
				l.Log(&Entry{Time: testTime, RequestURI: "/sse"})
			}
			dropped := l.Dropped()
			if !tc.dropped(dropped) {
				t.Errorf("%d of %d lines dropped behind a stalled sink, want %s", dropped, lines, tc.want)
			}
			close(w.release)
			if err := l.Close(); err != nil {
				t.Fatal(err)
			}
			if n := strings.Count(w.buf.String(), "\n"); uint64(n) != 1+lines-dropped || l.Dropped() != dropped {
				t.Errorf("sink got %d lines and %d were dropped, want every line not dropped (%d) written", n, l.Dropped(), 1+lines-dropped)
			}
		})
	}
}

// StartDrain only raises the byte budget: a drain with fewer connections
// than the queue has lines keeps the usual budget, or lines that fit
// before the drain began would be dropped during it.
func TestStartDrainNeverLowersTheBudget(t *testing.T) {
	const queue = 4
	for _, tc := range []struct {
		conns int
		want  int64
	}{
		{0, queue * queuedBytesPerLine},
		{1, queue * queuedBytesPerLine},
		{queue, queue * queuedBytesPerLine},
		{100, 100 * queuedBytesPerLine},
	} {
		l, err := New(Config{Format: FormatCube, BufferLines: queue, Output: &strings.Builder{}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		l.StartDrain(tc.conns)
		if got := l.maxQueued.Load(); got != tc.want {
			t.Errorf("StartDrain(%d): budget %d bytes, want %d", tc.conns, got, tc.want)
		}
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
	}
}
