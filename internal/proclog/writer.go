// Package proclog keeps the process log (slog, on stdout) from ever
// blocking its caller. A stdout nobody reads (a container log driver or
// journald that stalls: Docker's fluentd and syslog drivers block by
// default) held every request that logged a warning, and the accept loop
// when it logged one, for as long as the stall lasted. Writer queues each
// record for one writer goroutine instead and drops it, counted, when the
// queue is full, as the access log does with its lines.
package proclog

import (
	"errors"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultBufferBytes is the most bytes of records New's Writer holds for a
// stalled output: some 2,000 lines, a startup's warnings many times over.
const DefaultBufferBytes = 512 << 10

// maxQueuedRecords bounds the queue's length; the byte budget is what
// bounds its memory.
const maxQueuedRecords = 4096

// ErrStalled is Close's error when the output did not take every queued
// record within its wait.
var ErrStalled = errors.New("process log output stalled: queued lines not written")

// Writer is an io.Writer for a slog handler that never blocks: Write
// queues a copy of the record and returns, and one goroutine writes the
// queue to the output in order, each record in one Write. A record that
// would take the queue past its byte budget is dropped whole and counted
// (a record never goes out in part, so it cannot break a line of the
// access log sharing stdout). Safe for concurrent use.
type Writer struct {
	out       io.Writer
	records   chan []byte
	queued    atomic.Int64 // bytes of records queued and not yet written
	maxQueued int64
	dropped   atomic.Uint64
	report    atomic.Pointer[slog.Logger]

	closed atomic.Bool
	once   sync.Once
	quit   chan struct{}
	done   chan struct{}
}

// New starts the goroutine writing to out. maxBytes bounds the records
// queued for it (DefaultBufferBytes when 0 or less); a single record
// larger than that still goes through when nothing else waits.
func New(out io.Writer, maxBytes int64) *Writer {
	if maxBytes <= 0 {
		maxBytes = DefaultBufferBytes
	}
	w := &Writer{
		out:       out,
		records:   make(chan []byte, maxQueuedRecords),
		maxQueued: maxBytes,
		quit:      make(chan struct{}),
		done:      make(chan struct{}),
	}
	go w.run()
	return w
}

// ReportLossTo makes the Writer log, through l, how many records were lost
// once records are written again after a loss: a warning "process log lines
// were lost" with their count. l should write to w. Until it is called,
// losses are only counted.
func (w *Writer) ReportLossTo(l *slog.Logger) { w.report.Store(l) }

// Dropped returns how many records were lost so far: queue full, a failed
// write, or written after Close.
func (w *Writer) Dropped() uint64 { return w.dropped.Load() }

// Write queues a copy of p (slog reuses its buffer) and never blocks. It
// always reports success: a dropped record is counted, and slog has
// nobody to tell.
func (w *Writer) Write(p []byte) (int, error) {
	if w.closed.Load() {
		w.dropped.Add(1)
		return len(p), nil
	}
	n := int64(len(p))
	if q := w.queued.Add(n); q > w.maxQueued && q > n {
		w.queued.Add(-n)
		w.dropped.Add(1)
		return len(p), nil
	}
	select {
	case w.records <- append([]byte(nil), p...):
	default:
		w.queued.Add(-n)
		w.dropped.Add(1)
	}
	return len(p), nil
}

// Close writes what is queued, waiting at most wait for the output, and
// stops the goroutine; ErrStalled says the output did not take it all in
// time (the goroutine is then left blocked in its write: the process is
// about to exit). Records written later are dropped. Close is idempotent.
func (w *Writer) Close(wait time.Duration) error {
	w.once.Do(func() {
		w.closed.Store(true)
		close(w.quit)
	})
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-w.done:
		return nil
	case <-t.C:
		return ErrStalled
	}
}

// run is the writer goroutine.
func (w *Writer) run() {
	defer close(w.done)
	var (
		reported uint64 // Dropped() when the last loss was reported
		lastErr  error  // last failed write since then
	)
	for {
		select {
		case b := <-w.records:
			err := w.write(b)
			if err != nil {
				lastErr = err
			}
			d := w.dropped.Load()
			if d == reported {
				continue
			}
			// Report once the output took a record and the queue is
			// empty: the log flows again. Until then, a report would only
			// queue behind the backlog, or be lost with it.
			l := w.report.Load()
			if err != nil || len(w.records) > 0 || l == nil {
				continue
			}
			attrs := []any{"dropped", d - reported, "dropped_total", d}
			if lastErr != nil {
				attrs = append(attrs, "err", lastErr.Error())
			}
			reported, lastErr = d, nil
			// Through the queue, as every record: this goroutine must not
			// write around it.
			l.Warn("process log lines were lost: its output did not take them in time or failed", attrs...)
		case <-w.quit:
			for {
				select {
				case b := <-w.records:
					_ = w.write(b) // a failure is counted
				default:
					return
				}
			}
		}
	}
}

// write writes one record; a failure drops it.
func (w *Writer) write(b []byte) error {
	_, err := w.out.Write(b)
	w.queued.Add(-int64(len(b)))
	if err != nil {
		w.dropped.Add(1)
	}
	return err
}
