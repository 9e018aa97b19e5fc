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

// A client that sends a large body before it reads the answer (Python's
// requests and httpx, curl without Expect) reads the proxy's refusal of it
// whatever the body's size, as through nginx, whose lingering close is
// bounded by time (lingering_time 30 s) and not by bytes: with the discard
// cut at 16 MiB, a 24 MiB upload to a sandbox whose port was down got a
// broken pipe in httpx and requests instead of the 502 (nginx: the 502).
func TestRefusalOfALargeBodyIsRead(t *testing.T) {
	h := newHarness(t)
	down := h.route("downbig", freePort(t))
	const size = 40 << 20 // far over the 16 MiB the discard used to stop at
	for _, tc := range []struct {
		name, host, code string
		status           int
		chunked          bool
	}{
		{"unknown sandbox", "8080-nobigsandbox.cube.test", CodeNotFound, 404, false},
		{"unknown sandbox, chunked", "8080-nobigsandbox.cube.test", CodeNotFound, 404, true},
		{"port down", down, CodeUpstreamConnect, 502, false},
		{"port down, chunked", down, CodeUpstreamConnect, 502, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := dialRaw(t, h.addr)
			_ = c.SetDeadline(time.Now().Add(60 * time.Second))
			bw := bufio.NewWriterSize(c, 64<<10)
			if tc.chunked {
				fmt.Fprintf(bw, "POST /upload HTTP/1.1\r\nHost: %s\r\nTransfer-Encoding: chunked\r\n\r\n", tc.host)
			} else {
				fmt.Fprintf(bw, "POST /upload HTTP/1.1\r\nHost: %s\r\nContent-Length: %d\r\n\r\n", tc.host, size)
			}
			piece := make([]byte, 64<<10)
			for sent := 0; sent < size; sent += len(piece) {
				if tc.chunked {
					fmt.Fprintf(bw, "%x\r\n", len(piece))
				}
				if _, err := bw.Write(piece); err != nil {
					t.Fatalf("sending the body, %d of %d bytes sent: %v", sent, size, err)
				}
				if tc.chunked {
					bw.WriteString("\r\n")
				}
			}
			if tc.chunked {
				bw.WriteString("0\r\n\r\n")
			}
			if err := bw.Flush(); err != nil {
				t.Fatalf("sending the body's end: %v", err)
			}
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Fatalf("no answer after the body: %v", err)
			}
			b, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != tc.status || !strings.Contains(string(b), tc.code) {
				t.Fatalf("got %d %s, want %d %s", resp.StatusCode, b, tc.status, tc.code)
			}
		})
	}
}
