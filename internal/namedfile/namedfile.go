// Package namedfile reads the files an operator names in the
// configuration (the config file, the routes file, certificates, keys,
// CA bundles, credential files): regular files only (the config file may
// also be a pipe, ReadOnce), and bounded in size.
//
// os.ReadFile would take whatever the name points at. A FIFO blocks the
// open until a writer comes, so `serve` and `check` would hang without a
// word; /dev/zero, or a multi-gigabyte file named by mistake, would be
// read until the process runs out of memory. Read refuses both, naming
// the file and why.
package namedfile

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
)

// Size limits by kind of file. Each is far above any real file of its
// kind and far below what would hurt a proxy's memory.
const (
	// MaxRoutes bounds the routes file: ≈200k routes at ≈300 bytes each,
	// twice the route cache's default size (a 100k-route file is ≈30 MB).
	MaxRoutes = 64 << 20
	// MaxSmall bounds the config file, certificate, key and CA bundles
	// (Mozilla's whole root bundle is ≈220 KB) and credential files.
	MaxSmall = 4 << 20
)

// Read returns the contents of the file at path, which must be a regular
// file (after following symlinks, as everything else that opens it does)
// of at most limit bytes. A missing file is an error matching
// fs.ErrNotExist. The file is read through a bound, so one that grows
// between the size check and the read is still refused.
func Read(path string, limit int64) ([]byte, error) {
	f, _, err := Open(path, limit)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return ReadFrom(f, path, limit)
}

// Open opens path as Read does, judging what it opened (a regular file of
// at most limit bytes), and returns it with its state then. A reader that
// must know whether the file changed while it read compares that with the
// opened file's state after (f.Stat): a rename over path meanwhile, an
// atomic replacement, leaves what was opened whole and unchanged.
func Open(path string, limit int64) (*os.File, fs.FileInfo, error) {
	return open(path, limit, nil)
}

// open is Open calling between, when not nil, after the stat and before
// the open: tests change there what path names, as a rename by another
// process may (TestOpenJudgesWhatItOpened).
func open(path string, limit int64, between func()) (*os.File, fs.FileInfo, error) {
	// Stat before open: open(2) of a FIFO with no writer blocks, and
	// opening a device may have effects of its own.
	fi, err := os.Stat(path)
	if err != nil {
		return nil, nil, err
	}
	if err := check(path, fi, limit); err != nil {
		return nil, nil, err
	}
	if between != nil {
		between()
	}
	// The name may have changed between the stat and the open: open
	// without blocking (noBlock; a no-op for a regular file's reads) and
	// judge what was opened.
	f, err := os.OpenFile(path, os.O_RDONLY|noBlock, 0)
	if err != nil {
		return nil, nil, err
	}
	if fi, err = f.Stat(); err != nil {
		f.Close()
		return nil, nil, err
	}
	if err := check(path, fi, limit); err != nil {
		f.Close()
		return nil, nil, err
	}
	return f, fi, nil
}

// ReadFrom reads f, opened from path by Open, to its end through limit.
func ReadFrom(f *os.File, path string, limit int64) ([]byte, error) {
	data, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(data)) > limit {
		return nil, tooLarge(path, int64(len(data)), limit, true)
	}
	return data, nil
}

// ReadOnce is Read for a file read once, at startup: the config file.
// Besides a regular file it takes a pipe, so that a configuration can be
// made on the spot (`--config <(envsubst < cubeproxy.yaml.tmpl)`,
// `--config /dev/stdin`), as nginx -c takes one. A pipe is opened as cat
// opens it: a named FIFO with no writer waits for one, which is what its
// name asked for. It is read through limit, and an empty pipe is an error
// rather than an empty configuration: the command that should have
// written it most likely failed, and the proxy would start on defaults.
// Files the proxy reads again (certificates on reload) or writes back
// (routes) stay regular files only (Read).
func ReadOnce(path string, limit int64) ([]byte, error) {
	return ReadOnceContext(context.Background(), path, limit)
}

// ReadOnceContext is ReadOnce given up when ctx ends while a pipe still
// waits for its writer (to open it, write or close it), with an error that
// wraps ctx's: the program's stop signal must not wait on a writer that
// may never come. The read itself cannot be cut: it goes on in the
// background until the writer closes the pipe or the process exits. A
// regular file is read whatever ctx says.
func ReadOnceContext(ctx context.Context, path string, limit int64) ([]byte, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if fi.Mode()&fs.ModeNamedPipe == 0 {
		return Read(path, limit)
	}
	if ctx.Done() == nil {
		return readPipe(path, limit)
	}
	type read struct {
		data []byte
		err  error
	}
	done := make(chan read, 1)
	go func() {
		data, err := readPipe(path, limit)
		done <- read{data, err}
	}()
	select {
	case r := <-done:
		return r.data, r.err
	case <-ctx.Done():
		return nil, fmt.Errorf("%s, a pipe, was still waiting for its writer: %w", path, ctx.Err())
	}
}

// readPipe reads the pipe at path to its end, through limit.
func readPipe(path string, limit int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, limit+1))
	switch {
	case err != nil:
		return nil, err
	case int64(len(data)) > limit:
		return nil, fmt.Errorf("%s, a pipe, gave more than the %s this kind of file may have: %w", path, human(limit), ErrTooLarge)
	case len(data) == 0:
		return nil, fmt.Errorf("%s, a pipe, gave nothing: %w", path, ErrEmptyPipe)
	}
	return data, nil
}

// ErrEmptyPipe is matched by ReadOnce's error for a pipe closed before
// it gave a byte.
var ErrEmptyPipe = errors.New("empty pipe")

// ErrNotRegular is matched by Read's error for a path that is not a
// regular file.
var ErrNotRegular = errors.New("not a regular file")

// ErrTooLarge is matched by Read's error for a file above its limit.
var ErrTooLarge = errors.New("file too large")

func check(path string, fi fs.FileInfo, limit int64) error {
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("%s is %s, %w: name the file itself", path, kind(fi.Mode()), ErrNotRegular)
	}
	if fi.Size() > limit {
		return tooLarge(path, fi.Size(), limit, false)
	}
	return nil
}

func tooLarge(path string, size, limit int64, grew bool) error {
	if grew {
		return fmt.Errorf("%s holds more than the %s this kind of file may have, more than its size said (it grew while read?): %w", path, human(limit), ErrTooLarge)
	}
	return fmt.Errorf("%s is %s, above the %s this kind of file may have: %w (is it the right file?)", path, human(size), human(limit), ErrTooLarge)
}

// kind names a file mode that is not a regular file's.
func kind(m fs.FileMode) string {
	switch {
	case m.IsDir():
		return "a directory"
	case m&fs.ModeNamedPipe != 0:
		return "a named pipe (FIFO)"
	case m&fs.ModeSocket != 0:
		return "a socket"
	case m&fs.ModeCharDevice != 0:
		return "a character device"
	case m&fs.ModeDevice != 0:
		return "a block device"
	}
	return "not a file (mode " + m.String() + ")"
}

// human writes n bytes in the largest binary unit that divides it, or
// plain bytes.
func human(n int64) string {
	switch {
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%d KiB", n>>10)
	}
	return fmt.Sprintf("%d bytes", n)
}
