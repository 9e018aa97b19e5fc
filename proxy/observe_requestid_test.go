package proxy

import (
	"bufio"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
	"github.com/cube-sandbox/cubeproxy/telemetry"
)

// The server span carries the request's X-Cube-Request-Id, the one its
// answer carries (the client's, or the one the proxy made): the id a
// customer reports, and the access log shows, leads an operator to the
// trace. Without it, nothing in a span tied it to a request id.
func TestServerSpanNamesRequestID(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tel := obsTelemetry(t, exp)
	h := newHarness(t, func(o *harnessOpts) { o.cfg.Telemetry = tel })
	rln := listen(t, "127.0.0.1:0")
	go h.server.ServeRedirect(rln, "8443")
	web := h.route("reqidspan", backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {})))
	// An event stream: relayed as it comes, finished by its own copy of
	// the exchange, as a tunnel is.
	sse := h.route("reqidspansse", backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f := sseHeaders(w)
		io.WriteString(w, "data: one\n\n")
		f.Flush()
	})))
	wsEnded := make(chan error, 1)
	ws := h.route("reqidspanws", wsBackend(t, wsEnded))
	const upgrade = "Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\n" +
		"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Protocol: echo.v1\r\n"

	tests := []struct {
		name, addr, head string
		status           int
	}{
		{"forwarded, the client's id", h.addr, "GET / HTTP/1.1\r\nHost: " + web + "\r\nX-Cube-Request-Id: client-id-1\r\n", 200},
		{"forwarded, a generated id", h.addr, "GET / HTTP/1.1\r\nHost: " + web + "\r\n", 200},
		{"proxy's 404", h.addr, "GET / HTTP/1.1\r\nHost: 80-reqidspanmissing.cube.test\r\n", 404},
		{"event stream", h.addr, "GET /sse HTTP/1.1\r\nHost: " + sse + "\r\nX-Cube-Request-Id: client-sse\r\n", 200},
		{"WebSocket", h.addr, "GET /ws HTTP/1.1\r\nHost: " + ws + "\r\nX-Cube-Request-Id: client-ws\r\n" + upgrade, 101},
		// An upload refused from its "Expect: 100-continue" head (curl
		// sends one with a body over 1 MiB), whose span is opened only
		// once the refusal is decided.
		{"Expect refused", h.addr, "POST / HTTP/1.1\r\nHost: " + web + "\r\nX-Cube-Request-Id: client-expect\r\nContent-Length: 9999999999\r\nExpect: 100-continue\r\n", 413},
		{"Expect refused, unknown sandbox", h.addr, "POST / HTTP/1.1\r\nHost: 80-reqidspanmissing.cube.test\r\nContent-Length: 5\r\nExpect: 100-continue\r\n", 404},
		{"parser's 431", h.addr, "GET / HTTP/1.1\r\nHost: " + web + "\r\nX-Big: " + strings.Repeat("b", 70<<10) + "\r\n", 431},
		{"redirect listener", rln.Addr().String(), "GET /r HTTP/1.1\r\nHost: " + web + "\r\n", 308},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			exp.Reset()
			c := dialRaw(t, tc.addr)
			if _, err := c.Write([]byte(tc.head + "\r\n")); err != nil {
				t.Fatal(err)
			}
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil || resp.StatusCode != tc.status {
				t.Fatalf("response %v, %v; want %d", resp, err, tc.status)
			}
			id := resp.Header.Get("X-Cube-Request-Id")
			if id == "" {
				t.Fatal("answer carries no request id")
			}
			c.Close() // ends a tunnel; the others are answered
			var server []tracetest.SpanStub
			testenv.WaitFor(t, 5*time.Second, "the server span", func() bool {
				server = server[:0]
				for _, s := range exp.GetSpans() {
					if s.SpanKind == trace.SpanKindServer {
						server = append(server, s)
					}
				}
				return len(server) > 0
			})
			if len(server) != 1 {
				t.Fatalf("%d server spans, want 1", len(server))
			}
			if got := attrOf(server[0], telemetry.AttrRequestID); got != id {
				t.Errorf("span's %s = %q, want the answer's %q", telemetry.AttrRequestID, got, id)
			}
		})
	}
}
