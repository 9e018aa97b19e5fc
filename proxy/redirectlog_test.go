package proxy

import "testing"

// The redirect listener sends a request to the host its Host line names,
// also when an absolute-form target names another (fasthttp writes the
// target's host over Host), and its access log line must say the same host,
// as the HTTPS listener's does: it showed the target's host, which the
// client was not sent to.
func TestRedirectListenerLogsTheHostItRedirectsTo(t *testing.T) {
	h, logs := logHarness(t, "json")
	rln := listen(t, "127.0.0.1:0")
	go h.server.ServeRedirect(rln, "8443")
	resp, _ := rawRequest(t, rln.Addr().String(),
		"GET http://other.example/x?q HTTP/1.1\r\nHost: 3000-box.cube.test\r\nX-Cube-Request-Id: redir-host\r\n\r\n")
	if want := "https://3000-box.cube.test:8443/x?q"; resp.StatusCode != 308 || resp.Header.Get("Location") != want {
		t.Fatalf("%d Location %q, want 308 %q", resp.StatusCode, resp.Header.Get("Location"), want)
	}
	entry := logs.waitJSON(t, "redir-host")
	if entry["host"] != "3000-box.cube.test" || entry["request_uri"] != "/x?q" {
		t.Errorf("logged host %q request_uri %q, want the Host line's 3000-box.cube.test and /x?q", entry["host"], entry["request_uri"])
	}
}

// A signed link opened over plain HTTP keeps its token in the 308's
// Location (HTTPS needs the credential), so the 308 is not to be cached,
// as the 302 that trades the token for a cookie is not; any other
// redirect may be.
func TestRedirectOfSignedLinkIsNotCached(t *testing.T) {
	h, _ := logHarness(t, "json")
	rln := listen(t, "127.0.0.1:0")
	go h.server.ServeRedirect(rln, "8443")
	for _, tc := range []struct {
		target, cache string
	}{
		{"/p?a=1&cube_token=tok", "no-store"},
		{"/p?a=1", ""},
		{"/p#cube_token=tok", ""}, // a fragment never reaches HTTPS either
	} {
		resp, _ := rawRequest(t, rln.Addr().String(), "GET "+tc.target+" HTTP/1.1\r\nHost: 3000-box.cube.test\r\n\r\n")
		if resp.StatusCode != 308 || resp.Header.Get("Cache-Control") != tc.cache {
			t.Errorf("%s: %d Cache-Control %q, want 308 %q", tc.target, resp.StatusCode, resp.Header.Get("Cache-Control"), tc.cache)
		}
	}
}
