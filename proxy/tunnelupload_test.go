package proxy

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// Traffic from the client alone keeps a tunnel open too: a client that
// only sends (a terminal's keystrokes to a shell that prints nothing, a
// stream of log lines or audio to the sandbox) is not silent for the idle
// timeout (README: closed only when neither side sent anything for that
// long). The sandbox answers once it has every message, and the client
// must get that answer. The pushes of TestOneWayTunnelOutlivesIdleTimeout
// go the other way, whose writes to the client count as traffic on their
// own: this direction counts only by the proxy's reads.
func TestClientOnlyTunnelOutlivesIdleTimeout(t *testing.T) {
	t.Parallel()
	const idle, n = time.Second, 20 // 20 messages, idle/10 apart: 2 idle timeouts
	h := newHarness(t, func(o *harnessOpts) { o.cfg.IdleStreamTimeout = idle })
	port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, &websocket.AcceptOptions{Subprotocols: []string{"echo.v1"}})
		if err != nil {
			return
		}
		defer c.CloseNow()
		for i := range n {
			if _, got, err := c.Read(r.Context()); err != nil || string(got) != fmt.Sprint("key ", i) {
				c.Write(r.Context(), websocket.MessageText, fmt.Appendf(nil, "message %d: %q, %v", i, got, err))
				return
			}
		}
		c.Write(r.Context(), websocket.MessageText, []byte("got all"))
	}))
	c := dialWS(t, h, h.route("wskeys", port))
	defer c.CloseNow()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start := time.Now()
	for i := range n {
		if err := c.Write(ctx, websocket.MessageText, []byte(fmt.Sprint("key ", i))); err != nil {
			t.Fatalf("message %d, %v after the upgrade: %v", i, time.Since(start), err)
		}
		time.Sleep(idle / 10) // traffic well within the idle timeout
	}
	if _, got, err := c.Read(ctx); err != nil || string(got) != "got all" {
		t.Fatalf("the sandbox's answer, %v after the upgrade: %q, %v; want \"got all\"", time.Since(start), got, err)
	}
}
