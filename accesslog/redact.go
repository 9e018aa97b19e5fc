package accesslog

import "strings"

// redactedParams are query parameters whose values never reach a log: the
// signed browser token.
var redactedParams = [...]string{"cube_token"}

const redacted = "REDACTED"

// appendFunc appends an escaped copy of s to dst.
type appendFunc func(dst []byte, s string) []byte

// appendRedactedURI appends uri through esc with secrets replaced by
// REDACTED: the values of secret parameters in the query and in a
// fragment, and the userinfo of an absolute-form target. A client has no
// business sending a fragment, but a hand-made one can ("/p#cube_token=…"
// is how a token reaches a page's script), and the proxy forwards it as
// sent; userinfo ("http://user:pw@host/p") is a password, which fasthttp
// would even turn into an Authorization header.
func appendRedactedURI(dst []byte, uri string, esc appendFunc) []byte {
	dst, uri = appendRedactedAuthority(dst, uri, esc)
	q := strings.IndexAny(uri, "?#")
	if q < 0 {
		return esc(dst, uri)
	}
	dst = esc(dst, uri[:q+1])
	return appendRedactedQuery(dst, uri[q+1:], esc)
}

// appendRedactedAuthority appends the scheme and authority of an
// absolute-form target through esc, its userinfo (up to the authority's
// last '@') replaced by REDACTED, and returns the rest of uri; a target
// without userinfo is left whole in rest. The authority is found as
// fasthttp finds it, for a request without a Host header too: after the
// first "//" with no '/' before it ("http://", a bare "//"), up to the
// first '/', '?' or '#'.
func appendRedactedAuthority(dst []byte, uri string, esc appendFunc) (_ []byte, rest string) {
	s := strings.Index(uri, "//")
	if s < 0 || strings.IndexByte(uri[:s], '/') >= 0 {
		return dst, uri
	}
	s += len("//")
	auth := uri[s:]
	if end := strings.IndexAny(auth, "/?#"); end >= 0 {
		auth = auth[:end]
	}
	at := strings.LastIndexByte(auth, '@')
	if at <= 0 { // none, or empty
		return dst, uri
	}
	dst = esc(dst, uri[:s])
	dst = append(dst, redacted...)
	return dst, uri[s+at:] // from the '@'
}

// appendRedactedQuery appends a query string (no leading "?") through esc
// with secret parameter values replaced by REDACTED. Parameters are split
// at '&', as fasthttp (and so the proxy's own token check) splits them, and
// also at ';', '#' and '?', where other parsers (a sandbox's framework, a
// page's script reading the fragment) may see a parameter begin. A secret
// value is redacted up to the next '&', all of what fasthttp reads as it.
func appendRedactedQuery(dst []byte, query string, esc appendFunc) []byte {
	for query != "" {
		end := strings.IndexAny(query, "=&;#?")
		if end < 0 {
			return esc(dst, query)
		}
		if query[end] != '=' || !isRedactedKey(query[:end]) {
			dst = esc(dst, query[:end+1])
			query = query[end+1:]
			continue
		}
		dst = esc(dst, query[:end+1])
		dst = append(dst, redacted...)
		amp := strings.IndexByte(query[end:], '&')
		if amp < 0 {
			return dst
		}
		query = query[end+amp:]
	}
	return dst
}

// isRedactedKey matches key against redactedParams after percent-decoding
// and ASCII case folding, so "cube%5Ftoken" or "CUBE_TOKEN" cannot smuggle a
// token past the redaction.
func isRedactedKey(key string) bool {
	for _, name := range redactedParams {
		if decodedEqualFold(key, name) {
			return true
		}
	}
	return false
}

func decodedEqualFold(enc, want string) bool {
	j := 0
	for i := 0; i < len(enc); i++ {
		c := enc[i]
		if c == '%' && i+2 < len(enc) && isHex(enc[i+1]) && isHex(enc[i+2]) {
			c = unhex(enc[i+1])<<4 | unhex(enc[i+2])
			i += 2
		}
		if j >= len(want) || lower(c) != want[j] {
			return false
		}
		j++
	}
	return j == len(want)
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
	}
	return c - 'a' + 10
}

func lower(c byte) byte {
	if 'A' <= c && c <= 'Z' {
		return c + 'a' - 'A'
	}
	return c
}
