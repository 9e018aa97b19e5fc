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
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("silent server: %v", err)
	}
	reached := make(chan struct{})
	var (
		mu   sync.Mutex
		held []net.Conn
		once sync.Once
	)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			held = append(held, c)
			mu.Unlock()
			once.Do(func() { close(reached) })
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		<-done
		mu.Lock()
		defer mu.Unlock()
		for _, c := range held {
			_ = c.Close()
		}
	})
	return &SilentServer{Addr: ln.Addr().String(), Reached: reached}
}
