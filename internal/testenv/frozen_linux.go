package testenv

import (
	"net"
	"os"
	"strconv"
	"sync"
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
	port, _ := ThawableFrozenListener(t)
	return port
}

// ThawableFrozenListener is a FrozenListener whose sandbox can thaw: thaw
// returns its listener, and once the test accepts the connections queued
// in its backlog (a server on it), the kernel completes connects again, a
// dropped SYN at its next retransmission (1 s after the connect began, as
// a frozen VM's resume lets it through). Its listener closes when the
// test ends; thaw may be called once.
func ThawableFrozenListener(t testing.TB) (port uint16, thaw func() net.Listener) {
	t.Helper()
	fd, err := inetSocket()
	if err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	closeFD := func() { once.Do(func() { syscall.Close(fd) }) }
	t.Cleanup(closeFD)
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
	p := sa.(*syscall.SockaddrInet4).Port
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(p))
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
	return uint16(p), func() net.Listener {
		t.Helper()
		var ln net.Listener
		once.Do(func() {
			// FileListener takes a duplicate of the same socket; the
			// File, closed here, owns fd from now on.
			f := os.NewFile(uintptr(fd), "frozen listener")
			ln, err = net.FileListener(f)
			f.Close()
		})
		if ln == nil {
			t.Fatalf("thaw: %v (called twice?)", err)
		}
		t.Cleanup(func() { ln.Close() })
		return ln
	}
}
