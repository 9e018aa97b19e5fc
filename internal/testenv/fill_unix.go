//go:build unix

package testenv

import (
	"errors"
	"syscall"
	"testing"
)

// Fill writes to raw (a socket's or pipe's) until the kernel takes no
// more, without waiting: a peer that reads nothing then leaves the next
// write blocked, with no write in flight.
func Fill(t testing.TB, raw syscall.RawConn) {
	t.Helper()
	chunk := make([]byte, 64<<10)
	var werr error
	for werr == nil {
		if err := raw.Write(func(fd uintptr) bool {
			_, werr = syscall.Write(int(fd), chunk)
			return true // report EAGAIN instead of waiting
		}); err != nil {
			t.Fatal(err)
		}
	}
	if !errors.Is(werr, syscall.EAGAIN) {
		t.Fatalf("filling the buffer: %v", werr)
	}
}
