//go:build unix

package proxy

import (
	"net"
	"net/http"
	"syscall"
	"testing"
)

// A sandbox connection sends no TCP keep-alive probes. A paused sandbox's
// VM does not run, so it acknowledges nothing, and Go's default probes
// (SO_KEEPALIVE after 15 s idle, then 9 more 15 s apart) had the kernel
// abort each of its connections about 150 s into the pause: an MCP
// session's GET stream, a call's answer stream or a WebSocket, which the
// proxy keeps across a pause (README: What an MCP agent sees), was cut all
// the same, and the go-sdk's reconnect into the pause's 503 failed the
// session. nginx sets no SO_KEEPALIVE on upstream connections
// (proxy_socket_keepalive off); a dead sandbox is found by
// response_header_timeout, upstream.idle_timeout or a kill, as there.
//
// Measured with a veth pair whose far end was set down under an open
// connection (no acknowledgement comes back, as from a paused VM): with
// the default the read failed after 150 s ("connection timed out"); with
// no probes it was still waiting at 200 s.
func TestSandboxConnsSendNoTCPKeepAlive(t *testing.T) {
	h := newHarness(t)
	b := newScriptBackend(t, func(c net.Conn, _ *http.Request, _ int) bool {
		return rawWrite(c, okResponse("ok"))
	})
	host := h.route("keepalive", b.port)
	if resp, body := h.dialProxy(t).do("GET", host, "/", ""); resp.StatusCode != 200 || body != "ok" {
		t.Fatalf("got %d %q", resp.StatusCode, body)
	}
	waitPoolConns(t, h, 1)

	var c *upstreamConn
	h.proxy.pools.mu.RLock()
	for _, u := range h.proxy.pools.m {
		u.mu.Lock()
		if len(u.idle) > 0 {
			c = u.idle[0]
		}
		u.mu.Unlock()
	}
	h.proxy.pools.mu.RUnlock()
	if c == nil {
		t.Fatal("no idle sandbox connection in the pool")
	}
	sc, ok := c.Conn.(syscall.Conn)
	if !ok {
		t.Fatalf("sandbox connection is a %T, not a socket", c.Conn)
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var on int
	var gerr error
	if err := rc.Control(func(fd uintptr) {
		on, gerr = syscall.GetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_KEEPALIVE)
	}); err != nil || gerr != nil {
		t.Fatalf("getsockopt SO_KEEPALIVE: %v %v", err, gerr)
	}
	if on != 0 {
		t.Fatal("sandbox connection has SO_KEEPALIVE set: a sandbox paused for longer than the kernel's probes loses its open streams")
	}
}
