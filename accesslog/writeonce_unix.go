//go:build unix

package accesslog

import (
	"os"
	"syscall"
)

// fileWriter writes to a file in one write(2) a call. os.File.Write writes
// the rest of a short write (a disk that filled up, then had a block freed)
// in a second write(2), and another process appending to the same file (a
// second instance, the old process of a reuse_port takeover) can land its
// line between the two: the line is broken in two around the other's.
type fileWriter struct {
	f   *os.File
	raw syscall.RawConn
	do  func(fd uintptr) bool // w.call, made once: a closure per write would allocate
	p   []byte
	n   int
	err error
}

// newFileWriter returns the one-write(2) write function of f, or f.Write
// where f has no raw descriptor to write to.
func newFileWriter(f *os.File) func([]byte) (int, error) {
	raw, err := f.SyscallConn()
	if err != nil {
		return f.Write
	}
	w := &fileWriter{f: f, raw: raw}
	w.do = w.call
	return w.write
}

func (w *fileWriter) call(fd uintptr) bool {
	for {
		w.n, w.err = syscall.Write(int(fd), w.p)
		if w.err != syscall.EINTR {
			return true // done, short or not: never wait and write again
		}
	}
}

func (w *fileWriter) write(p []byte) (int, error) {
	w.p = p
	err := w.raw.Write(w.do)
	n, werr := w.n, w.err
	w.p, w.n, w.err = nil, 0, nil
	if err == nil {
		err = werr
	}
	if err != nil {
		return 0, &os.PathError{Op: "write", Path: w.f.Name(), Err: err}
	}
	return n, nil
}
