package proxy

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
)

// A client that half-closes after writing (`nc -N`, a health check that
// shuts down its sending side) still reads, so the 499 the proxy writes
// when it takes that FIN for a departure reaches it. Its status line must
// name the status: fasthttp knows no phrase for 499 and wrote "499 Unknown
// Status Code", which tells the person at the terminal nothing. The JSON
// body carries the code, as every refusal's does.
func TestHalfClosedClientReadsNamed499(t *testing.T) {
	// The access log on, as by default: with it off, a small body's cut on
	// a connection's first request is not told from a parse error (README:
	// Decisions), and that client reads a 400.
	h, _ := logHarness(t, "json")
	// The sandbox answers only when the proxy gives up on the request (it
	// closes the sandbox's connection once the client is gone), so the
	// client's half-close is what ends the wait, after clientCheck.
	port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		<-r.Context().Done()
	}))
	host := h.route("halfclosed", port)
	for _, tc := range []struct{ name, raw string }{
		{"sandbox still working", "GET / HTTP/1.1\r\nHost: " + host + "\r\n\r\n"},
		{"HTTP/1.0, sandbox still working", "GET / HTTP/1.0\r\nHost: " + host + "\r\n\r\n"},
		{"head cut", "GET / HTTP/1.1\r\nHost: " + host + "\r\nX-A: b"},
		{"sized body cut", "POST / HTTP/1.1\r\nHost: " + host + "\r\nContent-Length: 10\r\n\r\nhello"},
		{"chunked body cut", "POST / HTTP/1.1\r\nHost: " + host + "\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := dialRaw(t, h.addr)
			if _, err := io.WriteString(c, tc.raw); err != nil {
				t.Fatal(err)
			}
			if err := c.(*net.TCPConn).CloseWrite(); err != nil {
				t.Fatal(err)
			}
			// The proxy closes after a 499: read to that end (dialRaw's
			// deadline bounds it).
			all, err := io.ReadAll(c)
			if err != nil {
				t.Fatalf("reading the answer: %v (got %q)", err, all)
			}
			line, _, _ := strings.Cut(string(all), "\r\n")
			if want := "HTTP/1.1 499 Client Closed Request"; line != want {
				t.Errorf("status line %q, want %q", line, want)
			}
			resp, err := http.ReadResponse(bufio.NewReader(bytes.NewReader(all)), nil)
			if err != nil {
				t.Fatalf("answer %q: %v", all, err)
			}
			body, _ := io.ReadAll(resp.Body)
			var got struct{ Code string }
			if err := json.Unmarshal(body, &got); err != nil || got.Code != CodeClientClosed {
				t.Errorf("body %q, want JSON with code %q (%v)", body, CodeClientClosed, err)
			}
		})
	}
}
