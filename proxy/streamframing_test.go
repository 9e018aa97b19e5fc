package proxy

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
)

// A chunked body whose framing is broken before its first data byte, in
// the bytes that came with the head (a size that is no hex number, a
// size line longer than maxChunkLine, a bare LF), gave the client nothing
// it could read: fasthttp holds such a head back for the body bytes it
// seems to announce, the first Read failed, and the connection closed
// with the head unsent (curl's "empty reply from server", a Go client
// retrying the request), while the access log recorded a 200. Nothing
// having gone out, the proxy answers 502 upstream_bad_response, as it
// does for a small body that breaks off, on every path (fasthttp's
// writer, a detached event stream, an HTTP/1.0 client), and does not
// reuse the sandbox's connection.
func TestChunkedFramingBrokenWithHeadIs502(t *testing.T) {
	h, logs := logHarness(t, "json")
	framings := []struct{ name, body string }{
		{"size not hex", "zz\r\nabc\r\n0\r\n\r\n"},
		{"size line too long", "3;" + strings.Repeat("e", maxChunkLine) + "\r\nabc\r\n0\r\n\r\n"},
		{"bare LF after size", "3\nabc\r\n0\r\n\r\n"},
		{"bad trailer after last chunk", "0\r\n:x\r\n\r\n"},
	}
	paths := []struct{ name, ctype, proto string }{
		{"fasthttp writer", "text/plain", "HTTP/1.1"},
		{"detached event stream", "text/event-stream", "HTTP/1.1"},
		{"HTTP/1.0 client", "text/plain", "HTTP/1.0"},
	}
	for i, f := range framings {
		for j, p := range paths {
			t.Run(f.name+"/"+p.name, func(t *testing.T) {
				b := newScriptBackend(t, func(c net.Conn, _ *http.Request, _ int) bool {
					// One write: the framing comes with the head.
					rawWrite(c, "HTTP/1.1 200 OK\r\nContent-Type: "+p.ctype+"\r\nTransfer-Encoding: chunked\r\n\r\n"+f.body)
					return true // kept open: only the proxy may close it
				})
				id := fmt.Sprintf("brokenframing%d%d", i, j)
				host := h.route(id, b.port)
				reqID := "framing-" + id
				c := dialRaw(t, h.addr)
				fmt.Fprintf(c, "GET / %s\r\nHost: %s\r\nX-Cube-Request-Id: %s\r\n\r\n", p.proto, host, reqID)
				resp, err := http.ReadResponse(bufio.NewReader(c), nil)
				if err != nil {
					t.Fatalf("client got no answer it could read: %v", err)
				}
				body, _ := io.ReadAll(resp.Body)
				checkProxyError(t, resp, string(body), 502, CodeUpstreamBadHeader)
				if err := b.waitEnded(t); err != io.EOF {
					t.Errorf("sandbox connection ended with %v, want closed by the proxy (EOF)", err)
				}
				waitPoolConns(t, h, 0)
				e := logs.waitJSON(t, reqID)
				if e["status"] != float64(502) || e["upstream_status"] != float64(200) || e["error_code"] != CodeUpstreamBadHeader {
					t.Errorf("access log: status %v, upstream_status %v, error_code %v; want 502, 200, %s",
						e["status"], e["upstream_status"], e["error_code"], CodeUpstreamBadHeader)
				}
			})
		}
	}
}
