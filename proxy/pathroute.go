package proxy

import (
	"bytes"
	"slices"

	"github.com/valyala/fasthttp"

	"github.com/cube-sandbox/cubeproxy/routing"
)

// Path routing ("/sandbox/<id>/<port>/rest" on a host that names no
// sandbox, routing.Parser.ParseRequest) follows the platform's proxy: the
// sandbox gets "/rest" and X-Forwarded-Prefix, and the paths its answer
// names on the proxy's side (a root-relative Location or Refresh URL, a
// cookie's Path) are put back under the prefix, as nginx's proxy_redirect
// and proxy_cookie_path do there. An app that knows nothing of the prefix
// then keeps the client under it. A path already under the prefix (an app
// that builds its links from X-Forwarded-Prefix, a "next" parameter the
// browser's own URL filled) is left as it is, where nginx prefixed it
// again.

// underPrefix reports whether the path or URL p needs no prefix: it is
// the prefix itself, or goes on under it ("/", "?" or "#" after it).
func underPrefix(p, prefix []byte) bool {
	if !bytes.HasPrefix(p, prefix) {
		return false
	}
	return len(p) == len(prefix) || bytes.IndexByte([]byte("/?#"), p[len(prefix)]) >= 0
}

// maxPathPrefix is the longest "/sandbox/<id>/<port>" prefix.
const maxPathPrefix = len(routing.PathRoot) + routing.MaxIDLen + len("/65535")

// headerForwardedPrefix tells the sandbox the path it is served under.
const headerForwardedPrefix = "X-Forwarded-Prefix"

// stripPathPrefix makes the request target of a request routed by its
// path the sandbox's own path: the target without its prefix. The prefix
// goes in X-Forwarded-Prefix (any the client sent is replaced, as nginx's
// proxy_set_header does), where frameworks look for it to build links.
func stripPathPrefix(h *fasthttp.RequestHeader, t *routing.Target) {
	// fasthttp serves an empty target, or one that begins with '?', as
	// under "/" (RequestURI): "/sandbox/x/80" and "/sandbox/x/80?q" reach
	// the sandbox as "/" and "/?q". The copy is within the header's own
	// buffer, to its start.
	h.SetRequestURIBytes(h.RequestURI()[t.PathPrefix:])
	var buf [maxPathPrefix]byte
	h.SetBytesV(headerForwardedPrefix, routing.AppendPathPrefix(buf[:0], t))
}

// scopeResponse keeps what the sandbox's answer names on the client's side:
// its cookies on the host the client addressed (scopeSetCookies) and, on a
// request routed by its path, its root-relative URLs under the prefix.
func scopeResponse(resp *fasthttp.ResponseHeader, t *routing.Target) {
	var buf [maxPathPrefix]byte
	var prefix []byte
	if t.PathPrefix > 0 {
		prefix = routing.AppendPathPrefix(buf[:0], t)
		prefixRedirects(resp, prefix)
	}
	scopeSetCookies(resp, prefix)
}

// prefixRedirects puts a root-relative Location ("/login", and so
// "//host/x", which becomes a path under the prefix too) and the URL of a
// Refresh ("5; url=/next") under prefix, as nginx's proxy_redirect
// "~^/(.*)$ <prefix>/$1" does. Absolute URLs and relative references
// ("next", "../x") are left: they name another site, or resolve under the
// prefix already.
func prefixRedirects(h *fasthttp.ResponseHeader, prefix []byte) {
	prefixLines(h, fasthttp.HeaderLocation, prefix, locationURL)
	prefixLines(h, "Refresh", prefix, refreshURL)
}

// prefixLines puts prefix before the URL of each line of the response
// field name whose URL (at url) is root-relative. A field sent on several
// lines (nginx passes a Location's first alone) keeps them all, in order,
// as host routing relays them: judging the first line alone let a
// root-relative one after an absolute one out of the prefix, and setting
// the first dropped the others.
func prefixLines(h *fasthttp.ResponseHeader, name string, prefix []byte, url func([]byte) int) {
	lines := h.PeekAll(name)
	if !slices.ContainsFunc(lines, func(v []byte) bool { return rootedAt(v, prefix, url) >= 0 }) {
		return
	}
	// A redirect's: copied first, as the lines alias the header's
	// buffers, which the set and adds below reuse.
	var all [][]byte
	for _, v := range lines {
		all = append(all, appendPrefixed(nil, v, prefix, url))
	}
	h.SetBytesV(name, all[0]) // in the first line's place, the others dropped
	for _, v := range all[1:] {
		h.AddBytesV(name, v)
	}
}

// rootedAt is where in v its URL (at url) begins, when that URL is
// root-relative and not under prefix already; else -1.
func rootedAt(v, prefix []byte, url func([]byte) int) int {
	if at := url(v); at >= 0 && at < len(v) && v[at] == '/' && !underPrefix(v[at:], prefix) {
		return at
	}
	return -1
}

// appendPrefixed appends v to dst with prefix before its URL when that is
// root-relative.
func appendPrefixed(dst, v, prefix []byte, url func([]byte) int) []byte {
	if at := rootedAt(v, prefix, url); at >= 0 {
		return append(append(append(dst, v[:at]...), prefix...), v[at:]...)
	}
	return append(dst, v...)
}

// locationURL is where a Location value's URL begins.
func locationURL([]byte) int { return 0 }

// refreshURL is where a Refresh value's URL begins, after its "url=", or
// -1 without one.
func refreshURL(v []byte) int {
	if i := indexURL(v); i >= 0 {
		return i + len("url=")
	}
	return -1
}

// indexURL is the index in a Refresh value of its "url=" (in any case),
// or -1.
func indexURL(v []byte) int {
	for i := 0; i+len("url=") <= len(v); i++ {
		if bytes.EqualFold(v[i:i+len("url=")], []byte("url=")) {
			return i
		}
	}
	return -1
}
