package proxy

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// A refusal answered with a lingering close during the drain (an upload's
// 404, 403 or 413, the rest of its body to be read and dropped) counts
// for the drain from its handler on: fasthttp counts the connection out
// as the handler returns, before the hijack handler that writes the
// answer and lingers, and a drain that looked in between found nothing
// open and ended. Shutdown then closed the connection over the client's
// unread body: a reset, and a client that reads only once its body is
// sent got a broken pipe instead of its answer.
func TestDrainWaitsForARefusalAboutToLinger(t *testing.T) {
	h := newHarness(t, func(o *harnessOpts) { o.srv.DrainTimeout = 10 * time.Second })
	hooked, proceed := make(chan struct{}), make(chan struct{})
	h.proxy.beforeRefusalLingers = func() {
		close(hooked)
		<-proceed
	}
	// Serving: a Shutdown before Serve has begun closes nothing.
	if code, _, _ := h.get("8080-nobox.cube.test", "/"); code != 404 {
		t.Fatalf("traffic listener: %d", code)
	}
	// Connected before the drain, its request sent after the listener
	// closed (fasthttp serves a new connection's first request for 5 s).
	c := dialRaw(t, h.addr)
	shut := make(chan error, 1)
	go func() { shut <- h.server.Shutdown(context.Background()) }()
	h.waitListenerClosed(5 * time.Second)
	const size = 1 << 20
	piece := make([]byte, 64<<10)
	fmt.Fprintf(c, "POST /up HTTP/1.1\r\nHost: 8080-nobox.cube.test\r\nContent-Length: %d\r\n\r\n", size)
	// fasthttp reads the body's first 8 KiB before the handler runs.
	if _, err := c.Write(piece); err != nil {
		t.Fatal(err)
	}
	sent := len(piece)
	select {
	case <-hooked:
	case <-time.After(5 * time.Second):
		t.Fatal("the refusal's hijack handler never ran")
	}
	// fasthttp's own wait looks every 100 ms.
	select {
	case err := <-shut:
		close(proceed)
		t.Fatalf("the drain ended (%v) with a refusal about to linger", err)
	case <-time.After(500 * time.Millisecond):
	}
	close(proceed)
	for ; sent < size; sent += len(piece) {
		if _, err := c.Write(piece); err != nil {
			t.Fatalf("the body during the drain, at %d of %d bytes: %v", sent, size, err)
		}
	}
	lingeredUntilClientCloses(t, c, shut)
	h.waitClientConnsClosed(t)
}
