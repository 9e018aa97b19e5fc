package testenv

import (
	"net"
	"sync"
	"syscall"
	"testing"
	"time"
)

// handlerGrace is how long Serve waits, when the test ends, for handlers
// to return after their connections were closed: one still running then
// is blocked on something else, and the test fails instead of hanging.
const handlerGrace = 10 * time.Second

// ServeTCP plays a raw TCP server (a sandbox, a collector, a Redis that
// misbehaves on purpose): it listens on 127.0.0.1:0 and serves it with
// Serve. The listener is returned for its address.
func ServeTCP(t testing.TB, handle func(c net.Conn)) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("raw TCP server: %v", err)
	}
	Serve(t, ln, handle)
	return ln
}

// Serve accepts connections on ln until the test ends and runs handle on
// a goroutine of its own for each. A handler may return with its
// connection still open (a server that hangs, or one that hands the
// connection to the test): when the test ends, Serve closes ln and every
// connection it accepted, then waits for the accept loop and the handlers
// to return, so that none of them touches the test's state after it. A
// handler blocked on anything but its connection must also give up at
// t.Context().Done(), which is done just before; one still running
// handlerGrace later fails the test.
func Serve(t testing.TB, ln net.Listener, handle func(c net.Conn)) {
	serve(t, ln, handle)
}

// tcpServer is Serve's state: the connections it may have to close.
type tcpServer struct {
	mu    sync.Mutex
	conns map[net.Conn]struct{}
	ended bool
	wg    sync.WaitGroup
}

func serve(t testing.TB, ln net.Listener, handle func(c net.Conn)) *tcpServer {
	s := &tcpServer{conns: make(map[net.Conn]struct{})}
	s.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return // ln closed as the test ended
			}
			s.mu.Lock()
			if s.ended { // accepted just before the close: nobody serves it
				s.mu.Unlock()
				_ = c.Close()
				return
			}
			s.conns[c] = struct{}{}
			// Added while the loop's own count holds the group above
			// zero, so never racing the Wait below.
			s.wg.Go(func() {
				handle(c)
				// A fuzz target's server lives as long as the fuzz run
				// and accepts a connection per input: one its handler
				// closed is let go, not kept until the end.
				if isClosed(c) {
					s.mu.Lock()
					delete(s.conns, c)
					s.mu.Unlock()
				}
			})
			s.mu.Unlock()
		}
	})
	t.Cleanup(func() {
		_ = ln.Close()
		s.mu.Lock()
		s.ended = true
		for c := range s.conns {
			_ = c.Close()
		}
		s.mu.Unlock()
		done := make(chan struct{})
		go func() { s.wg.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(handlerGrace):
			t.Errorf("raw TCP server %s: a handler still runs %v after its connection was closed", ln.Addr(), handlerGrace)
		}
	})
	return s
}

// isClosed reports whether c was closed on this side: its descriptor then
// refuses any use. A connection that cannot say is taken as open.
func isClosed(c net.Conn) bool {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return true
	}
	return rc.Control(func(uintptr) {}) != nil
}
