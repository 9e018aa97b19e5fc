//go:build unix

package proxy

import (
	"syscall"
	"testing"
)

// freePort is a port on 127.0.0.1 that refuses connections until the test
// ends: a socket bound to it, never listening, holds it. A port picked by
// listening and closing could be taken meanwhile by any socket of the
// machine (go test runs packages side by side), and a dial meant to be
// refused would then connect.
func freePort(t *testing.T) uint16 {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Close(fd) })
	// No SO_REUSEADDR: no other socket may bind the port while it is held.
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	return uint16(sa.(*syscall.SockaddrInet4).Port)
}
