package proxy

import (
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// A request the sandbox worked on for long and then answered with a head
// the proxy refuses (a 502 upstream_bad_response) dates the sandbox's
// activity by that answer, as every other failure does
// (TestLastActiveDatesLongRequestsByTheirEnd): a WebSocket's 101 that
// came once a kernel was up, minutes after the handshake, but named a
// protocol the client never offered, or any answer whose head has a field
// name with a space. Earlier builds dated these by the request's start,
// so an idle reaper polling last_active just after saw a sandbox that had
// worked all along idle for as long, and could pause it under the client
// that was about to retry.
func TestLastActiveDatesRefusedHeadsByTheirEnd(t *testing.T) {
	const upgrade = "Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
	for _, tc := range []struct {
		name, fields, answer string
	}{
		{"101 to a protocol not offered", upgrade,
			"HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\nConnection: Upgrade\r\n\r\n"},
		{"101 with a name holding a space", upgrade,
			"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nX Bad: 1\r\n\r\n"},
		{"answer with a name holding a space", "",
			"HTTP/1.1 200 OK\r\nX Bad: 1\r\nContent-Length: 2\r\n\r\nok"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			arrived, release := make(chan struct{}), make(chan struct{})
			b := newScriptBackend(t, func(c net.Conn, _ *http.Request, _ int) bool {
				close(arrived)
				<-release
				rawWrite(c, tc.answer)
				return false
			})
			host := h.route("badhead", b.port)
			done := h.goRawStatus(t, "GET /ws HTTP/1.1\r\nHost: "+host+"\r\n"+tc.fields+"\r\n")
			testenv.Recv(t, arrived, 10*time.Second, "the request at the sandbox")
			// The request started at or before mark; its answer comes after.
			mark := passedMilli()
			close(release)
			if st := testenv.Recv(t, done, 10*time.Second, "the client's answer"); st != http.StatusBadGateway {
				t.Fatalf("answer: %d, want 502", st)
			}
			h.wantActiveAfter(t, "badhead", mark, "a request refused")
		})
	}
}

// So is a connect that timed out, a WebSocket handshake's as a plain
// request's: a frozen sandbox (a VM snapshotting) holds each of the two
// connects for upstream.connect_timeout, and the 504 dates the activity.
// The handshake's was dated by its start.
func TestLastActiveDatesConnectTimeoutsByTheirEnd(t *testing.T) {
	for _, tc := range []struct{ name, fields string }{
		{"WebSocket", "Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"},
		{"plain", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, func(o *harnessOpts) { o.cfg.ConnectTimeout = 300 * time.Millisecond })
			host := h.route("frozenact", testenv.FrozenListener(t))
			done := h.goRawStatus(t, "GET /ws HTTP/1.1\r\nHost: "+host+"\r\n"+tc.fields+"\r\n")
			// The pool counts the connection before the connect, which a
			// frozen sandbox never completes.
			testenv.WaitFor(t, 5*time.Second, "the connect to start", func() bool { return poolConns(h) == 1 })
			mark := passedMilli()
			if st := testenv.Recv(t, done, 10*time.Second, "the client's answer"); st != http.StatusGatewayTimeout {
				t.Fatalf("answer: %d, want 504", st)
			}
			h.wantActiveAfter(t, "frozenact", mark, "a connect that timed out")
		})
	}
}
