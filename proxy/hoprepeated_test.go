package proxy

import (
	"fmt"
	"strings"
	"testing"
)

// A field the sandbox's Connection names is removed from its answer even
// beside a repeated field, whose lines keep their order: a 101 carrying a
// WebSocket's Sec-WebSocket-Extensions or Set-Cookie on several lines, or
// any answer. The lines' order is remembered before Connection's options
// are walked: fasthttp's PeekAll gives one scratch slice per head, which
// remembering a repeated field refilled with that field's lines, and the
// names deleted were its values, the named field left in.
func TestNamedHopRemovedBesideRepeatedField(t *testing.T) {
	h := newHarness(t)
	for _, tc := range []struct {
		name, status, req, rest string
	}{
		{"101", "101 Switching Protocols",
			"Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n",
			"Upgrade: websocket\r\n"},
		{"200", "200 OK", "", "Content-Length: 2\r\n\r\nok"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			answer := "HTTP/1.1 " + tc.status + "\r\nConnection: Upgrade, X-Hop\r\nX-Hop: secret\r\n" +
				"X-Rep: 1\r\nX-Rep: 2\r\nX-End: 1\r\n" + tc.rest
			if tc.name == "101" {
				answer += "\r\n"
			}
			host := h.route("hoprep"+tc.name, rawBackend(t, answer))
			head := rawHead(t, h.addr, fmt.Sprintf("GET / HTTP/1.1\r\nHost: %s\r\n%s\r\n", host, tc.req))
			if !strings.HasPrefix(head, "HTTP/1.1 "+tc.status+"\r\n") || !strings.Contains(head, "\r\nX-End: 1\r\n") {
				t.Fatalf("answer:\n%s", head)
			}
			if strings.Contains(head, "X-Hop") {
				t.Errorf("X-Hop, named in the sandbox's Connection, reached the client:\n%s", head)
			}
			if !strings.Contains(head, "\r\nX-Rep: 1\r\nX-Rep: 2\r\n") {
				t.Errorf("X-Rep's lines lost their order:\n%s", head)
			}
		})
	}
}
