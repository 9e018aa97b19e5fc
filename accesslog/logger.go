// Package accesslog writes one line per finished request, as JSON or in the
// platform's 22-field "cube" format, without ever blocking the request: Log
// formats into a pooled buffer and hands it to a writer goroutine over a
// bounded queue, and drops the line (counting it) when the queue is full.
package accesslog

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// Formats accepted in Config.Format.
const (
	FormatJSON = "json"
	FormatCube = "cube"
)

// DefaultBufferLines is the queue length when Config.BufferLines is 0.
const DefaultBufferLines = 4096

// ErrClosed is returned by Reopen once Close was called, also to a
// Reopen that was still waiting for the writer then.
var ErrClosed = errors.New("access log closed")

const (
	writeBufferSize = 64 << 10
	// maxPooledLine keeps one huge line from pinning memory in the pool.
	maxPooledLine = 64 << 10
	initLineSize  = 1024
	// queuedBytesPerLine sizes the byte budget of the queue: BufferLines
	// lines of this size on average. Escaping makes a line up to twelve
	// times the request head it describes (every byte of a 15 KiB target
	// appears twice as \ufffd), so a queue bounded by lines alone would
	// pin gigabytes behind a stalled sink. Typical lines are under 1 KiB.
	queuedBytesPerLine = 2 << 10
	// lossCheckEvery is how often the watcher looks for lost lines, and
	// lossLogEvery how often at most it says that lines are still lost.
	lossCheckEvery = 500 * time.Millisecond
	lossLogEvery   = 10 * time.Second
	// movedChecks is how many checks in a row must find the file moved
	// before it is said: logrotate's rename, create and postrotate
	// signal take milliseconds, and the reopen follows.
	movedChecks = 2
)

// Config configures New.
type Config struct {
	Format      string // FormatJSON (default) or FormatCube
	Path        string // file to append to; "", "-" or a name of stdout (NamesStdout) is stdout
	BufferLines int    // queued lines before Log drops; DefaultBufferLines when 0
	// Output, when set, receives the lines instead of Path (tests, embedding);
	// Reopen is then a no-op and Close does not close it.
	Output io.Writer
	// Log, when set, is told when lines start being lost (a failing write:
	// a full disk, a pipe whose reader left; a sink too slow for the
	// queue; a file deleted and not reopened) and when they are written
	// again: one line each, and while the loss lasts one more at most
	// every 10 s. A counter alone (onDrop) leaves an operator who reads
	// the process log unaware that requests go unrecorded. It is also
	// told, once, when Path no longer names the file written to (moved
	// or replaced, and not reopened), and at Close how many lines were
	// lost since it was last told a total, if any. And it is told when
	// the file's close(2) fails, at Close or of the file a Reopen
	// replaced (a network or FUSE file system reporting a failed
	// write-back there): lines written to that file may be lost. And
	// once per truncation of the file under the logger (logrotate's
	// copytruncate), which loses the lines written between its copy and
	// its truncate.
	Log *slog.Logger
	// OnCloseFailure, when set, is called once per failed close(2) of the
	// log file (those Log is told of), from the writer goroutine: a
	// counter for an operator who alerts on metrics, as onDrop is for
	// dropped lines. It must not block.
	OnCloseFailure func()
	// OnTruncate, when set, is called once per truncation of the log file
	// seen (those Log is told of), from the file watcher: copytruncate
	// loses lines no one can count, so the truncations are counted. It
	// must not block.
	OnTruncate func()
}

// Logger is an asynchronous access log. Its methods are safe for concurrent use.
type Logger struct {
	cube    bool
	stamps  *stamps // the line's time, in the format's layout
	path    string  // "" unless writing to a file we own
	onDrop  func()
	lines   chan *line
	reopen  chan chan error
	quit    chan struct{}
	done    chan struct{}
	closed  atomic.Bool
	once    sync.Once
	dropped atomic.Uint64
	pool    sync.Pool
	// queued is the size of the lines handed to the writer and not yet
	// written; Log drops a line that would take it past maxQueued, which
	// StartDrain may raise.
	queued    atomic.Int64
	maxQueued atomic.Int64
	// draining is set by StartDrain: a line the queue has no room for then
	// waits in over (under overMu) for the writer, within maxQueued, and
	// wake tells the writer so.
	draining atomic.Bool
	overMu   sync.Mutex
	over     []*line
	overNext int // over[overNext:] wait; those before were taken
	wake     chan struct{}
	// logging counts the Log calls between their second look at closed
	// and the line queued (or dropped); Close waits for it to be 0.
	logging atomic.Int64

	// For the loss watcher (Config.Log): flushed counts successful
	// flushes, flushedAtDrop is flushed when a line was last dropped (a
	// later flush means lines are written again), writeErr is the last
	// failed write's error, nil once a flush succeeds again.
	log        *slog.Logger
	checkEvery time.Duration // lossCheckEvery, but in tests
	watched    chan struct{} // closed when the watcher has returned; nil without Config.Log
	// held is closed by Abandon when the writer did not end: the kernel
	// holds it in a write. The watchers then return without it.
	held     chan struct{}
	heldOnce sync.Once
	// checked is closed when the file watcher (watchFile) has returned;
	// nil without a file of our own.
	checked       chan struct{}
	flushed       atomic.Uint64
	flushedAtDrop atomic.Uint64
	writeErr      atomic.Pointer[error]
	// unlinked is set by the watcher while the open file has no name
	// left (deleted, and not reopened): what is written to it is lost,
	// and counted as dropped. Cleared by a reopen.
	unlinked atomic.Bool
	// closeFailures are the failed closes of the writer's files, for the
	// loss watcher to say (the writer must not wait for the process log).
	closeMu       sync.Mutex
	closeFailures []closeFailure
	// onCloseFailure is Config.OnCloseFailure, onTruncate Config.OnTruncate.
	onCloseFailure func()
	onTruncate     func()

	// Owned by the writer goroutine after New; closeErr is read by Close
	// after the goroutine has exited.
	out  sink
	file *os.File // nil unless path != ""; swapped under fileMu (Abandon reads it)
	// written counts the bytes written to file (out.written), for the
	// file watcher to tell a truncation from a file others append to too;
	// nil unless file is a regular file. Swapped with file under fileMu.
	written *fileBytes
	// fileMu orders Reopen's swap of file with Abandon.
	fileMu sync.Mutex
	// heldBy names what holds a write to the sink open now that does not
	// return (heldCause), for the line that says one was held; under fileMu.
	heldBy string
	// maxWrite is the most bytes of lines written at once (a single
	// longer line excepted): the write buffer's size, or for a FIFO what
	// the pipe writes atomically (PIPE_BUF).
	maxWrite int
	bw       *bufio.Writer
	// pending counts the lines buffered since the last successful flush.
	// Atomic for Abandon, which reads it while the writer is held in a
	// write that takes them.
	pending atomic.Int64
	// fileLines counts the lines written to the file open now: what a
	// failed close of it may have lost.
	fileLines int
	closeErr  error
}

// closeFailure is a close(2) of the log file that failed: the file system
// says a write it had taken earlier did not reach the storage (NFS, FUSE).
type closeFailure struct {
	at    string // "close" or "reopen"
	lines int    // written to the file since it was opened
	err   error
}

// line is a pooled formatting buffer.
type line struct{ b []byte }

// New opens the sink and starts the writer goroutine. onDrop (may be nil) is
// called once per dropped line, from the goroutine calling Log.
func New(cfg Config, onDrop func()) (*Logger, error) {
	return newLogger(cfg, onDrop, lossCheckEvery)
}

// newLogger is New with the watchers looking every checkEvery: tests look
// more often than lossCheckEvery, to take less time.
func newLogger(cfg Config, onDrop func(), checkEvery time.Duration) (*Logger, error) {
	l := &Logger{
		checkEvery: checkEvery,
		log:        cfg.Log,
		onDrop:     onDrop,
		reopen:     make(chan chan error),
		quit:       make(chan struct{}),
		done:       make(chan struct{}),
		held:       make(chan struct{}),
		wake:       make(chan struct{}, 1),
	}
	l.onCloseFailure, l.onTruncate = cfg.OnCloseFailure, cfg.OnTruncate
	switch cfg.Format {
	case "", FormatJSON:
		l.stamps = newStamps(jsonTime)
	case FormatCube:
		l.cube = true
		l.stamps = newStamps(accessTime)
	default:
		return nil, fmt.Errorf("access log format %q: want %q or %q", cfg.Format, FormatJSON, FormatCube)
	}
	n := cfg.BufferLines
	if n < 0 {
		return nil, fmt.Errorf("access log buffer_lines %d: must not be negative", n)
	}
	if n == 0 {
		n = DefaultBufferLines
	}
	l.lines = make(chan *line, n)
	l.maxQueued.Store(int64(n) * queuedBytesPerLine)
	l.pool.New = func() any { return &line{b: make([]byte, 0, initLineSize)} }

	var out io.Writer
	switch {
	case cfg.Output != nil:
		out = cfg.Output
	case NamesStdout(cfg.Path):
		out = os.Stdout
	default:
		f, err := openLog(cfg.Path)
		if err != nil {
			return nil, err
		}
		l.path, l.file, out = cfg.Path, f, f
	}
	l.maxWrite = maxWrite(l.file)
	l.out = newSink(out, l.file)
	l.written = l.out.written
	l.heldBy = heldCause(out)
	l.bw = bufio.NewWriterSize(&l.out, writeBufferSize)
	go l.run()
	if l.file != nil {
		l.checked = make(chan struct{})
		go func() {
			defer close(l.checked)
			l.watchFile()
		}()
	}
	if l.log != nil {
		l.watched = make(chan struct{})
		go func() {
			defer close(l.watched)
			l.watchLoss()
		}()
	}
	return l, nil
}

// CheckPath reports whether New could open path (stdout: NamesStdout),
// without writing to it or leaving a file behind: an existing file is
// opened to append and closed; for a missing one, its directory must take
// a new file (a temporary one, removed at once). cubeproxy check runs it,
// so that a path serve would fail to open does not pass.
func CheckPath(path string) error {
	if NamesStdout(path) {
		return nil
	}
	if _, err := os.Stat(path); err == nil {
		f, err := openLog(path) // O_CREATE does nothing to an existing file
		if err != nil {
			return err
		}
		return f.Close()
	} else if !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("open access log %s: %w", path, pathErr(err))
	}
	f, err := os.CreateTemp(filepath.Dir(path), ".cubeproxy-check-*")
	if err != nil {
		return createError(path, err)
	}
	name := f.Name()
	return errors.Join(f.Close(), os.Remove(name))
}

// openLog opens path to append to. A FIFO (a log shipper's named pipe) is
// opened for reading too, which never waits: opened write-only, open(2)
// waits for a reader, and a proxy started before its shipper hung before
// it listened, deaf to SIGTERM. Holding a read end (never read) also spares
// a restarting reader's absence from breaking the pipe, which failed every
// write until the next SIGHUP: lines wait in the pipe's buffer for the next
// reader, and once that is full the writer stalls and Log drops lines.
func openLog(path string) (*os.File, error) {
	flag := os.O_WRONLY | os.O_APPEND | os.O_CREATE
	fi, statErr := os.Stat(path)
	if statErr == nil && fi.Mode()&os.ModeNamedPipe != 0 {
		flag = os.O_RDWR
	}
	f, err := os.OpenFile(path, flag, 0o644)
	if err != nil {
		if errors.Is(statErr, fs.ErrNotExist) {
			// Said as CheckPath says it, so that cubeproxy check and
			// serve refuse with one message: the directory refused it.
			return nil, createError(path, err)
		}
		return nil, fmt.Errorf("open access log %s: %w", path, pathErr(err))
	}
	return f, nil
}

// createError is the error for a log file that could not be created in
// its directory (missing, or not writable).
func createError(path string, err error) error {
	return fmt.Errorf("open access log %s: cannot create it in %s: %w", path, filepath.Dir(path), pathErr(err))
}

// pathErr strips err's operation and path: the message names the path
// once, and check's probe file's name would only puzzle.
func pathErr(err error) error {
	if pe, ok := errors.AsType[*fs.PathError](err); ok {
		return pe.Err
	}
	return err
}

// maxWrite returns how many bytes of lines to write at once to f (nil:
// not a file of ours): the write buffer's size, or for a FIFO, which other
// processes may write too, PIPE_BUF, the most a pipe writes without
// interleaving another writer's bytes.
func maxWrite(f *os.File) int {
	if f != nil {
		if fi, err := f.Stat(); err == nil && fi.Mode()&os.ModeNamedPipe != 0 {
			return pipeAtomicWrite
		}
	}
	return writeBufferSize
}

// Log formats e and queues the line. It never blocks and keeps no reference
// to e: when the queue is full (the sink stalls), in lines or in bytes, the
// line is dropped and onDrop called (once StartDrain was called, a line
// the queue has no room for waits beyond it, within the byte budget). A
// line is never dropped for its size alone: with nothing queued it goes
// through. A line logged once Close has
// begun is dropped too; one logged while Close begins is written.
func (l *Logger) Log(e *Entry) {
	if l.closed.Load() {
		l.drop(1)
		return
	}
	// Counted in logging before closed is looked at again, so that Close,
	// which sets closed and then waits for logging to be 0, lets the
	// writer drain only once every Log that found the logger open has
	// queued its line: one queued after that last drain stayed in the
	// queue, neither written nor counted.
	l.logging.Add(1)
	defer l.logging.Add(-1)
	if l.closed.Load() {
		l.drop(1)
		return
	}
	ln := l.pool.Get().(*line)
	now := time.Now()
	if l.cube {
		ln.b = appendCube(ln.b[:0], e, now, l.stamps)
	} else {
		ln.b = appendJSON(ln.b[:0], e, now, l.stamps)
	}
	ln.b = append(ln.b, '\n')
	n := int64(len(ln.b))
	if q := l.queued.Add(n); q > l.maxQueued.Load() && q > n {
		l.unqueue(ln)
		return
	}
	select {
	case l.lines <- ln:
	default:
		if !l.overflow(ln) {
			l.unqueue(ln)
		}
	}
}

// StartDrain tells the logger that the process drains with conns client
// connections open. Each ends with a line, and many end together (every
// GET event stream at once) while the writer competes with their
// goroutines for the CPU, or waits on a slow sink: from now on a line the
// queue has no room for waits beyond it instead of being dropped, and the
// queued bytes may reach conns times 2 KiB where that is more than the
// usual budget (the connections held more). Close then writes them, within
// the caller's wait. Log still never blocks. Call it once.
func (l *Logger) StartDrain(conns int) {
	if b := int64(conns) * queuedBytesPerLine; b > l.maxQueued.Load() {
		l.maxQueued.Store(b)
	}
	l.draining.Store(true)
}

// overflow queues ln beyond the full queue while the process drains
// (StartDrain), and reports whether it did. Its lock is held for an
// append only, by Log, and by the writer to take one line.
func (l *Logger) overflow(ln *line) bool {
	if !l.draining.Load() {
		return false
	}
	l.overMu.Lock()
	l.over = append(l.over, ln)
	l.overMu.Unlock()
	select {
	case l.wake <- struct{}{}:
	default:
	}
	return true
}

// nextOverflow returns the oldest line queued beyond the queue (overflow),
// nil when there is none. One at a time: a writer held in a write holds
// that one line only, and Abandon counts the rest (dropQueued).
func (l *Logger) nextOverflow() *line {
	if !l.draining.Load() {
		return nil
	}
	l.overMu.Lock()
	defer l.overMu.Unlock()
	if l.overNext == len(l.over) {
		return nil
	}
	ln := l.over[l.overNext]
	l.over[l.overNext] = nil
	if l.overNext++; l.overNext == len(l.over) {
		l.over, l.overNext = l.over[:0], 0
	}
	return ln
}

// unqueue drops a line Log could not queue.
func (l *Logger) unqueue(ln *line) {
	l.queued.Add(-int64(len(ln.b)))
	l.put(ln)
	l.drop(1)
}

// BufferLines returns how many lines the queue holds before Log drops
// (Config.BufferLines, or DefaultBufferLines when that was 0).
func (l *Logger) BufferLines() int { return cap(l.lines) }

// Dropped returns how many lines were lost so far (queue full, write
// errors, or written to a deleted file).
func (l *Logger) Dropped() uint64 { return l.dropped.Load() }

func (l *Logger) drop(n int) {
	if l.log != nil {
		l.flushedAtDrop.Store(l.flushed.Load())
	}
	l.dropped.Add(uint64(n))
	if l.onDrop != nil {
		for range n {
			l.onDrop()
		}
	}
}

func (l *Logger) put(ln *line) {
	if cap(ln.b) <= maxPooledLine {
		l.pool.Put(ln)
	}
}

// Reopen closes the log file and opens Path again, so a file renamed by
// logrotate is released and new lines go to a fresh file (call it on SIGHUP).
// Lines queued before the call go to the old file. On error the old file
// stays in use. A failed close of the old file is no error of the reopen,
// whose new file is in use: it is told to Config.Log. A no-op for stdout
// and Config.Output.
func (l *Logger) Reopen() error {
	if l.path == "" {
		return nil
	}
	reply := make(chan error, 1)
	select {
	case l.reopen <- reply:
		return <-reply
	case <-l.done:
		return ErrClosed
	}
}

// Close writes every queued line, flushes and closes the file, and reports
// a failure of that final flush or close; lines it could not write are
// counted as dropped. The watchers of the loss (Config.Log) and of the
// file have returned too, the loss watcher after telling Config.Log the
// lines lost since its last report, if any. Later Log calls are
// discarded. Close is idempotent.
func (l *Logger) Close() error {
	l.once.Do(func() {
		l.closed.Store(true)
		// Log never blocks, so this waits for a formatting or two.
		for l.logging.Load() != 0 {
			runtime.Gosched()
		}
		close(l.quit)
	})
	<-l.done
	if l.watched != nil {
		// The watcher returns once done is closed: nothing of the logger
		// runs, nor logs, after Close.
		<-l.watched
	}
	if l.checked != nil {
		<-l.checked
	}
	return l.closeErr
}

// Abandon closes the log file under a writer that Close could not wait
// for, stalled in a write to a sink that takes nothing (a FIFO nobody
// reads): the write fails, what is still queued is counted as dropped, and
// the writer ends, which would otherwise hold the file and its goroutine
// until the sink moved, after its caller had gone on. It reports whether
// the writer ended within wait. A write the kernel itself holds (a frozen
// or hung file system) is not cut by the close, nor one to stdout or
// Config.Output, which the logger does not own and so does not close (a
// pipe or socket whose reader stalled, a paused terminal): when the writer
// has not ended by then, the lines still queued are counted as dropped
// and Config.Log gets the closing line in Close's stead, naming what holds
// the write by the sink's kind, with the lines of the held write; Close
// returns only once the write is let go. Call it after Close.
func (l *Logger) Abandon(wait time.Duration) (ended bool) {
	l.fileMu.Lock()
	f := l.file
	l.fileMu.Unlock()
	if f != nil {
		_ = f.Close()
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-l.done:
		return true
	case <-t.C:
	}
	l.heldOnce.Do(func() {
		// Without this the closing line never came: the watcher waits for
		// the writer's end, which the kernel keeps until the thaw, after
		// the process has exited.
		l.dropQueued()
		close(l.held)
	})
	if l.watched != nil {
		<-l.watched
	}
	return false
}

// run is the writer goroutine: it owns the file and the bufio.Writer.
func (l *Logger) run() {
	defer close(l.done)
	for {
		select {
		case ln := <-l.lines:
			l.write(ln)
			l.drain()
			_ = l.flush() // failures are counted as drops
		case <-l.wake:
			l.drain()
			_ = l.flush()
		case reply := <-l.reopen:
			l.drain()
			_ = l.flush() // a failed flush is counted as drops; reopening may cure it
			select {
			case <-l.quit:
				// Closed while the reopen waited (for a stalled sink, say):
				// select picks among ready cases at random, and a reopen
				// served now would create a file after Close, which its
				// caller may have given up waiting for.
				reply <- ErrClosed
				continue
			default:
			}
			reply <- l.reopenFile()
		case <-l.quit:
			l.drain()
			if err := l.flush(); err != nil {
				l.closeErr = err
			}
			if l.file != nil {
				if err := l.closeFile(l.file, "close"); err != nil && l.closeErr == nil {
					l.closeErr = fmt.Errorf("close access log: %w", err)
				}
			}
			return
		}
	}
}

// drain writes whatever is queued now, so a burst becomes one flush: the
// queue, then the lines that found it full at a drain (StartDrain).
func (l *Logger) drain() {
	for {
		select {
		case ln := <-l.lines:
			l.write(ln)
			continue
		default:
		}
		ln := l.nextOverflow()
		if ln == nil {
			return
		}
		for ; ln != nil; ln = l.nextOverflow() {
			l.write(ln)
		}
	}
}

// dropQueued counts the lines queued now as dropped (Abandon, while the
// writer is held).
func (l *Logger) dropQueued() {
	for {
		select {
		case ln := <-l.lines:
			l.unqueue(ln)
			continue
		default:
		}
		ln := l.nextOverflow()
		if ln == nil {
			return
		}
		l.unqueue(ln)
	}
}

func (l *Logger) write(ln *line) {
	if n := l.bw.Buffered(); n > 0 && n+len(ln.b) > l.maxWrite {
		// Flushed now, every write ends at a line's end. bufio would fill
		// its buffer with the line's head and write that: on stdout, which
		// the process log shares, a line of that log could then come
		// between the two halves and break both lines. To a FIFO, writes
		// are also kept to what the pipe takes whole (maxWrite), so that
		// the lines of another writer of the pipe (a second instance, the
		// old process of a reuse_port takeover) cannot land inside one. A
		// longer line goes out in one write of its own.
		_ = l.flush() // failures are counted as drops
	}
	_, err := l.bw.Write(ln.b)
	l.queued.Add(-int64(len(ln.b)))
	l.put(ln)
	l.pending.Add(1)
	if err != nil {
		l.writeFailed(err)
	}
}

func (l *Logger) flush() error {
	if err := l.bw.Flush(); err != nil {
		l.writeFailed(err)
		return fmt.Errorf("write access log: %w", err)
	}
	pending := int(l.pending.Load())
	switch {
	case pending > 0 && l.unlinked.Load():
		// Written to a file no name leads to: no reader will see them.
		l.drop(pending)
	case pending > 0:
		l.fileLines += pending
		l.flushed.Add(1)
		if l.writeErr.Load() != nil {
			l.writeErr.Store(nil)
		}
	}
	l.pending.Store(0)
	return nil
}

// writeFailed counts the unflushed lines the sink did not take whole as
// dropped and resets the bufio.Writer, whose errors are otherwise sticky,
// so the log recovers when the sink does (disk space freed, pipe reader
// back). When the failed write left part of a line in the sink, the next
// flush first ends that line, so the next whole line is not glued to the
// fragment. err is kept for the loss watcher, before the drops it is to
// explain are counted.
func (l *Logger) writeFailed(err error) {
	l.writeErr.Store(&err)
	lost := int(l.pending.Load())
	if !l.unlinked.Load() {
		// The whole lines the write got through before it failed are
		// written: counted as lost, they overstated a full disk's loss.
		lost -= l.out.kept
		l.fileLines += l.out.kept
	}
	l.drop(lost)
	l.pending.Store(0)
	l.bw.Reset(&l.out)
	if l.out.midLine {
		_ = l.bw.WriteByte('\n') // cannot fail: the buffer was just emptied
	}
}

// watchLoss tells Config.Log when lines start being lost and when they are
// written again. It runs beside the writer, which a stalled sink blocks
// (it cannot report its own stall), and off the request path, which must
// not wait for the process log (often the same stalled pipe).
func (l *Logger) watchLoss() {
	t := time.NewTicker(l.checkEvery)
	defer t.Stop()
	var (
		seen   uint64    // Dropped() at the last check
		said   uint64    // dropped_total of the last line that gave one
		from   uint64    // Dropped() before the loss began
		since  time.Time // the loss began
		last   time.Time // last "dropping lines" line
		losing bool      // lines were lost and none written since
		logged bool      // this loss was logged: log its end too
	)
	dest := l.path
	if dest == "" {
		dest = "stdout"
	}
	for {
		select {
		case <-t.C:
		case <-l.done:
			l.sayCloseFailures()
			l.sayUnsaid(dest, said)
			return
		case <-l.held:
			l.sayHeld(dest, said)
			return
		}
		select {
		case <-l.done: // both ready: Close's final word only
			l.sayCloseFailures()
			l.sayUnsaid(dest, said)
			return
		default:
		}
		l.sayCloseFailures()
		d := l.dropped.Load()
		switch {
		case d > seen:
			now := time.Now()
			if !losing {
				losing, from, since = true, seen, now
			}
			if now.Sub(last) < lossLogEvery {
				break
			}
			last, logged, said = now, true, d
			if err := l.writeErr.Load(); err != nil {
				l.log.Error("access log cannot be written; dropping lines",
					"path", dest, "err", *err, "dropped", d-from, "dropped_total", d)
			} else if l.unlinked.Load() {
				l.log.Error("access log file was deleted; dropping lines until it is reopened (SIGHUP or SIGUSR1)",
					"path", dest, "dropped", d-from, "dropped_total", d)
			} else {
				l.log.Error("access log sink is not keeping up; dropping lines",
					"path", dest, "buffer_lines", cap(l.lines), "dropped", d-from, "dropped_total", d)
			}
		case losing && l.flushed.Load() > l.flushedAtDrop.Load() && l.writeErr.Load() == nil:
			losing = false
			if logged {
				logged, said = false, d
				l.log.Warn("access log written again",
					"path", dest, "dropped", d-from, "dropped_total", d, "after", time.Since(since).Round(time.Millisecond).String())
			}
		}
		seen = d
	}
}

// sayHeld is the closing line of a logger whose writer the kernel holds in
// a write Abandon could not cut: the lines lost since the last report
// (said, of dropped_total), the queued ones Abandon dropped included, and
// those of the held write, written only if the kernel lets it go before
// the process ends (a frozen file system thawed in time), so not counted.
func (l *Logger) sayHeld(dest string, said uint64) {
	d := l.dropped.Load()
	args := []any{"path", dest, "held", l.pending.Load(), "dropped", d - said, "dropped_total", d}
	if err := l.writeErr.Load(); err != nil {
		args = append(args, "err", *err)
	}
	l.fileMu.Lock()
	by := l.heldBy
	l.fileMu.Unlock()
	l.log.Error("access log closed with its writer held in a write ("+by+"); lines were dropped", args...)
}

// heldCause says what holds a write to w that does not return, by the
// kind of file w is: a frozen or hung file system only for a regular file.
// A pipe or a socket (stdout under a container runtime or systemd) is held
// by a reader that stopped reading, a terminal by its output being paused
// (Ctrl-S); naming a file system there sent an operator to the wrong place.
func heldCause(w io.Writer) string {
	if f, ok := w.(interface{ Stat() (fs.FileInfo, error) }); ok {
		if fi, err := f.Stat(); err == nil {
			switch m := fi.Mode(); {
			case m.IsRegular():
				return "a frozen or hung file system"
			case m&fs.ModeNamedPipe != 0:
				return "a pipe whose reader stopped reading"
			case m&fs.ModeSocket != 0:
				return "a socket whose reader stopped reading"
			case m&fs.ModeCharDevice != 0:
				return "a terminal or device that takes nothing, such as a terminal paused with Ctrl-S"
			}
		}
	}
	return "a sink that takes nothing"
}

// sayUnsaid tells Config.Log, once the writer has ended (Close), how many
// lines were lost since the last line that said a total (said): those of
// a loss the 10 s limit kept quiet, of one begun since the last check, and
// the queued lines the final flush could not write (a full disk, a sink
// given up by Abandon). Without it the last seconds' losses of a process
// that exits (SIGTERM, the old process of a reuse_port takeover) went
// unsaid, and its counter went with it.
func (l *Logger) sayUnsaid(dest string, said uint64) {
	d := l.dropped.Load()
	if d <= said {
		return
	}
	args := []any{"path", dest, "dropped", d - said, "dropped_total", d}
	if err := l.writeErr.Load(); err != nil {
		args = append(args, "err", *err)
	}
	l.log.Error("access log closed; lines were dropped since the last report", args...)
}

// watchFile looks at the file the log writes to every checkEvery
// (lookAtFile). It runs on its own: the file's system may hang a stat (a
// network file system), and the loss watcher must still say that lines
// are lost then.
func (l *Logger) watchFile() {
	t := time.NewTicker(l.checkEvery)
	defer t.Stop()
	var w fileWatch
	for {
		select {
		case <-t.C:
		case <-l.done:
			// The truncations the 10 s limit kept quiet are told at the
			// close, as lost lines are (sayUnsaid): an exiting process's
			// went unsaid, their count with it. Close waits for this;
			// Abandon (held) does not, and nothing may log after it.
			l.sayCuts(&w)
			return
		case <-l.held:
			return
		}
		l.lookAtFile(&w)
	}
}

// fileWatch is what the file watcher keeps from one look to the next.
type fileWatch struct {
	moved int // consecutive looks that found the file moved
	// At the last look at the file whose bytes written counts: its size,
	// and the most of this process's bytes it held then (high, from
	// fileBytes.around). Zero for a file not looked at yet: it held at
	// least nothing when it was opened, when its counts began.
	written *fileBytes
	size    int64
	high    int64
	// The truncations found since the last warning of one (cutSaid), and
	// the latest: a truncation every look (a loop, a misconfigured cron)
	// is told once per lossLogEvery, as lost lines are, not every look.
	cutsUnsaid int
	lastCut    truncation
	cutSaid    time.Time
}

// lookAtFile is one look of the file watcher (checkFile): it tells
// Config.Log once when the file has been found moved movedChecks times in
// a row, and of the truncations found (each counted: OnTruncate) at most
// once per lossLogEvery.
func (l *Logger) lookAtFile(w *fileWatch) {
	moved, cut := l.checkFile(w)
	if cut != nil {
		if l.onTruncate != nil {
			l.onTruncate()
		}
		w.cutsUnsaid++
		w.lastCut = *cut
	}
	if w.cutsUnsaid > 0 && time.Since(w.cutSaid) >= lossLogEvery {
		l.sayCuts(w)
	}
	if !moved {
		w.moved = 0
		return
	}
	if w.moved++; w.moved == movedChecks && l.log != nil {
		l.log.Warn("access log file was moved or replaced; lines go to the old file until it is reopened (SIGHUP or SIGUSR1)",
			"path", l.path)
	}
}

// sayCuts warns of the truncations found since the last warning, if any.
func (l *Logger) sayCuts(w *fileWatch) {
	if w.cutsUnsaid == 0 || l.log == nil {
		return
	}
	l.log.Warn("access log file was truncated (logrotate's copytruncate?); lines written between a copy and the truncate may be lost: rotate with create and a postrotate SIGHUP or SIGUSR1 instead",
		"path", l.path, "size", w.lastCut.size, "expected_min_size", w.lastCut.least, "truncations", w.cutsUnsaid)
	w.cutSaid, w.cutsUnsaid = time.Now(), 0
}

// truncation is a file found shorter (size) than it must be unless it
// was truncated (least).
type truncation struct{ size, least int64 }

// checkFile looks at the file the log writes to, if it owns one. It sets
// unlinked while that regular file is deleted: lines written to it are lost (the
// writer counts them as dropped), where without a look they went on
// filling an unlinked inode, uncounted and unsaid, until a reopen. It
// reports whether Path names another file now, or none: moved (logrotate
// without a postrotate signal) or replaced, so lines go where no reader of
// Path looks; and whether the file was truncated since the last look (cut;
// nil if not), by the size of the one fstat the other checks need too.
// The file is stat'ed outside fileMu, which Abandon takes: a hung file
// system must not keep shutdown from giving the file up.
func (l *Logger) checkFile(w *fileWatch) (moved bool, cut *truncation) {
	if l.path == "" {
		return false, nil
	}
	l.fileMu.Lock()
	f, written := l.file, l.written
	l.fileMu.Unlock()
	var fi fs.FileInfo
	var low, high int64
	var err error
	if written != nil {
		fi, low, high, err = written.around(f.Stat)
	} else {
		fi, err = f.Stat()
	}
	if err != nil {
		return false, nil // closed by Abandon
	}
	// A FIFO's pipe outlives its name: a reader that has it open still
	// reads what is written.
	gone := fi.Mode().IsRegular() && deleted(fi)
	l.fileMu.Lock()
	if l.file == f { // not reopened meanwhile: the new file is another's
		l.unlinked.Store(gone)
	}
	l.fileMu.Unlock()
	if gone {
		return false, nil // a loss, said as one
	}
	if written != nil {
		cut = w.sized(written, fi.Size(), low, high)
	}
	at, err := os.Stat(l.path)
	return errors.Is(err, fs.ErrNotExist) || err == nil && !os.SameFile(fi, at), cut
}

// sized takes the size of the file whose bytes written counts, and the
// bounds around's look at it gave: at least low and at most high of the
// bytes in it then were this process's. It returns the truncation that
// size proves since the last look, if any. Another writer of the file (a
// second instance, the old process of a takeover) only adds to it, so
// unless the file was truncated it grew by at least what this process's
// bytes in it grew: low now less high at the last look. So a file
// truncated and then written back past its old size before the look (a
// small file under a busy proxy) is still found. A file not looked at yet
// (opened anew by a reopen: logrotate's create) starts from nothing.
func (w *fileWatch) sized(written *fileBytes, size, low, high int64) *truncation {
	if w.written != written {
		w.written, w.size, w.high = written, 0, 0
	}
	least := w.size + max(0, low-w.high)
	w.size, w.high = size, high
	if size < least {
		return &truncation{size: size, least: least}
	}
	return nil
}

// fileBytes counts the bytes the logger wrote to a regular file of its
// own, and those it cut off it again (a part line a full disk took), as
// bounds for the file watcher (around). Each is counted twice, on either
// side of its syscall: begun before a write (less the part not written
// after it) and done after; cutBegun before a cut (less a cut that failed)
// and cutDone after. The file then holds at least done-cutBegun and at
// most begun-cutDone of them at any moment. Counted per write(2), not per
// line.
type fileBytes struct {
	begun, done       atomic.Int64
	cutBegun, cutDone atomic.Int64
}

// start counts a write(2) of ask bytes about to be made.
func (b *fileBytes) start(ask int64) { b.begun.Add(ask) }

// finish counts the write(2) of ask bytes start counted, which wrote n.
func (b *fileBytes) finish(ask, n int64) {
	b.done.Add(n)
	b.begun.Add(n - ask)
}

// cutting counts part bytes about to be cut off the file's end.
func (b *fileBytes) cutting(part int64) { b.cutBegun.Add(part) }

// cutFailed takes back a cutting whose truncate failed.
func (b *fileBytes) cutFailed(part int64) { b.cutBegun.Add(-part) }

// cut counts the cut of part bytes cutting counted, done.
func (b *fileBytes) cut(part int64) { b.cutDone.Add(part) }

// around stats the file with stat and returns, beside what it found, the
// least (low) and the most (high) of this process's bytes the file held
// when it was stat'ed, as the writer may write or cut meanwhile. Each
// bound reads what may only have grown by the stat before it, and what
// may have grown since after it: with one count of the bytes written less
// those cut, read once, a cut between that read and the stat (or between
// the stat and that read) made the logger's own cut of a part line look
// like a truncation by someone else.
func (b *fileBytes) around(stat func() (fs.FileInfo, error)) (fi fs.FileInfo, low, high int64, err error) {
	cutDone, done := b.cutDone.Load(), b.done.Load()
	fi, err = stat()
	begun, cutBegun := b.begun.Load(), b.cutBegun.Load()
	return fi, done - cutBegun, begun - cutDone, err
}

// sink is the destination of the bufio.Writer. It remembers whether what
// reached the destination so far ends inside a line, which happens when a
// write fails part-way (a disk that fills up takes part of a buffer).
// Into a regular file of its own it cuts such a part line off instead.
type sink struct {
	w    io.Writer
	file *os.File // w, when it is a regular file the logger owns; else nil
	// written counts the bytes written to file; nil with it.
	written *fileBytes
	// writeOnce writes to file in one write(2) (newFileWriter).
	writeOnce func([]byte) (int, error)
	midLine   bool
	// kept is how many whole lines the last Write that failed got
	// through to w before it failed.
	kept int
}

// newSink returns the sink writing to w; f is w when w is a file the
// logger owns, else nil.
func newSink(w io.Writer, f *os.File) sink {
	s := sink{w: w, file: regularFile(f)}
	if s.file != nil {
		s.writeOnce = newFileWriter(s.file)
		s.written = new(fileBytes)
	}
	return s
}

// errPartWrite is the error of a write to the file that the file system
// took only part of a line of, without saying why (it says so only to a
// next write, which writeFile does not make from inside a line).
var errPartWrite = errors.New("short write: the file system took only part of a line (no space left on device, a quota, or the file size limit)")

func (s *sink) Write(p []byte) (int, error) {
	// A newline that ends the part line a failed write left is no line.
	ending := s.midLine && len(p) > 0 && p[0] == '\n'
	var n int
	var err error
	if s.file != nil {
		n, err = s.writeFile(p)
	} else if n, err = s.w.Write(p); n > 0 {
		s.midLine = p[n-1] != '\n'
	}
	s.kept = 0
	if err != nil {
		s.kept = bytes.Count(p[:n], []byte{'\n'})
		if ending && n > 0 {
			s.kept--
		}
	}
	return n, err
}

// writeFile writes p, whole lines, to the file, each write(2) from the
// start of a line, and returns how many bytes of p the file holds: whole
// lines. A write the file system took only part of (a full disk, a quota,
// the file size limit) leaves its part line cut off (cutPartLine) and the
// rest written anew from that line's start, as long as each write gets a
// whole line through; os.File.Write would write the rest of the line in a
// second write(2), after whatever another writer of the file appended
// meanwhile (a full disk that had a block freed): both lines broken.
func (s *sink) writeFile(p []byte) (int, error) {
	start := 0
	for {
		ask := int64(len(p) - start)
		s.written.start(ask)
		n, err := s.writeOnce(p[start:])
		s.written.finish(ask, int64(n))
		if err != nil {
			return start, err
		}
		end := start + n
		if end == len(p) {
			s.midLine = p[end-1] != '\n'
			return end, nil
		}
		whole := start + bytes.LastIndexByte(p[start:end], '\n') + 1
		if whole < end {
			ours, mid := s.cutPartLine(end - whole)
			if !ours {
				// Not cut: the part line stays, glued to what another
				// writer appended, or the file changed under it.
				s.midLine = mid
				return whole, &os.PathError{Op: "write", Path: s.file.Name(), Err: errPartWrite}
			}
		}
		s.midLine = false
		if whole == start { // not even one line fits
			return start, &os.PathError{Op: "write", Path: s.file.Name(), Err: errPartWrite}
		}
		start = whole
	}
}

// cutPartLine truncates the file by part bytes, the part line a short
// write left at its end, and reports whether the file now ends with the
// last whole line written (ok), else whether it still ends inside the
// line (midLine). A part line left there broke two lines: it stayed
// unparseable, and the newline that ends it, written once space was freed,
// came after a truncation (an operator's, copytruncate's) as an empty
// first line. The file is cut only where the short write ended (the
// descriptor's offset, with O_APPEND the end of its last write) and only
// while the file ends there: another writer's line appended meanwhile, or
// a copytruncate, must not lose its bytes to the cut. Between that look
// and the truncate another writer could still append: no lock is taken,
// since every write would have to take it.
func (s *sink) cutPartLine(part int) (ok, midLine bool) {
	end, err := s.file.Seek(0, io.SeekCurrent)
	if err != nil {
		return false, true
	}
	fi, err := s.file.Stat()
	if err != nil {
		return false, true
	}
	if fi.Size() != end {
		return false, false
	}
	s.written.cutting(int64(part))
	if s.file.Truncate(end-int64(part)) != nil {
		s.written.cutFailed(int64(part))
		return false, true
	}
	s.written.cut(int64(part))
	return true, false
}

// regularFile returns f if it is a regular file, else nil.
func regularFile(f *os.File) *os.File {
	if f == nil {
		return nil
	}
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		return nil
	}
	return f
}

// reopenFile swaps in a freshly opened Path; the old file stays on error.
// A failure to close the old file is no failure of the reopen, whose new
// file is in use: it is told to Config.Log (closeFile).
func (l *Logger) reopenFile() error {
	f, err := openLog(l.path)
	if err != nil {
		return fmt.Errorf("reopen: %w", err)
	}
	l.fileMu.Lock()
	old := l.file
	l.file, l.out, l.maxWrite = f, newSink(f, f), maxWrite(f)
	l.written = l.out.written
	l.heldBy = heldCause(f)
	l.unlinked.Store(false)
	l.fileMu.Unlock()
	l.bw.Reset(&l.out)
	_ = l.closeFile(old, "reopen")
	l.fileLines = 0
	return nil
}

// closeFile closes f, the file the writer wrote fileLines lines to, and
// keeps a failure for the loss watcher to say. A close that fails has lost
// writes the file system took earlier (NFS and FUSE report a failed
// write-back there): said nowhere before, 3,000 lines lost to a FUSE file
// system at exit left the file empty and the process log silent. Which
// lines the kernel does not say, so none is counted as dropped. A file
// Abandon closed already is no failure. Each failure is counted too
// (Config.OnCloseFailure): an error line alone reaches no alert.
func (l *Logger) closeFile(f *os.File, at string) error {
	err := f.Close()
	if err == nil || errors.Is(err, os.ErrClosed) {
		return err
	}
	if l.onCloseFailure != nil {
		l.onCloseFailure()
	}
	if l.log != nil {
		l.closeMu.Lock()
		l.closeFailures = append(l.closeFailures, closeFailure{at: at, lines: l.fileLines, err: err})
		l.closeMu.Unlock()
	}
	return err
}

// sayCloseFailures tells Config.Log the failed closes not said yet.
func (l *Logger) sayCloseFailures() {
	l.closeMu.Lock()
	failed := l.closeFailures
	l.closeFailures = nil
	l.closeMu.Unlock()
	for _, c := range failed {
		l.log.Error("access log file could not be closed; lines written to it may be lost",
			"path", l.path, "at", c.at, "lines", c.lines, "err", c.err)
	}
}
