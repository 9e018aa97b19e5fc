package proxy

import (
	"bufio"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/accesslog"
)

// An upload too large for the redirect listener's buffer is still sent
// its 308 on a keep-alive connection whose previous answer's write
// deadline has passed. fasthttp writes an ErrorHandler's answer under that
// deadline; the traffic and admin listeners renew it there (requestFailed,
// renewWriteDeadline), the redirect's early answer did not: a client that
// came back after client.write_timeout with a large POST saw the
// connection close with nothing.
func TestRedirectLaterLargeUploadAnswered(t *testing.T) {
	t.Parallel()
	const writeTimeout = 300 * time.Millisecond
	h, buf := logHarness(t, accesslog.FormatJSON, func(o *harnessOpts) {
		o.srv.ClientWriteTimeout = writeTimeout
	})
	rln := listen(t, "127.0.0.1:0")
	go h.server.ServeRedirect(rln, "8443")
	c := dialRaw(t, rln.Addr().String())
	br := bufio.NewReader(c)
	keptRequest(t, c, br, "GET / HTTP/1.1\r\nHost: 3000-box.cube.test\r\n\r\n")
	// Past the write deadline the first answer left (the idle timeout,
	// fasthttp's default here, is far longer).
	time.Sleep(3 * writeTimeout)
	body := strings.Repeat("u", 2*maxRedirectBody)
	if _, err := io.WriteString(c, "POST /up HTTP/1.1\r\nHost: 3000-box.cube.test\r\nContent-Length: "+
		strconv.Itoa(len(body))+"\r\n\r\n"+body); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("no answer to the large upload: %v (log: %s)", err, buf.String())
	}
	resp.Body.Close()
	if want := "https://3000-box.cube.test:8443/up"; resp.StatusCode != 308 || resp.Header.Get("Location") != want {
		t.Fatalf("%d Location %q, want 308 %q", resp.StatusCode, resp.Header.Get("Location"), want)
	}
}
