//go:build unix

package testenv

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// Mkfifo makes a named pipe called name in dir and returns its path.
// It fails the test rather than skip it: a test of what a FIFO does
// would otherwise pass by not running.
func Mkfifo(t testing.TB, dir, name string) string {
	t.Helper()
	path := filepath.Join(dir, name)
	if err := syscall.Mkfifo(path, 0o600); err != nil {
		t.Fatalf("mkfifo: %v", err)
	}
	return path
}

// FillFIFO writes to the FIFO at path, which must have a reader, until
// its pipe takes no more: the next write to it blocks.
func FillFIFO(t testing.TB, path string) {
	t.Helper()
	w, err := os.OpenFile(path, os.O_WRONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		t.Fatalf("open %s for writing: %v", path, err)
	}
	defer w.Close()
	raw, err := w.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	Fill(t, raw)
}

// StalledFIFO makes a FIFO dir/name whose pipe is full and whose reader
// never reads (a log shipper that stopped): the first write to it blocks.
// It returns the path and the reader, which the test may close to leave
// the writer's end the only one; t's cleanup closes it otherwise.
func StalledFIFO(t testing.TB, dir, name string) (string, *os.File) {
	t.Helper()
	path := Mkfifo(t, dir, name)
	rd, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		t.Fatalf("open %s for reading: %v", path, err)
	}
	t.Cleanup(func() { _ = rd.Close() })
	FillFIFO(t, path)
	return path, rd
}
