//go:build unix

package accesslog

import (
	"log/slog"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// A writer the kernel holds in a write at a drain's end: the lines waiting
// beyond the queue (StartDrain) are counted as dropped by Abandon, with
// those in the queue, not left uncounted behind the held write.
func TestAbandonCountsLinesBeyondTheQueue(t *testing.T) {
	fifo, rd := testenv.StalledFIFO(t, t.TempDir(), "access.fifo")
	plog := new(lockedBuffer)
	l, err := newLogger(Config{Format: FormatCube, Path: fifo, BufferLines: 2, Log: slog.New(slog.NewJSONHandler(plog, nil))}, nil, testCheckEvery)
	if err != nil {
		t.Fatal(err)
	}
	release := holdWriter(t, l, rd)
	t.Cleanup(func() { release(); l.Close() })
	l.StartDrain(100)
	const queued = 20
	for range queued {
		l.Log(&Entry{Time: testTime})
	}
	if l.Dropped() != 0 {
		t.Fatalf("%d lines dropped while draining, want them queued", l.Dropped())
	}
	closed := abandonHeld(t, l)
	if l.Dropped() != queued {
		t.Errorf("%d lines dropped, want the %d queued", l.Dropped(), queued)
	}
	release()
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not return once the write was let go")
	}
}
