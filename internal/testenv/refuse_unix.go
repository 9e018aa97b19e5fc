//go:build unix

package testenv

import (
	"net"
	"strconv"
	"syscall"
	"testing"
)

// RefusingPort returns a port on 127.0.0.1 that refuses connections until
// the test ends: a socket bound to it, never listening, holds it. A port
// picked by listening and closing could be taken meanwhile by any socket of
// the machine (go test runs packages side by side, each starting servers),
// and a dial meant to be refused would then connect.
func RefusingPort(t testing.TB) int {
	t.Helper()
	fd, err := inetSocket()
	if err != nil {
		t.Fatalf("refusing port: socket: %v", err)
	}
	t.Cleanup(func() { _ = syscall.Close(fd) })
	// No SO_REUSEADDR: no other socket may bind the port while it is held.
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatalf("refusing port: bind: %v", err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatalf("refusing port: getsockname: %v", err)
	}
	return sa.(*syscall.SockaddrInet4).Port
}

// RefusingAddr is 127.0.0.1:RefusingPort(t).
func RefusingAddr(t testing.TB) string {
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(RefusingPort(t)))
}

// inetSocket is a TCP socket made close-on-exec under syscall.ForkLock, as
// the os and net packages make theirs: a child process another test starts
// meanwhile (a cubeproxy binary) must not inherit it, and hold its port
// after the test closed its own copy.
func inetSocket() (int, error) {
	syscall.ForkLock.RLock()
	defer syscall.ForkLock.RUnlock()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err == nil {
		syscall.CloseOnExec(fd)
	}
	return fd, err
}
