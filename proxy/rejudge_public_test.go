package proxy

import (
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/cube-sandbox/cubeproxy/auth"
)

// A stream or WebSocket opened on a public route is judged, when the
// route is made private, with the credential it came with, as the README
// promises: a signed link in its URL, or the cookie a link was traded for
// (bound to the token the public route kept), lets the opening request
// through on the private route, so it is kept, as one that carried the
// token header is. Earlier builds took a link or a cookie on a public
// route for no credential and cut it as an anonymous one, though its
// reconnect passed at once (an MCP client given a signed URL, a preview
// page's EventSource, when the owner made the sandbox private). A later
// rotation then judges it as such a credential is judged: the cookie,
// bound to the old token, is cut; the link, bound to none, is kept.
func TestPublicMadePrivateKeepsSignedCredentials(t *testing.T) {
	for _, tc := range []struct {
		name string
		kept string // the token the public route keeps, if any
	}{
		{"public route keeping its token", rjTokenA},
		{"public route without a token", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			signer, sign := authSigner(t, strings.Repeat("k", 32))
			h := newHarness(t, func(o *harnessOpts) { o.cfg.Signer = signer })
			b := newRJBackend(t)
			const id, host = "rjp", "8080-rjp.cube.test"
			putRJ(t, h, id, rjFields(b.port, "1", "", tc.kept))
			link := rjCreds{query: "?" + auth.QueryParamName + "=" + sign(id, 8080, time.Hour)}
			otherPort := rjCreds{query: "?" + auth.QueryParamName + "=" + sign(id, 9090, time.Hour)}

			byLink := openRJStream(t, h, host, "stream on the link", link)
			wsLink := dialRJ(t, h, host, "WebSocket on the link", link)
			var wsCookie *websocket.Conn
			if tc.kept != "" {
				cookie := rjCreds{cookie: auth.CookieName + "=" + signer.CookieValue([]byte(sign(id, 8080, time.Hour)), tc.kept)}
				wsCookie = dialRJ(t, h, host, "WebSocket on the cookie", cookie)
			}
			wsOther := dialRJ(t, h, host, "WebSocket on another port's link", otherPort)
			wsAnon := dialRJ(t, h, host, "anonymous WebSocket", rjCreds{})

			putRJ(t, h, id, rjFields(b.port, "1", rjTokenA, "")) // made private
			wsCut(t, wsAnon, "anonymous WebSocket")
			wsCut(t, wsOther, "WebSocket on another port's link")
			rereadsDone(t, h, id)
			b.letGo()
			byLink.relays(t)
			if err := wsEcho(t, wsLink); err != nil {
				t.Errorf("WebSocket on the link: echo after the route was made private: %v", err)
			}
			if wsCookie != nil {
				if err := wsEcho(t, wsCookie); err != nil {
					t.Errorf("WebSocket on the cookie: echo after the route was made private: %v", err)
				}
			}

			putRJ(t, h, id, rjFields(b.port, "1", rjTokenB, "")) // token rotated
			if wsCookie != nil {
				wsCut(t, wsCookie, "WebSocket on the cookie")
			}
			rereadsDone(t, h, id)
			if err := wsEcho(t, wsLink); err != nil {
				t.Errorf("WebSocket on the link: echo after the rotation: %v", err)
			}
		})
	}
}

// A cookie on a public route counts, when the route is made private, only
// where authorize would read it: a stream opened with it from another
// sandbox's or site's page (an Origin, or a cross-origin subresource's
// Referer: auth.CookieRequestAllowed), or on a shared host (the
// X-Cube-Sandbox-Id headers on an IP literal, where no cookie is read:
// sharedOrigin), carried nothing the private route takes, and is cut as an
// anonymous one; the same cookie from the sandbox's own page is kept.
func TestPublicMadePrivateCutsCookieItWouldRefuse(t *testing.T) {
	signer, sign := authSigner(t, strings.Repeat("k", 32))
	h := newHarness(t, func(o *harnessOpts) { o.cfg.Signer = signer })
	b := newRJBackend(t)
	const id, host = "rjx", "8080-rjx.cube.test"
	putRJ(t, h, id, rjFields(b.port, "1", "", rjTokenA)) // public, keeping its token
	cookie := auth.CookieName + "=" + signer.CookieValue([]byte(sign(id, 8080, time.Hour)), rjTokenA)

	own := dialRJ(t, h, host, "WebSocket from its own page", rjCreds{cookie: cookie, hdr: []string{"Origin", "http://" + host}})
	// An event stream: the test backend's WebSocket refuses a foreign
	// Origin itself.
	sibling := openRJStream(t, h, host, "fetch from another sandbox's page",
		rjCreds{cookie: cookie, hdr: []string{"Origin", "http://3000-evil.cube.test"}})
	// A subresource (<script src>) sends no Origin; its Referer names the
	// page.
	subresource := openRJStream(t, h, host, "subresource from another sandbox's page", rjCreds{cookie: cookie,
		hdr: []string{"Sec-Fetch-Site", "same-site", "Sec-Fetch-Mode", "no-cors", "Referer", "http://3000-evil.cube.test/page"}})
	shared := dialRJ(t, h, h.addr, "WebSocket on a shared host",
		rjCreds{cookie: cookie, hdr: []string{"X-Cube-Sandbox-Id", id, "X-Cube-Sandbox-Port", "8080"}})

	putRJ(t, h, id, rjFields(b.port, "1", rjTokenA, "")) // made private, same token
	sibling.cut(t)
	wsCut(t, shared, "WebSocket on a shared host")
	subresource.cut(t)
	rereadsDone(t, h, id)
	if err := wsEcho(t, own); err != nil {
		t.Errorf("WebSocket from its own page: echo after the route was made private: %v", err)
	}
}
