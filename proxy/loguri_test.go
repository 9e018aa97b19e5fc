package proxy

import (
	"net/http"
	"testing"
)

// The cube format's uri is nginx's $uri, which the platform's pipelines
// read as the path a request was for: percent escapes decoded, slashes
// merged, "." and ".." resolved (nginx 1.22.1 logs "/a%2F%2Fb/./c/../d" as
// "/a/b/d"), and on a path route the sandbox's part of that; request_uri
// stays the target as sent. Earlier builds logged uri as sent too.
func TestCubeURIIsNginxURI(t *testing.T) {
	h, logs := logHarness(t, "cube")
	port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	host := h.route("uribox", port)
	prefix := "/sandbox/uribox/" + itoa(port)
	for _, tc := range []struct{ host, target, uri string }{
		{host, "/a%2F%2Fb/./c/../d?x=%20", "/a/b/d"},
		{host, "/caf%C3%A9//x%22", `/caf\xC3\xA9/x\x22`},
		{host, "/plain?q=1", "/plain"},
		{h.addr, prefix + "//p/%2E/q", "/p/q"},
	} {
		resp, _ := rawRequest(t, h.addr, "GET "+tc.target+" HTTP/1.1\r\nHost: "+tc.host+"\r\n\r\n")
		if resp.StatusCode != 200 {
			t.Errorf("%s: status %d", tc.target, resp.StatusCode)
			continue
		}
		f := logs.wait(t, resp.Header.Get(HeaderRequestID))
		if f[7] != tc.target || f[10] != tc.uri {
			t.Errorf("%s: request_uri %q uri %q, want %q and %q", tc.target, f[7], f[10], tc.target, tc.uri)
		}
	}
}
