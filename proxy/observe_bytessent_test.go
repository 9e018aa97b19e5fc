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

	"github.com/cube-sandbox/cubeproxy/accesslog"
)

// A download cut because its client stopped reading logs, as
// body_bytes_sent, the bytes the proxy wrote to the client's connection,
// all of which the client gets once it reads again: not the last piece
// read from the sandbox as well, whose write the cut broke off (up to
// 64 KiB more, counted before it was written).
func TestCutDownloadLogsBytesWritten(t *testing.T) {
	h, logs := logHarness(t, accesslog.FormatJSON, func(o *harnessOpts) {
		o.srv.ClientWriteTimeout = 500 * time.Millisecond
	})
	body := strings.Repeat("x", 8<<20)
	host := h.route("sbxbytessent", backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Length", fmt.Sprint(len(body))) // too large for net/http to set it
		io.WriteString(w, body)
	})))
	c := dialSmallWindow(t, h.addr)
	fmt.Fprintf(c, "GET /f HTTP/1.1\r\nHost: %s\r\nX-Cube-Request-Id: bytes-sent\r\n\r\n", host)
	// Not reading until the proxy has cut the download (its line is logged).
	e := logs.waitJSON(t, "bytes-sent")
	if e["error_code"] != CodeClientWriteTimeout {
		t.Fatalf("error_code %v, want %s", e["error_code"], CodeClientWriteTimeout)
	}
	got := bodyToCut(t, c)
	if sent := e["body_bytes_sent"].(float64); int64(sent) != got {
		t.Errorf("body_bytes_sent %v, but the client got %d body bytes", sent, got)
	}
}

// bodyToCut reads the answer on c to the proxy's cut (an unexpected EOF)
// and returns how many body bytes the client got.
func bodyToCut(t *testing.T, c net.Conn) int64 {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.Copy(io.Discard, resp.Body)
	return got
}
