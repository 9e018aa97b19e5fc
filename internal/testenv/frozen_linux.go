package testenv

import (
	"net"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// FrozenListener returns the port of a sandbox whose server stopped
// accepting and whose listen backlog is full (a frozen VM, a stuck accept
// loop): the kernel drops further SYNs to 127.0.0.1:port, so a connect
// neither succeeds nor is refused. Linux only: other kernels answer a
// full backlog differently.
func FrozenListener(t testing.TB) uint16 {
	t.Helper()
	fd, err := inetSocket()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Listen(fd, 0); err != nil {
		t.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	port := sa.(*syscall.SockaddrInet4).Port
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	// Fill the backlog: connects complete until one no longer does.
	for i := 0; ; i++ {
		c, err := net.DialTimeout("tcp", addr, 100*time.Millisecond)
		if err != nil {
			break
		}
		t.Cleanup(func() { c.Close() })
		if i == 8 {
			t.Fatal("the kernel keeps accepting into a backlog of 0")
		}
	}
	return uint16(port)
}
