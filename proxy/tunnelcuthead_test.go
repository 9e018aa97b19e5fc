package proxy

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// A WebSocket whose 101 the kill or the drain deadline cut before all of
// it reached the client (a client slow to read a 101 with large headers)
// is logged as what its client got: no switch, but the answer a request
// the kill or the drain cuts before its answer's head is logged with (410
// sandbox_killed, 504 drain_timeout), body_bytes_sent 0, and the
// sandbox's 101 in upstream_status. It was logged 101, as a tunnel that
// had opened, with the bytes that came with the 101 counted as sent.
func TestTunnelCutBeforeItsHeadWentOutIsNotA101(t *testing.T) {
	for _, tc := range []struct {
		name   string
		cut    func(t *testing.T, h *harness)
		status int
		code   string
	}{
		{"killed", func(t *testing.T, h *harness) {
			if st, b := h.adminDo("POST", "/admin/meta/delete", `{"sandbox_id":"wshead"}`, ""); st != http.StatusOK {
				t.Fatalf("meta/delete: %d %s", st, b)
			}
		}, http.StatusGone, CodeSandboxKilled},
		{"drain", func(t *testing.T, h *harness) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_ = h.server.Shutdown(ctx)
		}, http.StatusGatewayTimeout, CodeDrainTimeout},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, logs := logHarness(t, "json", func(o *harnessOpts) {
				o.srv.ClientWriteTimeout = time.Minute
				o.srv.DrainTimeout = 200 * time.Millisecond
				o.cfg.UpstreamReadBufferSize = 4 << 20
			})
			// A 101 with 1 MiB of headers: a client with a small window
			// that reads nothing cannot take it whole.
			pad := strings.Repeat("p", 1<<20)
			ln := testenv.ServeTCP(t, func(c net.Conn) {
				if _, err := http.ReadRequest(bufio.NewReader(c)); err != nil {
					c.Close()
					return
				}
				io.WriteString(c, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nX-Pad: "+pad+"\r\n\r\nframes")
				io.Copy(io.Discard, c)
				c.Close()
			})
			host := h.route("wshead", uint16(ln.Addr().(*net.TCPAddr).Port))
			c := dialSmallWindow(t, h.addr)
			id := "wshead-" + tc.name
			fmt.Fprintf(c, "GET /ws HTTP/1.1\r\nHost: %s\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"+
				"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nX-Cube-Request-Id: %s\r\n\r\n", host, id)
			// The tunnel registers before its 101 is written: the write is
			// then under way, and stalls on the client that reads nothing.
			testenv.WaitFor(t, 5*time.Second, "the tunnel registered", func() bool {
				_, n := h.proxy.streams.open()
				return n == 1
			})
			tc.cut(t, h)
			e := logs.waitJSON(t, id)
			if e["status"] != float64(tc.status) || e["error_code"] != tc.code || e["body_bytes_sent"] != float64(0) ||
				e["upstream_status"] != float64(101) {
				t.Errorf("a tunnel cut before its 101 went out: logged status %v error_code %v body_bytes_sent %v upstream_status %v; "+
					"want %d %s 0 101", e["status"], e["error_code"], e["body_bytes_sent"], e["upstream_status"], tc.status, tc.code)
			}
		})
	}
}
