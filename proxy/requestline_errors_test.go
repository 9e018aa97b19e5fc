package proxy

import (
	"fmt"
	"strings"
	"testing"
)

// The README's Errors: a refusal decided on the request line and framing
// alone, before the target is read, reports no sandbox_id even when Host
// names a routed sandbox, and never reaches it.
func TestRequestLineRefusalsNameNoSandbox(t *testing.T) {
	h := newHarness(t)
	host, reached := h.countingEcho(t, "lineonly")
	options := make([]string, maxConnectionOptions+1)
	for i := range options {
		options[i] = fmt.Sprintf("o%d", i)
	}
	for _, tc := range []struct {
		name   string
		lines  []string
		status int
		code   string
	}{
		{"CONNECT", []string{"CONNECT " + host + ":443 HTTP/1.1", "Host: " + host}, 405, CodeBadMethod},
		{"HTTP/2.0 request line", []string{"GET / HTTP/2.0", "Host: " + host}, 505, CodeBadVersion},
		{"Transfer-Encoding other than chunked", []string{"POST / HTTP/1.1", "Host: " + host, "Transfer-Encoding: gzip"}, 400, CodeBadRequest},
		{"overlong Connection", []string{"GET / HTTP/1.1", "Host: " + host, "Connection: " + strings.Join(options, ", ")}, 400, CodeBadRequest},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := reached.Load()
			resp, body := authRawRequest(t, h.addr, tc.lines...)
			checkProxyError(t, resp, body, tc.status, tc.code)
			if strings.Contains(body, `"sandbox_id"`) {
				t.Errorf("names a sandbox: %s", body)
			}
			if reached.Load() != before {
				t.Error("the sandbox got the request")
			}
		})
	}
}
