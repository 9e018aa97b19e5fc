//go:build unix

package testenv

import (
	"os"
	"syscall"
	"testing"
)

// BlockingPipe returns both ends of a new pipe as a process inherits its
// stdout: *os.File on blocking descriptors, which Go does not hand to its
// poller (os.Pipe's it does). Both are closed when the test ends. The
// descriptors are made close-on-exec under syscall.ForkLock, as the
// standard library does where pipe2 is missing (macOS): a child another
// test starts meanwhile must not hold a write end open.
func BlockingPipe(t testing.TB) (r, w *os.File) {
	t.Helper()
	var p [2]int
	syscall.ForkLock.RLock()
	err := syscall.Pipe(p[:])
	if err == nil {
		syscall.CloseOnExec(p[0])
		syscall.CloseOnExec(p[1])
	}
	syscall.ForkLock.RUnlock()
	if err != nil {
		t.Fatalf("pipe: %v", err)
	}
	r, w = os.NewFile(uintptr(p[0]), "pipe-r"), os.NewFile(uintptr(p[1]), "pipe-w")
	t.Cleanup(func() {
		r.Close()
		w.Close()
	})
	return r, w
}
