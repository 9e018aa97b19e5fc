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

// A download of known length (over wholeBody, so streamed) that the
// sandbox ends short of its Content-Length is the sandbox's failure: the
// client sees the body cut, and the access log says upstream_reset, not a
// clean 200 nor a client that left.
func TestSizedDownloadCutBySandboxIsLogged(t *testing.T) {
	h, logs := logHarness(t, "json")
	first := wholeBody + 1
	got := make(chan struct{}) // the client has the first part
	ln := testenv.ServeTCP(t, func(c net.Conn) {
		defer c.Close()
		if _, err := http.ReadRequest(bufio.NewReader(c)); err != nil {
			return
		}
		fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s", 3*wholeBody, strings.Repeat("d", first))
		select {
		case <-got:
		case <-time.After(10 * time.Second):
		}
	})
	host := h.route("sizedcut", uint16(ln.Addr().(*net.TCPAddr).Port))
	c, err := net.Dial("tcp", h.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: %s\r\nX-Cube-Request-Id: sized-cut\r\n\r\n", host)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(resp.Body, make([]byte, first)); err != nil {
		t.Fatalf("first part: %v", err)
	}
	close(got)
	if n, err := io.Copy(io.Discard, resp.Body); err == nil {
		t.Errorf("the body ended cleanly %d bytes after the first part, short of its Content-Length", n)
	}
	e := logs.waitJSON(t, "sized-cut")
	if e["status"] != float64(200) || e["error_code"] != CodeUpstreamReset {
		t.Errorf("logged status %v, error_code %q; want 200 %q", e["status"], e["error_code"], CodeUpstreamReset)
	}
}
