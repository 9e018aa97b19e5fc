package testenv

import (
	"net"
	"sync"
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
	var (
		mu    sync.Mutex
		conns []net.Conn
		ended bool
		wg    sync.WaitGroup
	)
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return // ln closed as the test ended
			}
			mu.Lock()
			if ended { // accepted just before the close: nobody serves it
				mu.Unlock()
				_ = c.Close()
				return
			}
			conns = append(conns, c)
			// Added while the loop's own count holds the group above
			// zero, so never racing the Wait below.
			wg.Go(func() { handle(c) })
			mu.Unlock()
		}
	})
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		ended = true
		for _, c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
		done := make(chan struct{})
		go func() { wg.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(handlerGrace):
			t.Errorf("raw TCP server %s: a handler still runs %v after its connection was closed", ln.Addr(), handlerGrace)
		}
	})
}
