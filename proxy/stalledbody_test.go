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
