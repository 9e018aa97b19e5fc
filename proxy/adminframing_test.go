package proxy

import (
	"strings"
	"testing"
)

// The admin listener takes the traffic listener's framing and version
// rules: a Transfer-Encoding other than chunked beside a Content-Length
// ("identity", which fasthttp frames by the length) is a 400 bad_request
// and closes the connection, since a front proxy that reads the coding
// otherwise disagrees on where the request ends, and a version other than
// HTTP/1.0 or HTTP/1.1 is a 505. Both were served: the cache delete below
// ran, and "HTTP/1.2" got healthz's 200.
func TestAdminRefusesTrafficFramingErrors(t *testing.T) {
	h := newHarness(t)
	h.route("adminframing", 1)
	for _, tc := range []struct {
		name, raw string
		status    int
		code      string
	}{
		{"Transfer-Encoding identity", "POST /admin/backend_cache/delete HTTP/1.1\r\nHost: 127.0.0.1\r\n" +
			"Transfer-Encoding: identity\r\nContent-Length: 29\r\n\r\n{\"sandbox_id\":\"adminframing\"}", 400, CodeBadRequest},
		{"Transfer-Encoding identity, no length", "POST /admin/backend_cache/delete HTTP/1.1\r\nHost: 127.0.0.1\r\n" +
			"Transfer-Encoding: identity\r\n\r\n", 400, CodeBadRequest},
		{"HTTP/1.2", "GET /admin/healthz HTTP/1.2\r\nHost: 127.0.0.1\r\n\r\n", 505, CodeBadVersion},
		{"HTTP/2.0", "GET /admin/healthz HTTP/2.0\r\nHost: 127.0.0.1\r\n\r\n", 505, CodeBadVersion},
	} {
		resp, body := rawRequest(t, h.admin, tc.raw)
		if resp.StatusCode != tc.status || !strings.Contains(body, `"code":"`+tc.code+`"`) {
			t.Errorf("%s: %d %s, want %d %s", tc.name, resp.StatusCode, body, tc.status, tc.code)
		}
		if !resp.Close {
			t.Errorf("%s: connection kept open", tc.name)
		}
	}
	// Chunked and HTTP/1.0 still work.
	for _, raw := range []string{
		"POST /admin/backend_cache/delete HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n" +
			"1d\r\n{\"sandbox_id\":\"adminframing\"}\r\n0\r\n\r\n",
		"GET /admin/healthz HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n",
	} {
		if resp, body := rawRequest(t, h.admin, raw); resp.StatusCode != 200 {
			t.Errorf("%q: %d %s, want 200", raw[:40], resp.StatusCode, body)
		}
	}
}

// Without an admin token a caller counts as local only without Origin, on
// any line of it: the check read the first line alone, so an empty Origin
// line ahead of a page's one let the request through.
func TestAdminLocalClientReadsEveryOriginLine(t *testing.T) {
	h := newHarness(t)
	for _, tc := range []struct {
		name, lines string
		status      int
	}{
		{"no Origin", "", 200},
		{"an empty Origin", "Origin:\r\n", 200},
		{"a page's Origin", "Origin: https://evil.example\r\n", 403},
		{"an empty Origin, then a page's", "Origin:\r\nOrigin: https://evil.example\r\n", 403},
	} {
		resp, body := rawRequest(t, h.admin, "GET /admin/routes HTTP/1.1\r\nHost: 127.0.0.1\r\n"+tc.lines+"Connection: close\r\n\r\n")
		if resp.StatusCode != tc.status {
			t.Errorf("%s: %d %s, want %d", tc.name, resp.StatusCode, body, tc.status)
		}
	}
}
