package proxy

import (
	"bytes"
	"errors"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/cube-sandbox/cubeproxy/auth"
	"github.com/cube-sandbox/cubeproxy/routing"
	"github.com/cube-sandbox/cubeproxy/telemetry"
)

// authorize applies the proxy's own credential: the route's traffic token,
// or a signed browser token (query parameter, then cookie). It runs before
// anything with side effects. handled is true when it answered the request
// itself (403, or the 302 that trades a signed token for a cookie).
// Credentials of the sandbox's own services (Authorization, X-Access-Token)
// are never read here.
func (p *Proxy) authorize(ctx *fasthttp.RequestCtx, x *exchange, r *routing.Route, t *routing.Target) (handled bool) {
	h := &ctx.Request.Header
	exempt := p.exemptPort(t.Port)
	err := auth.CheckTraffic(r.Public, r.TrafficToken, exempt, h)
	if err == nil {
		x.via = p.passedVia(ctx, r, t, exempt)
		return false
	}
	rej := rejection(err, rejTrafficInvalid)
	notConfigured := rej.Code == auth.CodeTrafficTokenNotConfigured
	// Once per store read of the route, as invalid route data: every
	// request to it is refused, and anyone can send them; the access log
	// and the auth rejection metric count each one. Not once a second
	// across routes: a flooded route then hid every other broken one.
	// At warn level with the field, the reason and the store's key, as
	// invalid route data: one sandbox's data to fix, not the proxy
	// failing.
	if notConfigured && r.FirstReport() {
		args := []any{"sandbox_id", r.ID, "field", routing.FieldTrafficAccessToken, "reason", routing.ReasonTokenRequired}
		if r.Key != "" {
			args = append(args, "key", r.Key)
		}
		p.cfg.Logger.Warn("restricted route has no traffic token; refusing it (fix the route data)", args...)
	}
	// Not a route with no stored token: every request to it is a 403 (the
	// README promises no exception), and a 204 would tell the browser the
	// call it asks about may be made.
	if !notConfigured && isPreflight(h) {
		// Answered here, not by the sandbox: counted with the proxy's
		// other own answers (route_kind error), not among the sandbox's.
		x.kind = telemetry.RouteError
		answerPreflight(ctx)
		return true
	}
	if rej.Code == auth.CodeTrafficTokenMissing && p.cfg.Signer != nil {
		tok := ctx.QueryArgs().Peek(auth.QueryParamName)
		if len(tok) > 0 {
			exp, verr := p.cfg.Signer.VerifyBytes(tok, r.ID, t.Port, time.Now())
			if verr == nil {
				// On a shared host, every sandbox behind it is one
				// origin: a cookie would be sent to, and usable from, any
				// of their pages. The link lets its own request through,
				// and no cookie is traded for it.
				if !navigation(h) || sharedOrigin(t) {
					// prepareRequest removes the parameter.
					x.via = viaLink
					return false
				}
				// A cookie the browser already holds that outlives the
				// link stays: an old link opened after a newer one would
				// otherwise cut the session short. The browser sent it
				// here, so it is one this context can use.
				value := ""
				if held, ok, _ := p.signedCookie(h, r, t.Port); !ok || !held.After(exp) {
					value = p.cfg.Signer.CookieValue(tok, r.TrafficToken)
				}
				x.kind = telemetry.RouteError // the proxy's own answer, as the preflight's
				p.redirectWithCookie(ctx, value, exp)
				return true
			}
			rej = rejection(verr, rej)
		}
		// A refused parameter still leaves the cookie: a browser that holds
		// a valid one (from a newer link) and opens an old link would
		// otherwise be locked out of a URL it may open without the
		// parameter. The parameter's error is the one reported. A shared
		// origin trades no cookie (above), so none is read there.
		if !sharedOrigin(t) {
			if _, ok, verr := p.signedCookie(h, r, t.Port); ok {
				// The cookie is ambient: a sibling sandbox's page can
				// make the browser send it (see auth.CookieRequestAllowed).
				if auth.CookieRequestAllowed(h, h.Host()) {
					x.via = viaCookie
					return false
				}
				rej = rejForeignOrigin
			} else if verr != nil && len(tok) == 0 {
				rej = rejection(verr, rej)
			}
		}
	}
	p.metrics.AuthRejected(rej.Code)
	x.fail(ctx, proxyError{status: 403, code: rej.Code, msg: rej.Reason}, t.ID())
	return true
}

// sharedOrigin reports whether the request's host serves every sandbox
// behind it from one origin, where the proxy neither sets nor reads its
// cookie: a request routed by its path, or by the X-Cube-Sandbox-Id
// headers on a shared host (an IP, localhost, a shared_hosts name). Both
// are the hosts path routing serves any sandbox's pages on, so a cookie
// stored there for one sandbox went along on a same-origin fetch another
// sandbox's page makes with the headers, and let it read the answer.
func sharedOrigin(t *routing.Target) bool {
	return t.PathPrefix > 0 || t.Shared
}

// passedVia is how a request auth.CheckTraffic let through passed, the
// evidence a route change judges its exchange by (rejudge). On a public
// route a request is judged by what it carried, as authorize would judge
// it on the route made private: the route's token in its header, else a
// signed link in its URL or the cookie one was traded for (signedVia).
// Made private (with the same token, for the header and the cookie), the
// route still lets such a request through, while one that carried nothing
// is cut. The look costs two header peeks and a compare where the route
// has a token, and a scan of the target (and of the Cookie lines, where it
// has a token) with signing keys; no allocation.
func (p *Proxy) passedVia(ctx *fasthttp.RequestCtx, r *routing.Route, t *routing.Target, exempt bool) authVia {
	switch {
	case r.Public:
		if r.TrafficToken != "" && auth.CheckTraffic(false, r.TrafficToken, false, &ctx.Request.Header) == nil {
			return viaToken
		}
		if !exempt && p.cfg.Signer != nil {
			return p.signedVia(ctx, r, t)
		}
		return viaAnonymous
	case exempt:
		return viaAnonymous
	}
	return viaToken
}

// signedVia is how a request on public route r would pass authorize with
// r made private, by a signed credential: its link (viaLink; a navigation
// would get the 302 instead, which trades the link for the cookie), else
// the cookie where authorize reads one (viaCookie), else nothing
// (viaAnonymous). Without it a stream opened with a signed URL (an MCP
// client's, a preview page's EventSource) was cut when the sandbox was
// made private, and its reconnect, with the same URL, passed at once.
func (p *Proxy) signedVia(ctx *fasthttp.RequestCtx, r *routing.Route, t *routing.Target) authVia {
	h := &ctx.Request.Header
	// The raw scan first: parsing the query is for a request that has the
	// parameter.
	if _, query, ok := bytes.Cut(h.RequestURI(), []byte{'?'}); ok && auth.HasQueryParam(query, auth.QueryParamName) {
		if tok := ctx.QueryArgs().Peek(auth.QueryParamName); len(tok) > 0 {
			if _, err := p.cfg.Signer.VerifyBytes(tok, r.ID, t.Port, time.Now()); err == nil {
				return viaLink
			}
		}
	}
	if sharedOrigin(t) || r.TrafficToken == "" {
		// No cookie is read on a shared origin, and none is bound to a
		// route without a token.
		return viaAnonymous
	}
	for _, l := range h.PeekAll("Cookie") {
		if bytes.Contains(l, []byte(auth.CookieName)) {
			if _, ok, _ := p.signedCookie(h, r, t.Port); ok && auth.CookieRequestAllowed(h, h.Host()) {
				return viaCookie
			}
			break
		}
	}
	return viaAnonymous
}

// Refusals authorize makes itself, shared as auth's are: a new one per
// request would be an allocation a client can drive at will.
var (
	rejTrafficInvalid = &auth.Rejection{Code: auth.CodeTrafficTokenInvalid, Reason: "traffic access token invalid"}
	rejForeignOrigin  = &auth.Rejection{Code: auth.CodeSignedCookieForeignOrigin,
		Reason: "the sandbox cookie is not accepted on a request from another sandbox's or site's page (Origin, or the Referer of a subresource)"}
)

// rejection returns the *auth.Rejection err is or wraps, else otherwise.
// auth returns its rejections unwrapped, so the type assertion answers
// without errors.As, whose target would escape to the heap on every
// refusal; r is declared only on the path that needs it.
func rejection(err error, otherwise *auth.Rejection) *auth.Rejection {
	if r, ok := err.(*auth.Rejection); ok {
		return r
	}
	var r *auth.Rejection
	if errors.As(err, &r) {
		return r
	}
	return otherwise
}

// navigation reports whether a request that carries a valid signed token
// in its URL may be answered with the 302 that trades it for the cookie.
// No WebSocket client follows a redirect, and a browser's fetch,
// EventSource or subresource request (Sec-Fetch-Mode other than navigate)
// fails on a cross-origin redirect that has no CORS headers: those are let
// through by the token itself, which is not ambient (the page had to put
// it in the URL). So are a method other than GET and HEAD, which a client
// repeats after a 302 as a GET without its body (a form POST, an MCP
// client given the signed URL), and a request for an event stream: a
// client without a cookie jar (an MCP client's SSE GET) would come back
// with no credential at all. A page load that sends no Sec-Fetch-Mode
// (curl, an older browser) gets the redirect.
func navigation(h *fasthttp.RequestHeader) bool {
	if !h.IsGet() && !h.IsHead() || upgradeRequested(h) || acceptsEventStream(h) {
		return false
	}
	m := h.Peek("Sec-Fetch-Mode")
	return len(m) == 0 || bytes.EqualFold(m, []byte("navigate"))
}

// signedCookie reports whether one of the request's signed-token cookies
// verifies for the target and the route's current traffic token, and the
// expiry of the first that does; if none does, err is the first one's error
// (nil when there is no such cookie).
// Every Cookie line and every cookie of the name is tried: a browser sends a
// sibling host's domain-wide cookie of the same name too, and an HTTP/2
// gateway may split cookies over lines.
func (p *Proxy) signedCookie(h *fasthttp.RequestHeader, r *routing.Route, port uint16) (exp time.Time, ok bool, err error) {
	now := time.Now()
	for _, line := range h.PeekAll("Cookie") {
		for c := range auth.CookieValues(line, auth.CookieName) {
			exp, verr := p.cfg.Signer.VerifyCookie(c, r.ID, port, r.TrafficToken, now)
			if verr == nil {
				return exp, true, nil
			}
			if err == nil {
				err = verr
			}
		}
	}
	return time.Time{}, false, err
}

// redirectWithCookie trades a verified signed token for a host-only cookie
// (value, bound to the route's traffic token; none when value is empty) and
// sends the browser back to the same URL without the token, so it does not
// linger in history, logs or Referer headers.
func (p *Proxy) redirectWithCookie(ctx *fasthttp.RequestCtx, value string, exp time.Time) {
	loc := appendCookieLocation(nil, ctx.Request.Header.RequestURI())
	ctx.Response.Reset()
	if value != "" {
		ctx.Response.Header.Set("Set-Cookie", auth.SetCookieHeader(value, exp, time.Now(), cookieKind(ctx)))
	}
	ctx.Response.Header.Set("Cache-Control", "no-store")
	ctx.Response.Header.SetBytesV("Location", loc)
	ctx.SetStatusCode(fasthttp.StatusFound)
}

// cookieKind picks the attributes of the cookie a signed token is traded
// for. A page of another site that shows the sandbox in a frame (an agent
// platform's preview iframe; the Public Suffix List entry the README
// recommends makes every platform UI another site) would get a Lax cookie
// the browser refuses to store or send there, and every load after the 302
// would be a 403: such a frame gets a partitioned SameSite=None cookie
// (CHIPS), which the browser keeps under the platform's top-level site only.
// That needs Secure, so a client on plain HTTP keeps Lax. A same-site
// parent keeps Lax too: the browser stores and sends a Lax cookie in a frame
// whose ancestors are all of the sandbox's site, and Lax stays the narrower
// cookie. Only the trade (a 302) gets here, never the hot path.
func cookieKind(ctx *fasthttp.RequestCtx) auth.CookieKind {
	h := &ctx.Request.Header
	if !ctx.IsTLS() && !forwardedHTTPS(h) {
		return auth.CookieLax
	}
	dest := h.Peek("Sec-Fetch-Dest")
	framed := bytes.EqualFold(dest, []byte("iframe")) || bytes.EqualFold(dest, []byte("frame"))
	if framed && bytes.EqualFold(h.Peek("Sec-Fetch-Site"), []byte("cross-site")) {
		return auth.CookiePartitioned
	}
	return auth.CookieLaxSecure
}

// forwardedHTTPS reports whether a TLS terminator in front says the client
// came over HTTPS (the first X-Forwarded-Proto value). Trusting a client's
// own header is safe here: it can only make that client's cookie Secure.
func forwardedHTTPS(h *fasthttp.RequestHeader) bool {
	first, _, _ := bytes.Cut(h.Peek("X-Forwarded-Proto"), []byte{','})
	return bytes.EqualFold(bytes.TrimSpace(first), []byte("https"))
}

// appendCookieLocation appends the Location of the 302 that trades a signed
// token for a cookie: the raw request target uri's path, as appendLocalPath
// makes it, and its query without the token (none left, no '?').
func appendCookieLocation(dst, uri []byte) []byte {
	path, query, _ := bytes.Cut(uri, []byte{'?'})
	dst = appendLocalPath(dst, path)
	if clean, _ := auth.AppendStripQueryParam(nil, query, auth.QueryParamName); len(clean) > 0 {
		dst = append(append(dst, '?'), clean...)
	}
	return dst
}

// appendLocalPath appends the path of a raw request target as a reference
// that browsers resolve on the same host: the scheme and authority of an
// absolute-form target are dropped, and the leading run of '/' and '\\'
// (which browsers read as '/'; they also skip tabs and newlines) becomes one
// '/'. Copied as sent, "//evil.example/x" would be a network-path reference
// and the 302 an open redirect.
func appendLocalPath(dst, path []byte) []byte {
	if len(path) > 0 && path[0] != '/' && path[0] != '\\' {
		// Absolute-form ("http://host/p"); anything else has no usable path.
		_, rest, ok := bytes.Cut(path, []byte("://"))
		if i := bytes.IndexAny(rest, `/\`); ok && i >= 0 {
			path = rest[i:]
		} else {
			path = nil
		}
	}
	return append(append(dst, '/'), bytes.TrimLeft(path, "/\\\t\r\n ")...)
}

// proxyTokenHeaders are the headers that carry the proxy's own tokens:
// both traffic-token headers, and the admin token, which the admin API
// alone reads. A client that sends its admin token to a sandbox host (a
// script pointed at the wrong URL, a header set on every request) must
// not hand it to the code running there, which could then rewrite every
// route.
var proxyTokenHeaders = [...]string{auth.HeaderE2BTrafficToken, auth.HeaderCubeTrafficToken, auth.HeaderAdminToken}

// stripProxyCredentials removes the proxy's own credentials before the
// request goes to the sandbox: the token headers and our cookie. Every
// other byte of every other header stays as the client sent it.
func stripProxyCredentials(h *fasthttp.RequestHeader) {
	for _, name := range proxyTokenHeaders {
		// Unconditionally: an empty token header is still the proxy's.
		h.Del(name)
	}
	// A client (or an HTTP/2 gateway) may split cookies over several
	// Cookie lines: every line is checked and keeps its other cookies.
	lines := h.PeekAll("Cookie")
	ours := false
	for _, l := range lines {
		ours = ours || bytes.Contains(l, []byte(auth.CookieName))
	}
	if !ours {
		return
	}
	// The kept lines, '\n'-separated (no header value contains one).
	var buf [1024]byte
	kept, found := buf[:0], false
	for i, l := range lines {
		if i > 0 {
			kept = append(kept, '\n')
		}
		var f bool
		kept, f = auth.AppendStripCookie(kept, l, auth.CookieName)
		found = found || f
	}
	if !found {
		return
	}
	h.Del("Cookie")
	// Adding "Cookie" normally parses the value and re-serializes every
	// cookie (quotes lost); with special headers off the raw bytes are kept.
	special := !h.DisableSpecialHeader()
	for len(kept) > 0 {
		line, rest, _ := bytes.Cut(kept, []byte{'\n'})
		if len(line) > 0 {
			h.AddBytesV("Cookie", line)
		}
		kept = rest
	}
	if special {
		h.EnableSpecialHeader()
	}
}

func (p *Proxy) exemptPort(port uint16) bool {
	for _, e := range p.cfg.ExemptPorts {
		if e == port {
			return true
		}
	}
	return false
}

// isPreflight reports whether a request is a browser's CORS preflight: an
// OPTIONS with Origin and Access-Control-Request-Method, and no body.
func isPreflight(h *fasthttp.RequestHeader) bool {
	return h.IsOptions() && frameless(h) &&
		len(h.Peek("Origin")) > 0 && len(h.Peek("Access-Control-Request-Method")) > 0
}

// answerPreflight lets a browser send the request it asks about. A
// preflight never carries credentials (Fetch standard), so refused like any
// request without the traffic token it would fail every cross-origin call
// that sends the token header, or JSON with the cookie from another port of
// the same sandbox, before that call is made. The proxy answers it itself,
// so nothing without a credential reaches the sandbox. Letting every origin
// send grants nothing: the request itself still needs the token or the
// cookie (which counts only from the sandbox's own origins), and the
// Access-Control-Allow-Origin on the sandbox's answer still decides whether
// the page may read it.
func answerPreflight(ctx *fasthttp.RequestCtx) {
	h := &ctx.Request.Header
	resp := &ctx.Response
	resp.Reset()
	resp.SetStatusCode(fasthttp.StatusNoContent)
	resp.Header.SetBytesV("Access-Control-Allow-Origin", h.Peek("Origin"))
	resp.Header.Set("Access-Control-Allow-Credentials", "true")
	resp.Header.SetBytesV("Access-Control-Allow-Methods", h.Peek("Access-Control-Request-Method"))
	if v := h.Peek("Access-Control-Request-Headers"); len(v) > 0 {
		resp.Header.SetBytesV("Access-Control-Allow-Headers", v)
	}
	resp.Header.Set("Access-Control-Max-Age", "600")
	resp.Header.Set("Vary", "Origin, Access-Control-Request-Method, Access-Control-Request-Headers")
	resp.Header.Set("Cache-Control", "no-store")
}
