//go:build !unix

package proxy

import (
	"net"
	"time"
)

// refuseWait is what a refusal waits at most for the socket: no
// non-blocking call is at hand here, so a deadline that has all but
// passed stands in for one.
const refuseWait = time.Millisecond

// writeNow writes b to c, waiting at most refuseWait.
func writeNow(c net.Conn, b []byte) {
	_ = c.SetWriteDeadline(time.Now().Add(refuseWait))
	_, _ = c.Write(b)
}

// discardNow reads what c holds already into buf and drops it, at most
// reads times, waiting at most refuseWait for each.
func discardNow(c net.Conn, buf []byte, reads int) {
	for range reads {
		_ = c.SetReadDeadline(time.Now().Add(refuseWait))
		if n, err := c.Read(buf); err != nil || n < len(buf) {
			return
		}
	}
}
