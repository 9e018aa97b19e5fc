package proxy

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
)

// chunkedWithTrailer is a chunked POST of "abc" to host whose trailer is
// trailer (lines, each ending in CRLF).
func chunkedWithTrailer(host, trailer string) string {
	return "POST /p HTTP/1.1\r\nHost: " + host + "\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n" + trailer + "\r\n"
}

// A chunked body's trailer lines whose names hold a space are dropped, as
// the head's are, each with a delete that walks the whole header: 3,000
// of them in a 30 KB trailer cost ≈ 10 ms of the proxy's CPU a request,
// where the head refuses more than maxInvalidNames. So does the trailer
// now: more are a 400 bad_request_body, as a trailer field the proxy
// sets is.
func TestTrailerNamesWithSpaceBounded(t *testing.T) {
	h := newHarness(t)
	var got atomic.Value
	port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		got.Store(fmt.Sprintf("%s %d %q", body, len(r.Trailer), r.Trailer.Get("X-Kept")))
		io.WriteString(w, "ok")
	}))
	host := h.route("trailerspace", port)
	names := func(n int) string {
		var b strings.Builder
		for i := range n {
			fmt.Fprintf(&b, "X Bad %d: v\r\n", i)
		}
		return b.String()
	}
	resp, body := rawRequest(t, h.addr, chunkedWithTrailer(host, names(maxInvalidNames)+"X-Kept: 1\r\n"))
	if resp.StatusCode != 200 || body != "ok" {
		t.Fatalf("%d names with a space: %d %s, want 200", maxInvalidNames, resp.StatusCode, body)
	}
	if s, _ := got.Load().(string); s != `abc 1 "1"` {
		t.Errorf("%d names with a space: the sandbox got %s, want the body and X-Kept alone in the trailer", maxInvalidNames, s)
	}
	for _, n := range []int{maxInvalidNames + 1, 2000} {
		resp, body := rawRequest(t, h.addr, chunkedWithTrailer(host, names(n)))
		checkProxyError(t, resp, body, 400, CodeBadBody)
	}
}
