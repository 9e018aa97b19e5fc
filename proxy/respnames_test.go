package proxy

import (
	"net"
	"net/http"
	"strings"
	"testing"
)

// A sandbox answer whose header names hold a space or a tab ("X Bad: 1"),
// which fasthttp reads as names, is a 502 upstream_bad_response, as nginx
// (since 1.21.1) answers it: no field name has one, and clients read such
// a line each their own way (as X-Bad, as garbage, or fail). A WebSocket
// 101 with one is refused alike; a name without one passes.
func TestResponseHeaderNameWithSpaceRefused(t *testing.T) {
	h := newHarness(t)
	for _, tc := range []struct {
		name, answer string
		upgrade      bool
		status       int
	}{
		{"space in a name", "HTTP/1.1 200 OK\r\nX Bad: 1\r\nContent-Length: 2\r\n\r\nok", false, 502},
		{"tab in a name", "HTTP/1.1 200 OK\r\nX\tBad: 1\r\nContent-Length: 2\r\n\r\nok", false, 502}, // fasthttp refuses this one itself
		{"event stream", "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache Control: no-cache\r\n\r\ndata: x\n\n", false, 502},
		{"101", "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n" +
			"Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\nX Bad: 1\r\n\r\n", true, 502},
		{"a name without one", "HTTP/1.1 200 OK\r\nX-Good: 1\r\nContent-Length: 2\r\n\r\nok", false, 200},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newScriptBackend(t, func(c net.Conn, _ *http.Request, _ int) bool {
				rawWrite(c, tc.answer)
				return false
			})
			host := h.route("respnames", b.port)
			head := "GET / HTTP/1.1\r\nHost: " + host + "\r\nConnection: close\r\n"
			if tc.upgrade {
				head += "Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
			}
			resp, body := rawRequest(t, h.addr, head+"\r\n")
			if tc.status == 200 {
				if resp.StatusCode != 200 || body != "ok" || resp.Header.Get("X-Good") != "1" {
					t.Fatalf("%d %q %v, want the sandbox's 200 with X-Good", resp.StatusCode, body, resp.Header)
				}
				return
			}
			checkProxyError(t, resp, body, 502, CodeUpstreamBadHeader)
			if strings.Contains(body, "data: x") {
				t.Errorf("the sandbox's body reached the client: %q", body)
			}
		})
	}
}
