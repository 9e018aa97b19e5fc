//go:build unix

package testenv

import (
	"syscall"
	"testing"
)

// The sockets RefusingPort and FrozenListener hold are close-on-exec: a
// cubeproxy binary a parallel test starts must not inherit them.
func TestInetSocketIsCloseOnExec(t *testing.T) {
	fd, err := inetSocket()
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(fd)
	flags, _, errno := syscall.Syscall(syscall.SYS_FCNTL, uintptr(fd), syscall.F_GETFD, 0)
	if errno != 0 {
		t.Fatal(errno)
	}
	if flags&syscall.FD_CLOEXEC == 0 {
		t.Errorf("fd flags %#x: not close-on-exec", flags)
	}
}
