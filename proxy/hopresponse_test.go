package proxy

import (
	"fmt"
	"strings"
	"testing"
)

// DESIGN.md: hop-by-hop headers are removed, and the README says both
// ways. An answer may carry one with no Connection line naming it (a
// sandbox behind its own proxy sends Proxy-Authenticate; a framework
// announces Trailer), so each is looked for by name alone, on each way an
// answer's head goes out: relayed whole with a small body, streamed in
// chunks, and written by the proxy itself for a detached event stream.
// nginx, with the platform's settings, relays the Proxy-* ones and Trailer
// (README, Forwarding behaviour, Headers).
func TestResponseHopHeadersRemovedWithoutConnection(t *testing.T) {
	h := newHarness(t)
	for _, hop := range []string{"Proxy-Authenticate: Basic realm=sandbox", "Proxy-Connection: keep-alive",
		"Keep-Alive: timeout=5", "Te: trailers", "Trailer: X-Checksum", "Upgrade: websocket"} {
		name, _, _ := strings.Cut(hop, ":")
		for _, kind := range []struct{ name, head, body string }{
			{"sized", "Content-Length: 2\r\n", "ok"},
			{"chunked", "Transfer-Encoding: chunked\r\n", "2\r\nok\r\n0\r\n\r\n"},
			{"event stream", "Content-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n", "7\r\ndata:\n\n\r\n0\r\n\r\n"},
		} {
			t.Run(name+"/"+kind.name, func(t *testing.T) {
				id := strings.ToLower(strings.ReplaceAll(name, "-", "")) + strings.ReplaceAll(kind.name, " ", "")
				host := h.route(id, rawBackend(t, "HTTP/1.1 200 OK\r\n"+hop+"\r\nX-End: 1\r\n"+kind.head+"\r\n"+kind.body))
				head := rawHead(t, h.addr, fmt.Sprintf("GET / HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", host))
				if !strings.HasPrefix(head, "HTTP/1.1 200 ") || !strings.Contains(head, "\r\nX-End: 1\r\n") {
					t.Fatalf("answer:\n%s", head)
				}
				if strings.Contains(strings.ToLower(head), "\r\n"+strings.ToLower(name)+":") {
					t.Errorf("%s reached the client:\n%s", name, head)
				}
			})
		}
	}
}
