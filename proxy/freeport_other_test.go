//go:build !unix

package proxy

import (
	"net"
	"testing"
)

// freePort is a port on 127.0.0.1 nothing listens on (for a moment: see
// the unix version, which holds it).
func freePort(t *testing.T) uint16 {
	ln := listen(t, "127.0.0.1:0")
	p := uint16(ln.Addr().(*net.TCPAddr).Port)
	ln.Close()
	return p
}
