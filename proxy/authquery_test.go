package proxy

import (
	"testing"
	"time"
)

// TestAbsoluteFormQueryWhateverCredential: an absolute-form target (a
// client configured for a forward proxy sends one) goes on as its path and
// query as sent, whichever credential let it through. The cookie's check
// reads the query for a signed token (fasthttp's QueryArgs), and
// Request.Write then rebuilt the query from the parsed arguments: "a%20b"
// reached the sandbox as "a+b", "%zz" as "%25zz", "flag&&" as "flag", so a
// request passed by the cookie read otherwise than the same one passed by
// the token header (a raw-query signature, a parser that takes '+' as a
// plus sign).
func TestAbsoluteFormQueryWhateverCredential(t *testing.T) {
	t.Parallel()
	key, traffic := authRandomHex(t, 32), authRandomHex(t, 32)
	signer, sign := authSigner(t, key)
	b := startAuthBackend(t)
	h := newHarness(t, func(o *harnessOpts) { o.cfg.Signer = signer })
	putAuthRoute(h, "box", traffic, b.port, 8080)
	putAuthRoute(h, "pub", "", b.port, 8080)
	tok := sign("box", 8080, 10*time.Minute)
	cookie := "Cookie: a=1; cube_proxy_auth=" + signer.CookieValue([]byte(tok), traffic)
	const query = "q=a%20b&r=%zz;s=1&flag&&t=x+y"
	upgrade := []string{"Connection: Upgrade", "Upgrade: websocket", "Sec-WebSocket-Version: 13", "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ=="}
	for _, tc := range []struct {
		name   string
		host   string
		suffix string // appended to the query as sent
		lines  []string
	}{
		{"traffic token", "8080-box.cube.test", "", []string{"E2b-Traffic-Access-Token: " + traffic}},
		{"cookie", "8080-box.cube.test", "", []string{cookie}},
		{"cookie, fetch", "8080-box.cube.test", "", []string{cookie, "Sec-Fetch-Mode: cors", "Origin: http://8080-box.cube.test"}},
		{"signed link, fetch", "8080-box.cube.test", "&cube_token=" + tok, []string{"Sec-Fetch-Mode: cors"}},
		{"public route", "8080-pub.cube.test", "", nil},
	} {
		for _, ws := range []bool{false, true} {
			name := tc.name
			lines := append([]string{"GET http://" + tc.host + "/p?" + query + tc.suffix + " HTTP/1.1", "Host: " + tc.host}, tc.lines...)
			if ws {
				name += ", WebSocket"
				lines = append(lines, upgrade...)
			}
			resp, body := authRawRequest(t, h.addr, lines...)
			if resp.StatusCode != 200 {
				t.Errorf("%s: %d %s, want the backend's 200", name, resp.StatusCode, body)
				continue
			}
			if got, want := b.next(t).line, "GET /p?"+query+" HTTP/1.1"; got != want {
				t.Errorf("%s: backend request line %q, want %q", name, got, want)
			}
		}
	}
}
