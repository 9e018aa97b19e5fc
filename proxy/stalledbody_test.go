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

// The README's error table tells a stalled body's two codes apart by where
// it stalls: fasthttp reads the first 8 KiB of a Content-Length body (all
// of a smaller one) before the proxy sees the request, so a stall there is
// its 408 request_timeout, within client.body_timeout of the head (not
// client.read_timeout), and a body declared over max_request_body gets that
// 408 too, its 413 only once that much has come (or at once when it asked
// with Expect: 100-continue). A stall after it is the proxy's own
// request_body_timeout.
func TestStalledBodyCodes(t *testing.T) {
	t.Parallel()
	const maxBody = 2 << 20
	h := newHarness(t, func(o *harnessOpts) {
		o.srv.ClientReadTimeout = 30 * time.Second // far beyond the answers' 3 s deadline below
		o.srv.ClientBodyTimeout = 300 * time.Millisecond
		o.cfg.MaxRequestBodySize = maxBody
	})
	port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, err := io.Copy(io.Discard, r.Body)
		fmt.Fprintf(w, "read %d bytes, %v", n, err)
	}))
	host := h.route("stalledbody", port)
	for _, tc := range []struct {
		name   string
		length int // declared
		sent   int // bytes of it sent before the stall
		expect bool
		status int
		code   string
	}{
		{"small body, part of it", 100, 3, false, 408, "request_timeout"},
		{"large body, part of its first 8 KiB", 1 << 20, 3, false, 408, "request_timeout"},
		{"body over max_request_body, part of its first 8 KiB", maxBody + 1, 3, false, 408, "request_timeout"},
		{"body over max_request_body, its first 8 KiB", maxBody + 1, 9 << 10, false, 413, CodeBodyTooLarge},
		{"body over max_request_body, Expect: 100-continue", maxBody + 1, 0, true, 413, CodeBodyTooLarge},
		{"large body, past its first 8 KiB", 1 << 20, 100 << 10, false, 408, CodeBodyTimeout},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := dialRaw(t, h.addr)
			start := time.Now()
			_ = c.SetDeadline(start.Add(3 * time.Second))
			expect := ""
			if tc.expect {
				expect = "Expect: 100-continue\r\n"
			}
			fmt.Fprintf(c, "POST /up HTTP/1.1\r\nHost: %s\r\nContent-Length: %d\r\n%s\r\n%s",
				host, tc.length, expect, strings.Repeat("x", tc.sent))
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Fatalf("no answer within 3 s (client.body_timeout is 300 ms): %v", err)
			}
			b, _ := io.ReadAll(resp.Body)
			checkProxyError(t, resp, string(b), tc.status, tc.code)
			if !resp.Close {
				t.Error("the connection stays open after a body it did not read")
			}
		})
	}
}

// A chunked body whose client stalls is the 408 request_body_timeout
// wherever in the body it stops, framing included, as nginx answers a
// client_body_timeout: fasthttp hands a timeout in the CRLF after a chunk's
// data, in a size line after its digits, or at the trailer's start over as
// a broken chunk or its own timeout error, which the proxy took for a
// malformed body (400 bad_request_body). Each case holds the sandbox's
// connection until the proxy cuts it, so the answer comes only after
// client.body_timeout, and the connection closes after it.
func TestStalledChunkedBodyCodes(t *testing.T) {
	t.Parallel()
	h := newHarness(t, func(o *harnessOpts) {
		o.srv.ClientReadTimeout = 30 * time.Second
		o.srv.ClientBodyTimeout = 300 * time.Millisecond
	})
	port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, err := io.Copy(io.Discard, r.Body)
		fmt.Fprintf(w, "read %d bytes, %v", n, err)
	}))
	host := h.route("stalledchunks", port)
	big := strings.Repeat("x", 64<<10)
	for _, tc := range []struct {
		name string
		sent string // the body sent before the stall
	}{
		{"in a chunk's data", "a\r\nhello"},
		{"in a size line's digits", "5\r\nhello\r\n1"},
		{"before a chunk's CRLF", "5\r\nhello"},
		{"between a chunk's CR and LF", "5\r\nhello\r"},
		{"before a 64 KiB chunk's CRLF", "10000\r\n" + big},
		{"in a size line's extension", "5\r\nhello\r\n5;name=v"},
		{"after a size line's digits and blank", "5\r\nhello\r\n5 "},
		{"between a size line's CR and LF", "5\r\nhello\r\n5\r"},
		{"between two chunks", "5\r\nhello\r\n"},
		{"at the trailer's start", "5\r\nhello\r\n0\r\n"},
		{"in a trailer field", "5\r\nhello\r\n0\r\nX-Sum: 1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := dialRaw(t, h.addr)
			start := time.Now()
			_ = c.SetDeadline(start.Add(5 * time.Second))
			fmt.Fprintf(c, "POST /up HTTP/1.1\r\nHost: %s\r\nTransfer-Encoding: chunked\r\n\r\n%s", host, tc.sent)
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Fatalf("no answer within 5 s (client.body_timeout is 300 ms): %v", err)
			}
			b, _ := io.ReadAll(resp.Body)
			if took := time.Since(start); took < 300*time.Millisecond {
				t.Errorf("answered after %v, before client.body_timeout", took)
			}
			checkProxyError(t, resp, string(b), 408, CodeBodyTimeout)
			if !resp.Close {
				t.Error("the connection stays open after a body it did not read")
			}
		})
	}
}
