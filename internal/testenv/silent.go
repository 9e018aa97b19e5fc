package testenv

import (
	"net"
	"sync"
	"testing"
)

// SilentServer accepts TCP connections on loopback and never answers: a CA
// (or any server) that hangs. Its connections close when the test ends.
type SilentServer struct {
	// Addr is host:port.
	Addr string
	// Reached receives once a connection was accepted.
	Reached <-chan struct{}
}

// StartSilentServer starts a SilentServer, stopped when the test ends.
func StartSilentServer(t testing.TB) *SilentServer {
	t.Helper()
	reached := make(chan struct{})
	var once sync.Once
	ln := ServeTCP(t, func(net.Conn) { once.Do(func() { close(reached) }) }) // held open until the end
	return &SilentServer{Addr: ln.Addr().String(), Reached: reached}
}
