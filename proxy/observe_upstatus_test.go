package proxy

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/accesslog"
)

// An upstream exchange that failed without an answer is logged with the
// status the proxy gave for it in upstream_status too (502, 504), as
// nginx logs $upstream_status for a refused connect, a reset before the
// head, an invalid head or a header timeout (measured with nginx 1.22).
// It was "-", which the platform's cube log reads as "no sandbox was
// asked", though upstream_addr names the one that failed: a pipeline
// counting upstream failures by upstream_status saw none.
func TestAccessLogUpstreamStatusOfFailedExchange(t *testing.T) {
	h, logs := logHarness(t, accesslog.FormatCube, func(o *harnessOpts) {
		o.cfg.ResponseHeaderTimeout = 300 * time.Millisecond
	})
	script := func(answer func(c net.Conn)) uint16 {
		return newScriptBackend(t, func(c net.Conn, _ *http.Request, _ int) bool {
			answer(c)
			return false
		}).port
	}
	for i, tc := range []struct {
		name   string
		port   uint16
		status string
	}{
		{"refused", freePort(t), "502"},
		{"reset before the head", script(func(c net.Conn) { reset(c.(*net.TCPConn)) }), "502"},
		{"invalid head", script(func(c net.Conn) { rawWrite(c, "garbage\r\n\r\n") }), "502"},
		// Silent until the proxy gives up and closes the connection.
		{"no head in time", script(func(c net.Conn) { _, _ = io.Copy(io.Discard, c) }), "504"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id := fmt.Sprintf("sbxupstatus%d", i)
			reqID := "upstream-status-" + id
			req := h.req("GET", h.route(id, tc.port), "/", nil)
			req.Header.Set(HeaderRequestID, reqID)
			resp := h.do(req)
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			f := logs.wait(t, reqID)
			if f[11] != tc.status || f[16] != tc.status || f[15] != fmt.Sprintf("127.0.0.1:%d", tc.port) {
				t.Errorf("status %s, upstream_status %s, upstream_addr %s; want %s, %s, 127.0.0.1:%d",
					f[11], f[16], f[15], tc.status, tc.status, tc.port)
			}
		})
	}
}
