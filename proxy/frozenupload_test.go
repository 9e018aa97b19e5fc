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

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// An upload to a sandbox that takes none of it (a VM paused or
// snapshotted mid-upload, an app that reads no more) is cut once a write
// to it has waited upstream.idle_timeout, while the client still sends,
// and the client is told why: the 504 said "sandbox did not answer in
// time", the words of a slow answer, and sent an agent developer to the
// handler's response time, or to upstream.response_header_timeout, for a
// sandbox that had stopped reading the body. The sandbox port works again
// at once after.
func TestUploadToFrozenSandboxSaysSo(t *testing.T) {
	t.Parallel()
	const idle = 500 * time.Millisecond
	h := newHarness(t, func(o *harnessOpts) { o.cfg.IdleStreamTimeout = idle })
	frozen := make(chan struct{})
	thawed := make(chan struct{})
	ln := listen(t, "127.0.0.1:0")
	testenv.Serve(t, ln, func(c net.Conn) {
		br := bufio.NewReader(c)
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		if req.URL.Path == "/upload" {
			frozen <- struct{}{} // reads nothing more, answers nothing
			<-thawed
			return
		}
		io.Copy(io.Discard, req.Body)
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
	})
	host := h.route("frozenupload", uint16(ln.Addr().(*net.TCPAddr).Port))
	for _, tc := range []struct{ name, framing string }{
		{"sized", "Content-Length: 268435456\r\n"},
		{"chunked", "Transfer-Encoding: chunked\r\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := dialRaw(t, h.addr)
			fmt.Fprintf(c, "POST /upload HTTP/1.1\r\nHost: %s\r\n%s\r\n", host, tc.framing)
			go func() {
				// Far more than the socket buffers hold, until the cut.
				piece := []byte(strings.Repeat("x", 64<<10))
				if strings.Contains(tc.framing, "chunked") {
					piece = fmt.Appendf(nil, "%x\r\n%s\r\n", len(piece), piece)
				}
				for {
					if _, err := c.Write(piece); err != nil {
						return
					}
				}
			}()
			<-frozen
			start := time.Now()
			_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Fatalf("no answer while the sandbox took none of the upload: %v", err)
			}
			b, _ := io.ReadAll(resp.Body)
			checkProxyError(t, resp, string(b), 504, CodeUpstreamTimeout)
			if !resp.Close {
				t.Error("the 504 lacks Connection: close: the rest of the body is not read")
			}
			if !strings.Contains(string(b), "stopped reading the request") {
				t.Errorf("the 504 says %s: not that the sandbox stopped reading the request", b)
			}
			if d := time.Since(start); d > idle+2*time.Second {
				t.Errorf("answered %v after the sandbox stopped reading, want about upstream.idle_timeout (%v)", d, idle)
			}
			waitPoolConns(t, h, 0)
			if st, body, _ := h.get(host, "/after"); st != 200 || body != "ok" {
				t.Errorf("the sandbox port after the cut: %d %q, want 200 ok", st, body)
			}
		})
	}
	close(thawed)
}
