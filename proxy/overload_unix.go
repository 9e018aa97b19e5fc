//go:build unix

package proxy

import (
	"net"
	"syscall"
)

// writeNow makes one non-blocking write of b to c: whatever the socket
// does not take at once is dropped, and nothing waits.
func writeNow(c net.Conn, b []byte) {
	rc := rawConn(c)
	if rc == nil {
		return
	}
	_ = rc.Write(func(fd uintptr) bool {
		_, _ = syscall.Write(int(fd), b)
		return true // done, even on EAGAIN: never wait for the client
	})
}

// discardNow reads what c holds already into buf and drops it, at most
// reads times, without waiting for more.
func discardNow(c net.Conn, buf []byte, reads int) {
	rc := rawConn(c)
	if rc == nil {
		return
	}
	_ = rc.Read(func(fd uintptr) bool {
		for range reads {
			if n, err := syscall.Read(int(fd), buf); err != nil || n < len(buf) {
				break // EAGAIN (nothing more yet), EOF, or the last of it
			}
		}
		return true
	})
}
