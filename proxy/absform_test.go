package proxy

import (
	"bufio"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/cube-sandbox/cubeproxy/routing"
)

// An HTTP/1.0 request in absolute form may come without a Host line ("GET
// http://3000-x.cube.app/p HTTP/1.0", as a client set up for a forward
// proxy sends it). RFC 9112 3.2.2 has a server go by the target's authority,
// and nginx (so the platform's proxy) routes it by that host ($host). The
// proxy routes it so too, and the sandbox gets the request as it gets one
// that came with that Host: in origin form, with the host as the Host line
// (or the route's MaskRequestHost, the host then in X-Forwarded-Host).
// HTTP/1.1 needs Host (RFC 9112 3.2: fasthttp refuses it without one, 400
// bad_request), and an empty Host line names no host (400 invalid_host):
// both stay refused as before, and no sandbox is dialed.
func TestAbsoluteFormHTTP10WithoutHost(t *testing.T) {
	h := newHarness(t)
	b := startAuthBackend(t)
	other := startAuthBackend(t)
	host := h.route("absform", b.port)
	h.put("absmask", map[string]string{"HostIP": "127.0.0.1", "CreatedAt": "1", "MaskRequestHost": "localhost:${PORT}", "8080": itoa(b.port)})
	h.put("absother", map[string]string{"HostIP": "127.0.0.1", "CreatedAt": "1", "8080": itoa(other.port)})
	const masked = "8080-absmask.cube.test"

	for _, tc := range []struct {
		name, head string
		line       string // request line the sandbox gets
		host       string // its Host
		fwdHost    string // its X-Forwarded-Host ("" = none)
	}{
		{"plain", "GET http://" + host + "/x?q=1 HTTP/1.0", "GET /x?q=1 HTTP/1.1", host, ""},
		{"port and case kept as sent", "GET http://" + strings.ToUpper(host) + ":8081/x HTTP/1.0", "GET /x HTTP/1.1", strings.ToUpper(host) + ":8081", ""},
		{"no path", "GET http://" + host + "?q HTTP/1.0", "GET /?q HTTP/1.1", host, ""},
		{"https scheme", "GET https://" + host + "/x HTTP/1.0", "GET /x HTTP/1.1", host, ""},
		{"masked route", "GET http://" + masked + "/x HTTP/1.0", "GET /x HTTP/1.1", "localhost:8080", masked},
		{"shared host and target headers", "GET http://127.0.0.1:9/x HTTP/1.0\r\nX-Cube-Sandbox-Id: absform\r\nX-Cube-Sandbox-Port: " + itoa(b.port), "GET /x HTTP/1.1", "127.0.0.1:9", ""},
		{"POST with a body", "POST http://" + host + "/up HTTP/1.0\r\nContent-Length: 2\r\n\r\nhi", "POST /up HTTP/1.1", host, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			head := tc.head
			if !strings.Contains(head, "\r\n\r\n") {
				head += "\r\n\r\n"
			}
			resp, body := rawRequest(t, h.addr, head)
			if resp.StatusCode != 200 || body != "ok" {
				t.Fatalf("%d %q, want 200 from the sandbox", resp.StatusCode, body)
			}
			got := b.next(t)
			if got.line != tc.line {
				t.Errorf("sandbox got request line %q, want %q", got.line, tc.line)
			}
			if hs := got.values("Host"); len(hs) != 1 || hs[0] != tc.host {
				t.Errorf("sandbox got Host %q, want one line %q", hs, tc.host)
			}
			if fh := got.values("X-Forwarded-Host"); tc.fwdHost == "" && len(fh) != 0 || tc.fwdHost != "" && (len(fh) != 1 || fh[0] != tc.fwdHost) {
				t.Errorf("sandbox got X-Forwarded-Host %q, want %q", fh, tc.fwdHost)
			}
			if a := got.values("Authorization"); len(a) != 0 {
				t.Errorf("sandbox got Authorization %q from the target's userinfo", a)
			}
		})
	}

	for _, tc := range []struct{ name, head string }{
		{"HTTP/1.1 without Host", "GET http://" + host + "/x HTTP/1.1\r\n"},
		{"HTTP/1.1 with an empty Host line", "GET http://" + host + "/x HTTP/1.1\r\nHost:\r\n"},
		{"HTTP/1.0 with an empty Host line", "GET http://" + host + "/x HTTP/1.0\r\nHost:\r\n"},
		{"HTTP/1.0 with a blank Host line", "GET http://" + host + "/x HTTP/1.0\r\nhost: \r\n"},
		{"HTTP/1.0 Host naming another sandbox", "GET http://" + host + "/x HTTP/1.0\r\nHost: 8080-absother.cube.test\r\n"},
		{"HTTP/1.0 target naming another sandbox than Host", "GET http://8080-absother.cube.test/x HTTP/1.0\r\nHost: " + host + "\r\n"},
		{"HTTP/1.0 in origin form", "GET /x HTTP/1.0\r\n"},
		{"HTTP/1.0 with an empty authority", "GET http:///x HTTP/1.0\r\n"},        // fasthttp's refusal
		{"HTTP/1.0 with userinfo", "GET http://u:pw@" + host + "/x HTTP/1.0\r\n"}, // fasthttp's refusal
		{"HTTP/1.0 with a port alone", "GET http://:8081/x HTTP/1.0\r\n"},
		{"HTTP/1.0 naming no sandbox", "GET http://other.example/x HTTP/1.0\r\n"},
		{"HTTP/1.0 naming a sandbox behind userinfo", "GET http://" + host + "@other.example/x HTTP/1.0\r\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, body := rawRequest(t, h.addr, tc.head+"\r\n")
			code := routing.CodeInvalidHost
			if strings.Contains(tc.head, "HTTP/1.1") || strings.Contains(tc.head, "@") || strings.Contains(tc.head, ":///") {
				// fasthttp's own refusal, before the proxy sees it:
				// HTTP/1.1 without Host, and (since v1.79) userinfo or
				// no host in an absolute-form target.
				code = CodeBadRequest
			}
			checkProxyError(t, resp, body, 400, code)
		})
	}
	if n := other.accepts.Load(); n != 0 {
		t.Errorf("the other sandbox was dialed %d times", n)
	}
	if n := len(b.heads); n != 0 {
		t.Errorf("the sandbox got %d requests that were refused", n)
	}
}

// The proxy's own credential is checked against the host the request is
// routed by, the target's authority: the traffic token and the signed
// cookie let such a request through, and the cookie only from the sandbox's
// own origins (the Origin compared with that host, not with a missing Host
// line); the signed link's 302 sends the browser back to the path alone.
func TestAbsoluteFormHTTP10WithoutHostAuth(t *testing.T) {
	signer, sign := authSigner(t, strings.Repeat("k", 32))
	h := newHarness(t, func(o *harnessOpts) { o.cfg.Signer = signer })
	b := startAuthBackend(t)
	traffic := strings.Repeat("cd", 32)
	putAuthRoute(h, "absauth", traffic, b.port, 8080)
	const host = "8080-absauth.cube.test"
	signed := time.Now()
	tok := sign("absauth", 8080, time.Hour)
	cookie := "Cookie: cube_proxy_auth=" + signer.CookieValue([]byte(tok), traffic)
	for _, tc := range []struct {
		name   string
		lines  []string
		status int
	}{
		{"no credential", nil, 403},
		{"traffic token", []string{"Cube-Traffic-Access-Token: " + traffic}, 200},
		{"cookie", []string{cookie}, 200},
		{"cookie from its own origin", []string{cookie, "Origin: http://" + host}, 200},
		{"cookie from another port of the sandbox", []string{cookie, "Origin: http://3000-absauth.cube.test"}, 200},
		{"cookie from another sandbox's page", []string{cookie, "Origin: http://8080-evil.cube.test"}, 403},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lines := append([]string{"GET http://" + host + "/x HTTP/1.0"}, tc.lines...)
			resp, body := rawRequest(t, h.addr, strings.Join(lines, "\r\n")+"\r\n\r\n")
			if resp.StatusCode != tc.status {
				t.Fatalf("%d %s, want %d", resp.StatusCode, body, tc.status)
			}
			if tc.status != 200 {
				return
			}
			got := b.next(t)
			if got.line != "GET /x HTTP/1.1" || len(got.values("Host")) != 1 || got.values("Host")[0] != host {
				t.Errorf("sandbox got %q with Host %q", got.line, got.values("Host"))
			}
			if c := got.values("Cookie"); len(c) != 0 {
				t.Errorf("the proxy's cookie reached the sandbox: %q", c)
			}
		})
	}
	t.Run("signed link", func(t *testing.T) {
		resp, _ := rawRequest(t, h.addr, "GET http://"+host+"/x?cube_token="+tok+"&k=v HTTP/1.0\r\n\r\n")
		assertAuthCookieRedirect(t, resp, tok, "/x?k=v", time.Hour, signed, false)
	})
}

// The redirect listener sends an HTTP/1.0 request in absolute form without
// a Host line to the host its target names, as the HTTPS listener then
// routes it; HTTP/1.1 without Host (fasthttp's bad_request) and an empty
// Host line stay 400.
func TestRedirectListenerAbsoluteFormHTTP10(t *testing.T) {
	h := newHarness(t)
	ln := listen(t, "127.0.0.1:0")
	go h.server.ServeRedirect(ln, "8443")
	for _, tc := range []struct {
		name, head string
		status     int
		location   string
	}{
		{"no Host", "GET http://50005-box.cube.test/p?q HTTP/1.0\r\n", 308, "https://50005-box.cube.test:8443/p?q"},
		{"no Host, port", "GET http://50005-box.cube.test:80/p HTTP/1.0\r\n", 308, "https://50005-box.cube.test:8443/p"},
		{"no Host, userinfo", "GET http://u:pw@50005-box.cube.test/p HTTP/1.0\r\n", 400, ""},
		{"HTTP/1.1 without Host", "GET http://50005-box.cube.test/p HTTP/1.1\r\n", 400, ""},
		{"empty Host line", "GET http://50005-box.cube.test/p HTTP/1.0\r\nHost:\r\n", 400, ""},
		// One line, its fold a space (RFC 9112 5.2): no host.
		{"folded Host line", "GET http://50005-box.cube.test/p HTTP/1.0\r\nHost: 50005-box.cube.test\r\n evil.example\r\n", 400, ""},
		{"a port alone", "GET http://:80/p HTTP/1.0\r\n", 400, ""},
		{"origin form", "GET /p HTTP/1.0\r\n", 400, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, body := rawRequest(t, ln.Addr().String(), tc.head+"\r\n")
			if resp.StatusCode != tc.status || resp.Header.Get("Location") != tc.location {
				t.Fatalf("%d Location %q, want %d %q", resp.StatusCode, resp.Header.Get("Location"), tc.status, tc.location)
			}
			if tc.status == 400 {
				code := routing.CodeInvalidHost
				if strings.Contains(tc.head, "HTTP/1.1") || strings.Contains(tc.head, "@") {
					code = CodeBadRequest // fasthttp's own refusal
				}
				checkProxyError(t, resp, body, 400, code)
			}
		})
	}
}

// A Host line folded onto the next (obs-fold) is one line, its fold a
// space (RFC 9112 5.2), whatever form the target has. fasthttp joins it so
// for an origin-form request, but an absolute-form target's authority
// overwrites Host there, and the proxy reads the client's line back from
// the head as received: earlier builds read its first physical line alone,
// so "Host: <sandbox>" folded onto " other.example" routed (and reached the
// sandbox as) "<sandbox>", where the same line on an origin-form request
// is a 400, and "Host:" folded onto " <sandbox>" was a 400 where the
// origin form is routed by it. A front proxy that keeps the fold, or joins
// it, sees another Host than the one the sandbox got.
func TestAbsoluteFormFoldedHost(t *testing.T) {
	h := newHarness(t)
	b := startAuthBackend(t)
	host := h.route("absfold", b.port)
	for _, tc := range []struct {
		name, head string
		status     int
		code       string // the refusal's
	}{
		{"continued past the sandbox's name", "GET http://" + host + "/x HTTP/1.1\r\nHost: " + host + "\r\n other.example\r\n", 400, routing.CodeInvalidHost},
		{"continued, HTTP/1.0", "GET http://" + host + "/x HTTP/1.0\r\nHost: " + host + "\r\n\tother.example\r\n", 400, routing.CodeInvalidHost},
		{"empty first line, the name continued", "GET http://" + host + "/x HTTP/1.1\r\nHost:\r\n " + host + "\r\n", 200, ""},
		{"empty first line, another name continued", "GET http://" + host + "/x HTTP/1.1\r\nHost:\r\n 8080-absother.cube.test\r\n", 400, routing.CodeInvalidHost},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, body := rawRequest(t, h.addr, tc.head+"Connection: close\r\n\r\n")
			if tc.status != 200 {
				checkProxyError(t, resp, body, tc.status, tc.code)
				return
			}
			if resp.StatusCode != 200 || body != "ok" {
				t.Fatalf("%d %q, want 200 from the sandbox", resp.StatusCode, body)
			}
			if got := b.next(t); len(got.values("Host")) != 1 || got.values("Host")[0] != host {
				t.Errorf("sandbox got Host %q, want %q", got.values("Host"), host)
			}
		})
	}
	if n := len(b.heads); n != 0 {
		t.Errorf("the sandbox got %d requests that were refused", n)
	}
}

// Only an HTTP/1.0 request's absolute-form target stands in for a missing
// Host line (fasthttp refuses an HTTP/1.1 one without it): any other
// version is refused (505) with the empty Host it came with, which the
// access log shows, not the target's host.
func TestSettleHostTakesTheTargetForHTTP10Only(t *testing.T) {
	for _, tc := range []struct{ line, want string }{
		{"GET http://8080-x.cube.test/p HTTP/1.0", "8080-x.cube.test"},
		{"GET http://8080-x.cube.test/p HTTP/1.2", ""},
		{"GET http://8080-x.cube.test/p HTTP/2.0", ""},
	} {
		var h fasthttp.RequestHeader
		if err := h.Read(bufio.NewReader(strings.NewReader(tc.line + "\r\n\r\n"))); err != nil {
			t.Fatalf("%s: %v", tc.line, err)
		}
		settleHost(&h)
		if got := string(h.Host()); got != tc.want {
			t.Errorf("%s: Host %q, want %q", tc.line, got, tc.want)
		}
	}
}
