package proxy

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/accesslog"
)

// route_kind error is every answer the proxy gives itself, as README's
// Metrics says (a refusal, an unknown sandbox, a redirect to HTTPS): the
// 302 that trades a signed link for the cookie and the 204 to a CORS
// preflight on a restricted route reach no sandbox either, and were logged
// and counted as http, among the sandboxes' own answers, where a dashboard
// of http 3xx or 2xx read them as the sandbox's.
func TestProxysOwnAnswersAreRouteKindError(t *testing.T) {
	signer, sign := authSigner(t, strings.Repeat("k", 32))
	h, buf := logHarness(t, accesslog.FormatJSON, func(o *harnessOpts) { o.cfg.Signer = signer })
	port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "ok")
	}))
	token := strings.Repeat("ab", 32)
	putAuthRoute(h, "kindbox", token, port, 8080)
	host := "8080-kindbox.cube.test"
	for _, tc := range []struct {
		name    string
		target  string
		headers map[string]string
		status  int
		kind    string
	}{
		{"signed link traded for the cookie", "/p?cube_token=" + sign("kindbox", 8080, time.Minute),
			map[string]string{"Sec-Fetch-Mode": "navigate"}, 302, "error"},
		{"CORS preflight", "/p",
			map[string]string{"Origin": "http://a.test", "Access-Control-Request-Method": "POST"}, 204, "error"},
		{"sandbox's own answer", "/p",
			map[string]string{"e2b-traffic-access-token": token}, 200, "http"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			method := "GET"
			if tc.status == 204 {
				method = "OPTIONS"
			}
			req := h.req(method, host, tc.target, nil)
			id := "kind-" + strings.ReplaceAll(tc.name, " ", "-")
			req.Header.Set("X-Cube-Request-Id", id)
			for k, v := range tc.headers {
				req.Header.Set(k, v)
			}
			resp := h.do(req)
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			// The logged status: the client follows the 302.
			entry := buf.waitJSON(t, id)
			if entry["status"] != float64(tc.status) || entry["route_kind"] != tc.kind {
				t.Errorf("logged %v with route_kind %v; want %d, %s", entry["status"], entry["route_kind"], tc.status, tc.kind)
			}
		})
	}
}
