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

// An answer framed both by Content-Length and by chunked coding is
// ambiguous (RFC 9112 6.3: a possible response-splitting attempt, "ought
// to be handled as an error"): nginx refuses it (502, "upstream sent
// Content-Length and Transfer-Encoding headers at the same time"), and so
// does the proxy now. fasthttp framed it by the chunked coding, dropped
// the Content-Length, and kept the connection for the next request,
// which reads wherever the sandbox's own idea of the framing left it. A
// field whose name only contains Content-Length is no such answer.
func TestUpstreamContentLengthWithChunkedIs502(t *testing.T) {
	h := newHarness(t)
	cases := []struct {
		name, head string
		refused    bool
	}{
		{"Content-Length first", "Content-Length: 3\r\nTransfer-Encoding: chunked\r\n", true},
		{"Transfer-Encoding first", "Transfer-Encoding: chunked\r\ncontent-length: 5\r\n", true},
		{"bare LF head", "Transfer-Encoding: chunked\nContent-Length: 5\n", true},
		{"HEAD answer", "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n", true},
		{"X-Content-Length is another field", "X-Content-Length: 3\r\nTransfer-Encoding: chunked\r\n", false},
		{"Content-Length-Range is another field", "Content-Length-Range: 3\r\nTransfer-Encoding: chunked\r\n", false},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			method := "GET"
			if strings.HasPrefix(tc.name, "HEAD") {
				method = "HEAD"
			}
			b := newScriptBackend(t, func(c net.Conn, req *http.Request, _ int) bool {
				if req.URL.Path == "/next" {
					return rawWrite(c, okResponse("next"))
				}
				eol := "\r\n"
				if !strings.Contains(tc.head, "\r") {
					eol = "\n"
				}
				head := "HTTP/1.1 200 OK" + eol + tc.head + eol
				if method == "HEAD" {
					return rawWrite(c, head)
				}
				return rawWrite(c, head+"5\r\nabcde\r\n0\r\n\r\n")
			})
			host := h.route(fmt.Sprintf("clte%d", i), b.port)
			pc := h.dialProxy(t)
			resp, body := pc.do(method, host, "/", "")
			if tc.refused {
				if method == "HEAD" {
					if resp.StatusCode != 502 {
						t.Fatalf("got %d, want 502", resp.StatusCode)
					}
				} else {
					checkProxyError(t, resp, body, 502, CodeUpstreamBadHeader)
				}
				if err := b.waitEnded(t); err != io.EOF {
					t.Errorf("sandbox connection ended with %v, want closed by the proxy (EOF)", err)
				}
				return
			}
			if resp.StatusCode != 200 || body != "abcde" {
				t.Fatalf("got %d %q, want 200 %q", resp.StatusCode, body, "abcde")
			}
			if resp, body := pc.do("GET", host, "/next", ""); resp.StatusCode != 200 || body != "next" {
				t.Fatalf("next request: %d %q", resp.StatusCode, body)
			}
			b.wantAccepted(t, 1, "(the connection was kept)")
		})
	}
}
