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
