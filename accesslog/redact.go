package accesslog

import "strings"

// redactedParams are query parameters whose values never reach a log: the
// signed browser token.
var redactedParams = [...]string{"cube_token"}

const redacted = "REDACTED"

// appendFunc appends an escaped copy of s to dst.
type appendFunc func(dst []byte, s string) []byte

// appendRedactedURI appends uri through esc with secret query values
// replaced by REDACTED.
func appendRedactedURI(dst []byte, uri string, esc appendFunc) []byte {
	q := strings.IndexByte(uri, '?')
	if q < 0 {
		return esc(dst, uri)
	}
	dst = esc(dst, uri[:q+1])
	return appendRedactedQuery(dst, uri[q+1:], esc)
}

// appendRedactedQuery appends a query string (no leading "?") through esc
// with secret parameter values replaced by REDACTED.
func appendRedactedQuery(dst []byte, query string, esc appendFunc) []byte {
	for query != "" {
		param := query
		query = ""
		if amp := strings.IndexByte(param, '&'); amp >= 0 {
			param, query = param[:amp+1], param[amp+1:]
		}
		eq := strings.IndexByte(param, '=')
		if eq < 0 || !isRedactedKey(param[:eq]) {
			dst = esc(dst, param)
			continue
		}
		dst = esc(dst, param[:eq+1])
		dst = append(dst, redacted...)
		if strings.HasSuffix(param, "&") {
			dst = append(dst, '&')
		}
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
