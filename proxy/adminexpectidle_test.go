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

// An "Expect: 100-continue" admin request on a keep-alive connection that
// idled longer than the admin listener's write timeout (30 s; its idle
// timeout is 90 s) since its last answer gets its 100 and its answer, as
// on the traffic listener (TestExpectContinueAfterIdleLongerThanWriteTimeout).
// fasthttp writes the 100 under the write deadline that last answer left:
// passed, the write failed and the connection closed without a word. A
// control plane whose pooled connection sat a minute between calls (Go's
// pool keeps one 90 s) lost its POST /admin/state or meta/delete with an
// EOF, which its client does not retry for a POST. The test server's write
// timeout is 250 ms, room for a loaded machine to write the first answer;
// the wait is that timeout's: nothing here proves streaming.
func TestAdminExpectContinueAfterIdleLongerThanWriteTimeout(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	srv := adminServer(h.server.cfg, h.adm, fasthttpLogger{h.proxy.cfg.Logger})
	srv.WriteTimeout = 250 * time.Millisecond
	ln := listen(t, "127.0.0.1:0")
	go srv.Serve(ln)
	t.Cleanup(func() { _ = srv.Shutdown() })
	paused := `{"sandbox_id":"box","state":"paused"}`
	for _, tc := range []struct {
		name, first string // the request answered before the pause
	}{
		{"after a health check", "GET /admin/healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"},
		{"after a change", fmt.Sprintf("POST /admin/state HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: %d\r\n\r\n%s",
			len(paused), paused)},
		{"after a refusal", "GET /admin/nosuch HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := dialRaw(t, ln.Addr().String())
			br := bufio.NewReader(c)
			keptRequest(t, c, br, tc.first)
			time.Sleep(3 * srv.WriteTimeout) // past the write deadline the answer left
			body := `{"sandbox_id":"box","state":"running"}`
			fmt.Fprintf(c, "POST /admin/state HTTP/1.1\r\nHost: 127.0.0.1\r\nExpect: 100-continue\r\nContent-Length: %d\r\n\r\n", len(body))
			line, err := br.ReadString('\n')
			if err != nil || line != "HTTP/1.1 100 Continue\r\n" {
				t.Fatalf("the head got %q (%v), want the 100", line, err)
			}
			if line, err := br.ReadString('\n'); err != nil || line != "\r\n" {
				t.Fatalf("100 ended with %q (%v)", line, err)
			}
			io.WriteString(c, body)
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 || !strings.Contains(string(b), `"state":"running"`) {
				t.Fatalf("answer %d %s", resp.StatusCode, b)
			}
		})
	}
}
