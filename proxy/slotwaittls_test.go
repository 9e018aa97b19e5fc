package proxy

import (
	"crypto/tls"
	"io"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// A TLS client that closes its connection while its request waits for a
// slot ends the wait, as a plain one does: it sends a close_notify before
// its FIN, which a peek at the socket reads as data, and the request went
// on waiting, reached the sandbox once a slot freed (a tool call its agent
// had given up on, run as late as stream_limit_wait after) and held the
// slot meanwhile.
func TestStreamLimitWaitTLSClientGone(t *testing.T) {
	w := newSlotWaitBox(t, time.Minute)
	addr, roots := serveTLS(t, w.h)
	a := w.openSSE(t)
	c := tls.Client(dialRaw(t, addr), &tls.Config{RootCAs: roots, ServerName: slotWaitHost})
	if _, err := io.WriteString(c, "GET /hold HTTP/1.1\r\nHost: "+slotWaitHost+"\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 10*time.Second, "the request to wait for a slot", func() bool { return w.h.proxy.limitWaiting.Load() == 1 })
	c.Close() // close_notify, then FIN
	testenv.WaitFor(t, 10*time.Second, "the wait to end with its client gone", func() bool { return w.h.proxy.limitWaiting.Load() == 0 })
	w.waits(t, 0, 1)
	w.releaseOnce()
	io.Copy(io.Discard, a)
	select {
	case <-w.arrived:
		t.Fatal("the request of a client that left reached the sandbox")
	case <-time.After(200 * time.Millisecond):
	}
}
