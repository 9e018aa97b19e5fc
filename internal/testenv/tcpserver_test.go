package testenv_test

import (
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// When the test that started it ends, a raw TCP server closes the
// connections its handlers left open and its listener, and its handlers
// have all returned: one that waits on its connection and one that
// returned at once, keeping it open for the test.
func TestServeTCPClosesAtTheEnd(t *testing.T) {
	var addr string
	var running, served atomic.Int32
	clients := make([]net.Conn, 2)
	t.Run("server", func(t *testing.T) {
		accepted := make(chan struct{}, 2)
		ln := testenv.ServeTCP(t, func(c net.Conn) {
			running.Add(1)
			defer running.Add(-1)
			// Said once the byte is written: the test ends, and Serve
			// closes c, as soon as both are said, and a close before the
			// write left the client nothing to read.
			_, err := c.Write([]byte("x"))
			accepted <- struct{}{}
			if err != nil {
				return
			}
			if served.Add(1) == 2 {
				return // the connection stays open for the test
			}
			_, _ = io.Copy(io.Discard, c) // until Serve closes it
		})
		addr = ln.Addr().String()
		for i := range clients {
			c, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			clients[i] = c
			testenv.Recv(t, accepted, 10*time.Second, "the handler's write")
		}
	})
	if n := running.Load(); n != 0 {
		t.Errorf("%d handlers still running after the test ended", n)
	}
	for i, c := range clients {
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		b, err := io.ReadAll(c) // the handler's byte, then the close
		if err != nil || string(b) != "x" {
			t.Errorf("client %d read %q, %v: want \"x\" and the server's close", i, b, err)
		}
		c.Close()
	}
	if c, err := net.Dial("tcp", addr); err == nil {
		c.Close()
		t.Error("the listener still accepts after the test ended")
	}
}
