package proxy

import (
	"fmt"
	"testing"
)

// The redirect listener sends every request to HTTPS whatever its body, as
// the traffic and admin listeners take a body whatever its Content-Type.
// It left fasthttp's multipart pre-parse on, which those two turn off: a
// body sent as multipart/form-data that was not a readable form was
// answered 400 instead of the 308, and a readable one was parsed for
// nothing.
func TestRedirectIgnoresAFormBody(t *testing.T) {
	h, _ := logHarness(t, "json")
	rln := listen(t, "127.0.0.1:0")
	go h.server.ServeRedirect(rln, "8443")
	for _, tc := range []struct{ name, body string }{
		{"not a form", "field=1"},
		{"a form", "--x\r\nContent-Disposition: form-data; name=\"a\"\r\n\r\n1\r\n--x--\r\n"},
	} {
		resp, _ := rawRequest(t, rln.Addr().String(), fmt.Sprintf(
			"POST /upload HTTP/1.1\r\nHost: 3000-box.cube.test\r\nContent-Type: multipart/form-data; boundary=x\r\nContent-Length: %d\r\n\r\n%s",
			len(tc.body), tc.body))
		if want := "https://3000-box.cube.test:8443/upload"; resp.StatusCode != 308 || resp.Header.Get("Location") != want {
			t.Errorf("%s: %d Location %q, want 308 %q", tc.name, resp.StatusCode, resp.Header.Get("Location"), want)
		}
	}
}
