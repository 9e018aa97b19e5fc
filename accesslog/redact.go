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

// appendRedactedHost appends a Host through esc, its userinfo (up to its
// last '@') replaced by REDACTED, as an absolute-form target's is. The
// proxy refuses such a Host (400), but logs the line of the refusal: a
// client that copies a URL's authority into Host ("u:pw@3000-x.cube.app")
// sent a password there, a traffic token as often as not.
func appendRedactedHost(dst []byte, host string, esc appendFunc) []byte {
	if at := strings.LastIndexByte(host, '@'); at > 0 {
		dst = append(dst, redacted...)
		host = host[at:]
	}
	return esc(dst, host)
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

// isRedactedKey reports whether key is the name of a redacted parameter
// as a lenient parser may read it (readsAs), so that "cube%5Ftoken",
// "CUBE_TOKEN" or "cube_token+" cannot smuggle a token past the redaction.
func isRedactedKey(key string) bool {
	for _, name := range redactedParams {
		if readsAs(key, name) {
			return true
		}
	}
	return false
}

// readsAs reports whether the encoded parameter name enc reads as want (a
// lower-case name) to some parser a sandbox may run: percent-decoded with
// '+' as a space (form decoding), in any ASCII case, with ASCII whitespace
// around it (which parsers that trim drop, and PHP drops leading), ' ' or
// '.' where want has '_' (PHP files "cube token" and "cube.token" under
// cube_token), anything from a '[' after it (PHP, Rack and qs read
// "cube_token[]" and "cube_token[0]" as an array named cube_token), and
// anything from a NUL after it (PHP reads the decoded name as a C string,
// so "cube_token%00x" is its cube_token). Other names, "cube-token" or
// "cube_token_x", are no parser's cube_token.
func readsAs(enc, want string) bool {
	i := 0
	for i < len(enc) {
		c, next := decodedAt(enc, i)
		if !isSpace(c) {
			break
		}
		i = next
	}
	for j := 0; j < len(want); j++ {
		if i >= len(enc) {
			return false
		}
		c, next := decodedAt(enc, i)
		if lower(c) != want[j] && (want[j] != '_' || c != ' ' && c != '.') {
			return false
		}
		i = next
	}
	for i < len(enc) {
		c, next := decodedAt(enc, i)
		if c == '[' || c == 0 {
			return true
		}
		if !isSpace(c) {
			return false
		}
		i = next
	}
	return true
}

// decodedAt is the byte the encoded name enc holds at i, percent-decoded
// and with '+' as a space, and the index after its encoding.
func decodedAt(enc string, i int) (c byte, next int) {
	switch c = enc[i]; {
	case c == '%' && i+2 < len(enc) && isHex(enc[i+1]) && isHex(enc[i+2]):
		return unhex(enc[i+1])<<4 | unhex(enc[i+2]), i + 3
	case c == '+':
		return ' ', i + 1
	}
	return c, i + 1
}

// isSpace reports whether c is ASCII whitespace.
func isSpace(c byte) bool {
	return c == ' ' || '\t' <= c && c <= '\r'
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
