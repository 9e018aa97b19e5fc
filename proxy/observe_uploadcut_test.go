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
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// An upload the client leaves halfway (it resets its connection, or
// closes it before the body's end) is the client closing its request
// before the answer: logged 499 client_closed_request, as a client that
// leaves while the sandbox works on the answer, and the upstream span is no
// error. Before, it was logged 400 bad_request_body, the code of a client
// that sends a malformed body, which one still gets. (nginx 1.22 logs 400
// for both, with nothing sent: its body reader's status, see README.) Its
// body_bytes_sent is 0, as every 499's.
func TestUploadLeftMidBodyIsLoggedAs499(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tel := obsTelemetry(t, exp)
	h, logs := logHarness(t, "json", func(o *harnessOpts) { o.cfg.Telemetry = tel })
	started := make(chan struct{}, 1)
	port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = r.Body.Read(make([]byte, 1))
		started <- struct{}{} // the upload is under way: the client may leave
		_, _ = io.Copy(io.Discard, r.Body)
	}))

	const sent = 100 << 10
	data := strings.Repeat("x", sent)
	const (
		reset     = "reset"      // SO_LINGER 0: a crashed client
		closed    = "close"      // a FIN, nothing more read: a killed client
		halfClose = "half-close" // a FIN, the answer still read
		stay      = "stay"       // the client waits for its answer
	)
	for i, tc := range []struct {
		name, framing, body, end string
		status                   int
		code                     string
	}{
		{"length, reset", "Content-Length: 1000000", data, reset, 499, CodeClientClosed},
		{"length, close", "Content-Length: 1000000", data, closed, 499, CodeClientClosed},
		{"length, half-close", "Content-Length: 1000000", data, halfClose, 499, CodeClientClosed},
		{"chunked, reset", "Transfer-Encoding: chunked", fmt.Sprintf("%x\r\n%s\r\n", sent, data), reset, 499, CodeClientClosed},
		{"chunked, close between chunks", "Transfer-Encoding: chunked", fmt.Sprintf("%x\r\n%s\r\n", sent, data), closed, 499, CodeClientClosed},
		{"chunked, close inside a chunk", "Transfer-Encoding: chunked", fmt.Sprintf("%x\r\n%s", 2*sent, data), closed, 499, CodeClientClosed},
		// The close cuts the chunk's framing: fasthttp's ErrBrokenChunk.
		{"chunked, close before a chunk's CRLF", "Transfer-Encoding: chunked", fmt.Sprintf("%x\r\n%s", sent, data), closed, 499, CodeClientClosed},
		{"chunked, bad chunk size", "Transfer-Encoding: chunked", "5\r\nhello\r\nzz\r\nhello\r\n", stay, 400, CodeBadBody},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id := fmt.Sprintf("sbxuploadcut%d", i)
			host := h.route(id, port)
			reqID := "upload-cut-" + id
			c := dialRaw(t, h.addr)
			fmt.Fprintf(c, "POST /up HTTP/1.1\r\nHost: %s\r\nX-Cube-Request-Id: %s\r\n%s\r\n\r\n%s", host, reqID, tc.framing, tc.body)
			testenv.Recv(t, started, 10*time.Second, "the upload at the sandbox")
			switch tc.end {
			case reset:
				_ = c.(*net.TCPConn).SetLinger(0)
				c.Close()
			case closed:
				c.Close()
			case halfClose, stay:
				if tc.end == halfClose {
					_ = c.(*net.TCPConn).CloseWrite()
				}
				resp, err := http.ReadResponse(bufio.NewReader(c), nil)
				if err != nil {
					t.Fatal(err)
				}
				b, _ := io.ReadAll(resp.Body)
				checkProxyError(t, resp, string(b), tc.status, tc.code)
			}

			e := logs.waitJSON(t, reqID)
			if e["status"] != float64(tc.status) || e["error_code"] != tc.code {
				t.Errorf("access log: status %v, error_code %q; want %d %q", e["status"], e["error_code"], tc.status, tc.code)
			}
			// A 499 records that no answer reached the client (the
			// proxy cannot tell the half-close that still reads one):
			// 0 bytes, as nginx logs its 499; the 400 went out.
			if sent, _ := e["body_bytes_sent"].(float64); (tc.status == 499) != (sent == 0) {
				t.Errorf("body_bytes_sent %v for a %d", e["body_bytes_sent"], tc.status)
			}
			// A reset may drop what the proxy had not read yet.
			if in, _ := e["bytes_in"].(float64); in <= 0 || in > sent || tc.end != reset && tc.end != stay && in != sent {
				t.Errorf("bytes_in %v, want the %d bytes sent (at most, after a reset)", e["bytes_in"], sent)
			}
			_, client := waitSandboxSpans(t, exp, id)
			if tc.code == CodeClientClosed && client.Status.Code == codes.Error {
				t.Errorf("upstream span is an error (%q): the client left, the sandbox failed nothing", client.Status.Description)
			}
		})
	}
}
