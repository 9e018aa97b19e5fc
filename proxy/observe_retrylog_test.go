package proxy

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"testing"

	"github.com/cube-sandbox/cubeproxy/accesslog"
)

// A request the proxy sent to its sandbox more than once (a GET re-sent
// because the pooled connection it went out on had been closed by the
// sandbox, a connect retried) says so in its JSON access log line:
// upstream_retries counts the attempts made again, upstream_retry_code is
// the error code of the first that failed. The line described the last
// attempt alone: a request that needed a second try passed for one that
// went through at once, and a 502 after two refused connects for one.
func TestAccessLogCountsRetriedAttempts(t *testing.T) {
	h, logs := logHarness(t, accesslog.FormatJSON)
	b := newScriptBackend(t, func(c net.Conn, req *http.Request, n int) bool {
		return closedOnSecondRequest(c, n) // the second request is re-sent
	})
	host := h.route("retrylog", b.port)
	c := dialRaw(t, h.addr)
	br := bufio.NewReader(c)
	for i := range 2 {
		fmt.Fprintf(c, "GET /%d HTTP/1.1\r\nHost: %s\r\nX-Cube-Request-Id: retrylog-%d\r\n\r\n", i, host, i)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("request %d: %d, want 200", i, resp.StatusCode)
		}
	}
	dead := freePort(t) // nothing listens: the connect is refused, twice
	for _, tc := range []struct{ name, upgrade string }{
		{"plain", ""},
		{"websocket", "Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"},
	} {
		closing := "Connection: close\r\n"
		if tc.upgrade != "" {
			closing = ""
		}
		head := fmt.Sprintf("GET / HTTP/1.1\r\nHost: %s\r\nX-Cube-Request-Id: retrylog-refused-%s\r\n%s%s\r\n",
			h.route("retrylogdead"+tc.name, dead), tc.name, tc.upgrade, closing)
		if st := roundTripRaw(t, h, head); st != 502 {
			t.Fatalf("%s: status %d, want 502", tc.name, st)
		}
	}
	for _, tc := range []struct {
		id      string
		retries float64
		code    string
	}{
		{"retrylog-0", 0, ""},
		{"retrylog-1", 1, CodeUpstreamReset},
		{"retrylog-refused-plain", 1, CodeUpstreamConnect},
		{"retrylog-refused-websocket", 1, CodeUpstreamConnect},
	} {
		e := logs.waitJSON(t, tc.id)
		if e["upstream_retries"] != tc.retries || e["upstream_retry_code"] != tc.code {
			t.Errorf("%s: upstream_retries %v upstream_retry_code %v, want %v %q", tc.id, e["upstream_retries"], e["upstream_retry_code"], tc.retries, tc.code)
		}
	}
}
