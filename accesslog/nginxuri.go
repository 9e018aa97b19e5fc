package accesslog

import (
	"bytes"
	"strings"
)

// appendNginxURI appends path as nginx's $uri holds it
// (ngx_http_parse_complex_uri with merge_slashes on, nginx's default and
// the platform's): percent escapes decoded, then runs of '/' merged and
// "." and ".." segments resolved, a decoded "%2F" or "%2E" taking part like
// a sent one ("/a/%2E%2E/b" is "/b"), measured with nginx 1.22.1. ok is
// false, and buf returned as it was, for what nginx refuses with a 400 (a
// bad escape, "%00", a ".." above the root) or does not parse so (no
// leading '/'): the caller logs that as sent.
func appendNginxURI(buf []byte, path string) (_ []byte, ok bool) {
	if len(path) == 0 || path[0] != '/' {
		return buf, false
	}
	// Decode into buf.
	dec := buf
	for i := 0; i < len(path); i++ {
		c := path[i]
		if c == '%' {
			if i+2 >= len(path) {
				return buf, false
			}
			if !isHex(path[i+1]) || !isHex(path[i+2]) {
				return buf, false
			}
			if c = unhex(path[i+1])<<4 | unhex(path[i+2]); c == 0 {
				return buf, false
			}
			i += 2
		}
		dec = append(dec, c)
	}
	// Resolve segments in place: out never outgrows what was read.
	start := len(buf)
	out := dec[:start]
	rest := dec[start:]
	for len(rest) > 0 {
		rest = rest[1:] // the '/'
		seg := rest
		if i := bytes.IndexByte(rest, '/'); i >= 0 {
			seg, rest = rest[:i], rest[i:]
		} else {
			rest = rest[len(rest):]
		}
		last := len(rest) == 0
		switch string(seg) {
		case "":
			if last {
				out = append(out, '/')
			}
		case ".":
			if last {
				out = append(out, '/')
			}
		case "..":
			i := len(out) - 1
			for i >= start && out[i] != '/' {
				i--
			}
			if i < start {
				return buf, false // above the root
			}
			out = out[:i]
			if last {
				out = append(out, '/')
			}
		default:
			out = append(out, '/')
			out = append(out, seg...)
		}
	}
	if len(out) == start {
		out = append(out, '/')
	}
	return out, true
}

// nginxURIChanges reports whether nginx's $uri of path can differ from it:
// most paths have no escape, "//" or dot segment, and are logged as sent.
func nginxURIChanges(path string) bool {
	return strings.IndexByte(path, '%') >= 0 || strings.Contains(path, "//") || strings.Contains(path, "/.")
}
