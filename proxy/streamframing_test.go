package proxy

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
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

// An HTTP/1.0 answer that says "Transfer-Encoding: chunked" (Python's
// http.server speaks HTTP/1.0 unless told otherwise, and a handler that
// chunks its own output sends exactly that) is framed by that coding, as
// nginx frames it, and as curl, Python and Node read it from the sandbox
// directly: fasthttp ignores the field on an HTTP/1.0 message, so the
// chunk sizes and the last chunk reached the client as body bytes. RFC
// 9112 6.1 asks that the connection end after such a message, so the
// proxy closes the sandbox's, whatever its Connection said. The same
// rules as for HTTP/1.1 hold (a Content-Length beside it is a 502);
// another coding is left as before: the body ends with its Content-Length
// or the connection, relayed as sent (nginx 1.22 does the same), and the
// connection is closed after it, keep-alive claimed or not.
func TestHTTP10AnswerChunkedIsDecoded(t *testing.T) {
	h := newHarness(t)
	const chunks = "5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"
	cases := []struct {
		name, head, body string
		keepOpen         bool // the sandbox leaves its connection open: only the proxy may close it
		status           int
		want             string
	}{
		{"chunked", "Transfer-Encoding: chunked\r\n", chunks, true, 200, "hello world"},
		{"chunked, keep-alive claimed", "Connection: keep-alive\r\nTransfer-Encoding: Chunked\r\n", chunks, true, 200, "hello world"},
		{"bare LF head", "Transfer-Encoding: chunked\n", chunks, true, 200, "hello world"},
		{"with Content-Length", "Content-Length: 3\r\nTransfer-Encoding: chunked\r\n", chunks, true, 502, ""},
		{"another coding", "Transfer-Encoding: gzip\r\n", "as sent", false, 200, "as sent"},
		// Framed by its Content-Length (as nginx frames it), but the
		// framing is suspect whatever the sandbox claims (RFC 9112 6.1):
		// its connection is not kept for the next request, on which the
		// rest of a body it framed otherwise would be read as the answer.
		{"another coding, sized, keep-alive claimed", "Connection: keep-alive\r\nTransfer-Encoding: gzip\r\nContent-Length: 7\r\n", "as sent", true, 200, "as sent"},
		// A folded value is unread (fasthttp rewrites the head's bytes in
		// place as it joins the fold): another coding, so closed too.
		{"folded, sized, keep-alive claimed", "Connection: keep-alive\r\nTransfer-Encoding:\r\n chunked\r\nContent-Length: 3\r\n", chunks, true, 200, "5\r\n"},
		// fasthttp takes a space before the colon as the same field.
		{"space before the colon", "Transfer-Encoding : chunked\r\n", chunks, true, 200, "hello world"},
		// A longer name that starts with the field's is another field.
		{"a field named after it", "Transfer-Encoding: chunked\r\nTransfer-Encoding-Note: x\r\n", chunks, true, 200, "hello world"},
		// Refused as fasthttp refuses two such lines on HTTP/1.1.
		{"two lines", "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n", chunks, true, 502, ""},
	}
	for i, tc := range cases {
		for _, proto := range []string{"HTTP/1.1", "HTTP/1.0"} {
			t.Run(tc.name+"/"+proto+" client", func(t *testing.T) {
				b := newScriptBackend(t, func(c net.Conn, _ *http.Request, _ int) bool {
					eol := "\r\n"
					if strings.HasPrefix(tc.name, "bare LF") {
						eol = "\n"
					}
					rawWrite(c, "HTTP/1.0 200 OK"+eol+"Content-Type: text/plain"+eol+tc.head+eol+tc.body)
					return tc.keepOpen
				})
				host := h.route(fmt.Sprintf("h10chunked%d%s", i, proto[7:]), b.port)
				c := dialRaw(t, h.addr)
				fmt.Fprintf(c, "GET / %s\r\nHost: %s\r\n\r\n", proto, host)
				resp, err := http.ReadResponse(bufio.NewReader(c), nil)
				if err != nil {
					t.Fatalf("client got no answer it could read: %v", err)
				}
				body, err := io.ReadAll(resp.Body)
				if tc.status == 502 {
					checkProxyError(t, resp, string(body), 502, CodeUpstreamBadHeader)
				} else if resp.StatusCode != tc.status || string(body) != tc.want || err != nil {
					t.Errorf("got %d %q %v, want %d %q", resp.StatusCode, body, err, tc.status, tc.want)
				}
				if tc.keepOpen {
					if err := b.waitEnded(t); err != io.EOF {
						t.Errorf("sandbox connection ended with %v, want closed by the proxy (EOF)", err)
					}
				}
				waitPoolConns(t, h, 0)
			})
		}
	}
}

// An HTTP/1.0 204 or 304 that says "Transfer-Encoding" frames no body, but
// its framing is as suspect as a 200's (RFC 9112 6.1): the sandbox's
// connection is closed after it, keep-alive claimed or not, rather than
// kept for a next request on which a last chunk the sandbox sent late would
// be read as the answer.
func TestHTTP10BodilessAnswerWithTransferEncodingCloses(t *testing.T) {
	h := newHarness(t)
	for _, status := range []string{"204 No Content", "304 Not Modified"} {
		t.Run(status, func(t *testing.T) {
			b := newScriptBackend(t, func(c net.Conn, _ *http.Request, _ int) bool {
				rawWrite(c, "HTTP/1.0 "+status+"\r\nConnection: keep-alive\r\nTransfer-Encoding: chunked\r\n\r\n")
				return true
			})
			host := h.route("h10bodiless"+status[:3], b.port)
			pc := h.dialProxy(t)
			if resp, body := pc.do("GET", host, "/", ""); resp.Status != status || body != "" {
				t.Fatalf("got %s %q, want %s and no body", resp.Status, body, status)
			}
			if err := b.waitEnded(t); err != io.EOF {
				t.Errorf("sandbox connection ended with %v, want closed by the proxy (EOF)", err)
			}
			// The client's connection is its own: kept for the next one.
			if resp, _ := pc.do("GET", host, "/next", ""); resp.Status != status {
				t.Fatalf("next request on the client's connection: %s", resp.Status)
			}
			b.wantAccepted(t, 2, "(a new sandbox connection for the next request)")
		})
	}
}

// An HTTP/1.0 event stream with chunked coding streams like any other:
// each event reaches the client, decoded, while the sandbox still holds
// the stream open (it sends the next only once the client has the first).
func TestHTTP10ChunkedEventStreamStreams(t *testing.T) {
	h := newHarness(t)
	for _, proto := range []string{"HTTP/1.1", "HTTP/1.0"} {
		t.Run(proto+" client", func(t *testing.T) {
			ack := make(chan struct{})
			b := newScriptBackend(t, func(c net.Conn, _ *http.Request, _ int) bool {
				rawWrite(c, "HTTP/1.0 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"+
					"9\r\ndata: 1\n\n\r\n")
				select {
				case <-ack:
				case <-time.After(10 * time.Second):
					return false
				}
				rawWrite(c, "9\r\ndata: 2\n\n\r\n0\r\n\r\n")
				return true
			})
			host := h.route("h10events"+proto[7:], b.port)
			c := dialRaw(t, h.addr)
			fmt.Fprintf(c, "GET / %s\r\nHost: %s\r\nAccept: text/event-stream\r\n\r\n", proto, host)
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Fatal(err)
			}
			first := make([]byte, len("data: 1\n\n"))
			if _, err := io.ReadFull(resp.Body, first); err != nil || string(first) != "data: 1\n\n" {
				t.Fatalf("first event %q %v, want it while the sandbox holds the stream", first, err)
			}
			close(ack)
			if rest, err := io.ReadAll(resp.Body); err != nil || string(rest) != "data: 2\n\n" {
				t.Fatalf("rest %q %v, want %q", rest, err, "data: 2\n\n")
			}
			if err := b.waitEnded(t); err != io.EOF {
				t.Errorf("sandbox connection ended with %v, want closed by the proxy (EOF)", err)
			}
		})
	}
}
