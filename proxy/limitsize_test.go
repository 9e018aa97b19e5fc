package proxy

import (
	"bufio"
	"bytes"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// A request whose declared body is over max_request_body gets its 413 at
// max_streams_per_sandbox too, as below it: a 429 there told the client to
// retry a request that can never pass, and a sandbox whose slots an
// agent's own streams hold (a session's GET) answered it 429 on every
// retry, so the client never learned the body was too large. nginx, the
// platform's proxy, has no per-sandbox limit and always answers the 413.
func TestStreamLimitAnswersOversizedBody413(t *testing.T) {
	const maxBody = 64 << 10
	h := newHarness(t, func(o *harnessOpts) {
		o.cfg.MaxStreamsPerSandbox = 1
		o.cfg.MaxRequestBodySize = maxBody
	})
	entered, release := make(chan struct{}, 1), make(chan struct{})
	t.Cleanup(func() { close(release) })
	port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/hold" {
			entered <- struct{}{}
			<-release
		}
		_, _ = io.Copy(io.Discard, r.Body)
	}))
	h.put("sizebox", map[string]string{"HostIP": "127.0.0.1", "CreatedAt": "1", "8080": itoa(port)})
	const host = "8080-sizebox.cube.test"
	sb := h.proxy.sandboxes.get([]byte("sizebox"))

	// The one slot, held by a request the sandbox has not answered.
	go func() {
		if resp, err := h.client.Do(h.req("GET", host, "/hold", nil)); err == nil {
			resp.Body.Close()
		}
	}()
	testenv.Recv(t, entered, 10*time.Second, "the held request at the sandbox")

	notification := `{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":1,"reason":"` + strings.Repeat("x", maxBody) + `"}}`
	for _, tc := range []struct {
		name, head, body string
	}{
		{"an upload", "POST /up HTTP/1.1\r\nHost: " + host + "\r\nContent-Length: " + strconv.Itoa(maxBody+1) + "\r\n\r\n", strings.Repeat("a", maxBody+1)},
		{"a notification", "POST /mcp HTTP/1.1\r\nHost: " + host + "\r\nContent-Type: application/json\r\nContent-Length: " + strconv.Itoa(len(notification)) + "\r\n\r\n", notification},
		// Answered on its head, as below the limit: the body is never sent.
		{"an Expect: 100-continue head", "POST /up HTTP/1.1\r\nHost: " + host + "\r\nExpect: 100-continue\r\nContent-Length: " + strconv.Itoa(maxBody+1) + "\r\n\r\n", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := net.Dial("tcp", h.addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(10 * time.Second))
			// The body goes from another goroutine: the answer may come
			// before the client has sent it all.
			go func() { _, _ = io.Copy(c, strings.NewReader(tc.head+tc.body)) }()
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusRequestEntityTooLarge || !bytes.Contains(b, []byte(CodeBodyTooLarge)) {
				t.Fatalf("declared body over max_request_body at max_streams_per_sandbox: %d %s, want 413 %s", resp.StatusCode, b, CodeBodyTooLarge)
			}
			testenv.WaitFor(t, 5*time.Second, "the slot count back to the held request", func() bool { return sb.inFlight() == 1 })
		})
	}
}
