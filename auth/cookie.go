package auth

import (
	"bytes"
	"iter"
	"strconv"
	"time"
)

// CookieName is the cookie a verified signed token is traded for. One fixed
// name is enough: the cookie is host-only and the host is
// <port>-<sandbox>.<domain>, so each sandbox port has its own jar entry, and
// the value (Signer.CookieValue) is the signed token, bound to sandbox and
// port, so a cookie presented anywhere else fails with
// signed_token_wrong_target, plus a binding to the route's traffic token.
const CookieName = "cube_proxy_auth"

// QueryParamName is the query parameter that carries a signed token.
const QueryParamName = "cube_token"

// CookieKind selects the attributes SetCookieHeader gives the cookie.
type CookieKind uint8

const (
	// CookieLax is for a client on plain HTTP: SameSite=Lax, no Secure.
	CookieLax CookieKind = iota
	// CookieLaxSecure is for a client on HTTPS: SameSite=Lax; Secure.
	CookieLaxSecure
	// CookiePartitioned is for a client on HTTPS that loads the sandbox in
	// a frame of another site (an agent platform's preview iframe): a Lax
	// cookie is neither stored nor sent there, so the cookie is a
	// partitioned third-party one (CHIPS), SameSite=None; Secure;
	// Partitioned, which the browser sends only under the top-level site
	// it was set under.
	CookiePartitioned
)

// SetCookieHeader returns the Set-Cookie header value that stores value
// (Signer.CookieValue of a verified signed token): host-only (no Domain),
// Path=/, HttpOnly, the SameSite, Secure and Partitioned attributes of kind,
// and Max-Age equal to the seconds left until expiry, rounded up: a token in
// its last second would otherwise get Max-Age=0, which deletes the cookie it
// was traded for, and the browser's follow-up to the 302 would be a 403. The
// cookie outlives the token by under a second, and its value is the token,
// which the proxy refuses once expired.
func SetCookieHeader(value string, expiry, now time.Time, kind CookieKind) string {
	maxAge := int64((expiry.Sub(now) + time.Second - 1) / time.Second)
	if maxAge < 0 {
		maxAge = 0
	}
	v := CookieName + "=" + value + "; Path=/; Max-Age=" + strconv.FormatInt(maxAge, 10) + "; HttpOnly"
	switch kind {
	case CookieLaxSecure:
		v += "; SameSite=Lax; Secure"
	case CookiePartitioned:
		v += "; SameSite=None; Secure; Partitioned"
	default:
		v += "; SameSite=Lax"
	}
	return v
}

// CookieValues yields the value of every cookie called name in a raw Cookie
// header value, in order. All of them count: a sibling host may set a
// domain-wide cookie of the same name that the browser sends first.
func CookieValues(header []byte, name string) iter.Seq[[]byte] {
	return func(yield func([]byte) bool) {
		for rest := header; ; {
			piece, tail, more := cut(rest, ';')
			if k, v, ok := splitCookie(piece); ok && string(k) == name && !yield(v) {
				return
			}
			if !more {
				return
			}
			rest = tail
		}
	}
}

// AppendStripCookie appends header (a raw Cookie header value) to dst with
// every cookie called name removed, and reports whether one was. Every other
// byte is kept as sent, separators included; only the whitespace left at the
// front when the first cookie is removed is dropped. An empty result means
// the proxy should delete the Cookie header. (fasthttp rewrites all cookies
// once its Cookie accessors are used, so the proxy must work on the raw value.)
func AppendStripCookie(dst, header []byte, name string) ([]byte, bool) {
	found, kept := false, false
	for rest := header; ; {
		piece, tail, more := cut(rest, ';')
		if k, _, ok := splitCookie(piece); ok && string(k) == name {
			found = true
		} else {
			if kept {
				dst = append(dst, ';')
			} else if found {
				piece = bytes.TrimLeft(piece, " \t")
			}
			dst = append(dst, piece...)
			kept = true
		}
		if !more {
			return dst, found
		}
		rest = tail
	}
}

// AppendStripQueryParam appends query (a raw query string, without '?') to dst
// with every parameter called name removed, and reports whether one was.
// Names are matched after percent-decoding, as fasthttp's QueryArgs does, so
// the parameter the proxy read is the one removed (no redirect loop on
// "cube%5Ftoken="). The other parameters keep their bytes and order.
func AppendStripQueryParam(dst, query []byte, name string) ([]byte, bool) {
	found, kept := false, false
	for rest := query; ; {
		piece, tail, more := cut(rest, '&')
		k, _, _ := bytes.Cut(piece, []byte{'='})
		if queryNameIs(k, name) {
			found = true
		} else {
			if kept {
				dst = append(dst, '&')
			}
			dst = append(dst, piece...)
			kept = true
		}
		if !more {
			return dst, found
		}
		rest = tail
	}
}

// HasQueryParam reports whether query (a raw query string, without '?') has
// a parameter called name, matched as AppendStripQueryParam matches it. It
// copies nothing, so it can guard the strip on every request.
func HasQueryParam(query []byte, name string) bool {
	for rest := query; ; {
		piece, tail, more := cut(rest, '&')
		if k, _, _ := bytes.Cut(piece, []byte{'='}); queryNameIs(k, name) {
			return true
		}
		if !more {
			return false
		}
		rest = tail
	}
}

// cut splits b at the first sep; more reports whether sep was present.
func cut(b []byte, sep byte) (before, after []byte, more bool) {
	if i := bytes.IndexByte(b, sep); i >= 0 {
		return b[:i], b[i+1:], true
	}
	return b, nil, false
}

// splitCookie splits one "name=value" pair, trimming whitespace around the
// name and value. A pair without '=' has no name (as browsers and fasthttp
// read it) and so never matches.
func splitCookie(piece []byte) (name, value []byte, ok bool) {
	k, v, ok := bytes.Cut(piece, []byte{'='})
	if !ok {
		return nil, nil, false
	}
	return bytes.Trim(k, " \t"), bytes.Trim(v, " \t"), true
}

// queryNameIs reports whether the raw, possibly percent-encoded query name k
// decodes to name ('+' is a space; a '%' not followed by two hex digits is
// literal, as in fasthttp).
func queryNameIs(k []byte, name string) bool {
	j := 0
	for i := 0; i < len(k); i++ {
		c := k[i]
		switch {
		case c == '+':
			c = ' '
		case c == '%' && i+2 < len(k) && isHex(k[i+1]) && isHex(k[i+2]):
			c = unhex(k[i+1])<<4 | unhex(k[i+2])
			i += 2
		}
		if j >= len(name) || name[j] != c {
			return false
		}
		j++
	}
	return j == len(name)
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

func unhex(c byte) byte {
	switch {
	case c <= '9':
		return c - '0'
	case c <= 'F':
		return c - 'A' + 10
	default:
		return c - 'a' + 10
	}
}

// CookieOriginAllowed reports whether the cookie may authorize a request
// with this Origin header to this Host. Every sandbox host is under one
// registrable domain, so to a browser sandbox A's page is the same site as
// sandbox B, and SameSite=Lax still attaches B's cookie to a WebSocket,
// fetch or form POST that A's page makes. Browsers send Origin on all of
// those, so the cookie counts only when Origin is absent (a navigation, a
// plain GET, a non-browser client), names the request's own host, or names
// another port of the same sandbox (same "<id>.<domain>" after the "<port>-"
// label prefix). Scheme and port of the Origin are not compared; "null" and
// anything unparsable are foreign. The partitioned cookie of a cross-site
// preview frame (CookiePartitioned) goes out on every request made under
// the embedding site, its pages' included, so it needs this rule as much.
func CookieOriginAllowed(origin, host []byte) bool {
	if len(origin) == 0 {
		return true
	}
	_, o, ok := bytes.Cut(origin, []byte("://"))
	if !ok {
		return false
	}
	o, h := hostOnly(o), hostOnly(host)
	if len(o) == 0 {
		return false
	}
	if bytes.EqualFold(o, h) {
		return true
	}
	os, oks := sandboxSite(o)
	hs, hks := sandboxSite(h)
	return oks && hks && bytes.EqualFold(os, hs)
}

// CookieRequestAllowed reports whether the cookie may authorize a request
// to host, judged by the headers a browser sets and a page cannot forge.
// With an Origin it is CookieOriginAllowed. Without one it is a navigation,
// a non-browser client, or a subresource (<script src>, <img>, <link>):
// browsers send no Origin on a no-cors GET, and another sandbox's page is
// the same site, so the Lax cookie comes along, and a script's answer runs
// in that page (cross-site script inclusion). Sec-Fetch-Site tells them
// apart: absent (a client that sends none), "none" (typed, bookmarked),
// "same-origin" or a navigation (Sec-Fetch-Mode: navigate, whose answer the
// linking page cannot read) pass; any other request from another origin
// counts only when its Referer (the page, origin only by default across
// origins) is the host or another port of the same sandbox. A page that
// sends no Referer (Referrer-Policy: no-referrer) loses the cookie there.
func CookieRequestAllowed(h HeaderPeeker, host []byte) bool {
	if origin := h.Peek("Origin"); len(origin) > 0 {
		return CookieOriginAllowed(origin, host)
	}
	site := h.Peek("Sec-Fetch-Site")
	if len(site) == 0 || bytes.EqualFold(site, []byte("same-origin")) || bytes.EqualFold(site, []byte("none")) ||
		bytes.EqualFold(h.Peek("Sec-Fetch-Mode"), []byte("navigate")) {
		return true
	}
	ref := h.Peek("Referer")
	// The Referer's scheme and authority only: CookieOriginAllowed reads
	// an Origin, which has no path.
	_, rest, ok := bytes.Cut(ref, []byte("://"))
	if !ok {
		return false
	}
	if i := bytes.IndexAny(rest, "/?#"); i >= 0 {
		ref = ref[:len(ref)-len(rest)+i]
	}
	return CookieOriginAllowed(ref, host)
}

// hostOnly drops the ":port" of a host (a bracketed IPv6 literal keeps its
// brackets).
func hostOnly(b []byte) []byte {
	if len(b) > 0 && b[0] == '[' {
		if i := bytes.IndexByte(b, ']'); i >= 0 {
			return b[:i+1]
		}
		return b
	}
	if i := bytes.IndexByte(b, ':'); i >= 0 {
		return b[:i]
	}
	return b
}

// sandboxSite returns what follows the "<port>-" prefix of a per-sandbox
// host ("box.example.com" for "8080-box.example.com"); ok is false for a
// host that does not start with one.
func sandboxSite(host []byte) (site []byte, ok bool) {
	i := 0
	for i < len(host) && '0' <= host[i] && host[i] <= '9' {
		i++
	}
	if i == 0 || i == len(host) || host[i] != '-' || i+1 == len(host) {
		return nil, false
	}
	return host[i+1:], true
}
