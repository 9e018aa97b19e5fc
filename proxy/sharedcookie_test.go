package proxy

import (
	"io"
	"net/http"
	"net/http/cookiejar"
	"strings"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/routing"
)

// A shared host (an IP literal, localhost, a shared_hosts name) is one
// origin for every sandbox behind it, as a path-routed host is: the pages
// of any sandbox are served there by their path. A signed link sent with
// the X-Cube-Sandbox-Id headers there lets its own request through and is
// not traded for a cookie, and no cookie is read there: a cookie stored
// for the shared host (by a client that sends no Sec-Fetch-Mode, which
// got the 302) went along on, and was accepted from, a same-origin
// request that another sandbox's page made with the headers.
func TestSharedHostCredentials(t *testing.T) {
	key, traffic := authRandomHex(t, 32), authRandomHex(t, 32)
	signer, sign := authSigner(t, key)
	h := newHarness(t, func(o *harnessOpts) {
		o.cfg.Signer = signer
		o.cfg.Parser = routing.ParserConfig{SharedHosts: []string{"shared.cube.test"}}
	})
	port := pathSandbox(t)
	putAuthRoute(h, "victim", traffic, port, 8080)
	putAuthRoute(h, "other", "", port, 8080) // another tenant's public app
	victim := []string{"X-Cube-Sandbox-Id", "victim", "X-Cube-Sandbox-Port", "8080"}
	for _, host := range []string{h.addr, "shared.cube.test"} {
		t.Run(host, func(t *testing.T) {
			jar, err := cookiejar.New(nil)
			if err != nil {
				t.Fatal(err)
			}
			c := authHostClient(h.addr, jar, false, nil)
			do := func(target string, hdr ...string) (*http.Response, string) {
				t.Helper()
				r, err := http.NewRequest("GET", "http://"+host+target, nil)
				if err != nil {
					t.Fatal(err)
				}
				for i := 0; i+1 < len(hdr); i += 2 {
					r.Header.Set(hdr[i], hdr[i+1])
				}
				resp, err := c.Do(r)
				if err != nil {
					t.Fatal(err)
				}
				defer resp.Body.Close()
				b, _ := io.ReadAll(resp.Body)
				return resp, string(b)
			}

			// The link, as a client that sends no Sec-Fetch-Mode opens it.
			tok := sign("victim", 8080, 10*time.Minute)
			resp, body := do("/page?a=1&cube_token="+tok, victim...)
			if resp.StatusCode != 200 || !strings.Contains(body, `"Target":"/page?a=1"`) || resp.Header.Get("Set-Cookie") != "" {
				t.Errorf("signed link on a shared host: %d %s, Set-Cookie %q; want the page itself, no token passed on, no cookie",
					resp.StatusCode, body, resp.Header.Get("Set-Cookie"))
			}

			// The other sandbox's page, served on the same origin by its
			// path, asks for the victim's with the headers: the client
			// attaches whatever it holds for the shared host.
			if resp, body := do("/sandbox/other/8080/"); resp.StatusCode != 200 {
				t.Fatalf("the other sandbox's page: %d %s", resp.StatusCode, body)
			}
			page := "http://" + host + "/sandbox/other/8080/"
			fromPage := append([]string{"Sec-Fetch-Site", "same-origin", "Sec-Fetch-Mode", "cors", "Referer", page}, victim...)
			if resp, body := do("/secret", fromPage...); resp.StatusCode != 403 {
				t.Errorf("another sandbox's page with the jar's cookies: %d %s, want 403", resp.StatusCode, body)
			}
			// Nor does a cookie minted as the 302 mints it count there.
			cookie := "cube_proxy_auth=" + signer.CookieValue([]byte(tok), traffic)
			if resp, body := do("/secret", append(fromPage, "Cookie", cookie)...); resp.StatusCode != 403 || !strings.Contains(body, "traffic_token_missing") {
				t.Errorf("cookie on a shared host: %d %s, want 403 traffic_token_missing", resp.StatusCode, body)
			}
			// The traffic token still opens it there.
			if resp, body := do("/p", append(victim, "E2b-Traffic-Access-Token", traffic)...); resp.StatusCode != 200 || !strings.Contains(body, `"Target":"/p"`) {
				t.Errorf("traffic token on a shared host: %d %s", resp.StatusCode, body)
			}
		})
	}
}
