package proxy

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// An "Expect: 100-continue" request on a keep-alive connection that idled
// longer than client.write_timeout since its last answer gets its 100 and
// its answer. fasthttp writes the 100 before the handler runs, under the
// write deadline that last answer left: passed, the write failed at once
// and the client saw its connection close instead (curl's large uploads,
// Go clients with ExpectContinueTimeout, after a minute's pause). The
// wait is the timeout's: nothing here proves streaming.
func TestExpectContinueAfterIdleLongerThanWriteTimeout(t *testing.T) {
	t.Parallel()
	h := newHarness(t, func(o *harnessOpts) { o.srv.ClientWriteTimeout = 100 * time.Millisecond })
	port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		if r.URL.Path == "/stream" {
			w.(http.Flusher).Flush() // chunked: relayed as a stream
		}
		fmt.Fprintf(w, "got %q", b)
	}))
	host := h.route("expidle", port)
	for _, tc := range []struct {
		name, first string // the request answered before the pause ({host}: the sandbox's)
	}{
		{"after a whole answer", "GET / HTTP/1.1\r\nHost: {host}\r\n\r\n"},
		{"after a refusal", "GET / HTTP/1.1\r\nHost: 1-absent.cube.test\r\n\r\n"},
		{"after a streamed answer", "GET /stream HTTP/1.1\r\nHost: {host}\r\n\r\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := dialRaw(t, h.addr)
			br := bufio.NewReader(c)
			keptRequest(t, c, br, strings.ReplaceAll(tc.first, "{host}", host))
			time.Sleep(3 * 100 * time.Millisecond) // past client.write_timeout
			fmt.Fprintf(c, "POST / HTTP/1.1\r\nHost: %s\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\n", host)
			line, err := br.ReadString('\n')
			if err != nil || line != "HTTP/1.1 100 Continue\r\n" {
				t.Fatalf("the head got %q (%v), want the 100", line, err)
			}
			if line, err := br.ReadString('\n'); err != nil || line != "\r\n" {
				t.Fatalf("100 ended with %q (%v)", line, err)
			}
			io.WriteString(c, "hello")
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != 200 || string(b) != `got "hello"` {
				t.Fatalf("answer %d %q", resp.StatusCode, b)
			}
		})
	}
}
