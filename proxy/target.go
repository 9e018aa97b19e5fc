package proxy

import (
	"bytes"

	"github.com/cube-sandbox/cubeproxy/routing"
	"github.com/valyala/fasthttp"
)

// errBadVersion answers a request line whose version is no HTTP/1.x.
var errBadVersion = proxyError{status: 505, code: CodeBadVersion, msg: "HTTP version not supported: use HTTP/1.1"}

// errConnect answers a CONNECT.
var errConnect = proxyError{status: 405, code: CodeBadMethod, msg: "CONNECT is not supported: this is a reverse proxy"}

// refusedRequestLine is the answer to a request line refused on its
// method or version alone, or nil. The HTTPS (and plain) listener and
// the redirect listener both ask it, as nginx refuses these on any
// server: redirected, the client came back only to be refused. A 505
// must close the connection (after fail: writeError resets the response).
func refusedRequestLine(h *fasthttp.RequestHeader) *proxyError {
	switch {
	case !h.IsHTTP11() && string(h.Protocol()) != "HTTP/1.0":
		// fasthttp accepts any version string; the sandbox must not get
		// one it cannot have been sent ("HTTP/9.9", "HTTP/0.9", "HTTP/2.0").
		return &errBadVersion
	case h.IsConnect():
		// A forward proxy's method: relayed, the sandbox's server would
		// get an authority-form target it never serves, and a 200 from
		// it would read as a tunnel that never opens. nginx answers 405
		// too.
		return &errConnect
	}
	return nil
}

// errAboveRoot answers a target that climbsAboveRoot.
var errAboveRoot = proxyError{status: 400, code: CodeBadRequest, msg: "request target climbs above the root (..)"}

// errEscapedNUL answers a target whose path escapesNUL.
var errEscapedNUL = proxyError{status: 400, code: CodeBadRequest, msg: "request target holds %00 in its path"}

// refusedTarget is the answer to a request target that nginx refuses
// before routing, as the platform's proxy refused it, or nil: a path that
// climbsAboveRoot or escapesNUL.
func refusedTarget(uri []byte) *proxyError {
	switch {
	case climbsAboveRoot(uri):
		return &errAboveRoot
	case escapesNUL(uri):
		return &errEscapedNUL
	}
	return nil
}

// escapesNUL reports whether the path of the request target uri holds
// "%00", an escaped NUL: nginx's URI parser refuses to decode one (400),
// so no sandbox behind the platform's proxy got one, and a server that
// decodes the path and hands it to a C string API (a file name) would read
// it cut short. The query is not decoded by nginx and not looked at here
// (the first "?" or "#" ends the path); one in an absolute-form target's
// authority is refused too, as no host name holds it. Vectorised scans
// only: 3 ns on a short target without a "%" (BenchmarkTargetChecks).
func escapesNUL(uri []byte) bool {
	p := bytes.IndexByte(uri, '%')
	if p < 0 {
		return false // most targets: one IndexByte, cheaper than Index
	}
	i := bytes.Index(uri[p:], []byte("%00"))
	return i >= 0 && !bytes.ContainsAny(uri[:p+i], "?#")
}

// climbsAboveRoot reports whether the path of the request target uri has a
// ".." segment with no segment before it left to remove: one that climbs
// above the root. nginx refuses such a target with 400 (and so did the
// platform's proxy), so a sandbox's server never had to defend against it.
// It reads the path as nginx does before refusing it: "%2e" is a dot and
// "%2F" a slash (both in either case), empty segments ("//") are merged
// away, "." segments stay where they are; the query and a fragment are not
// looked at, and neither is a backslash (a separator only on Windows).
// The target is passed on unchanged when it stays inside the root: paths
// are not normalised. No allocation; a target with neither ".." nor "%"
// (most) is told by two vectorised scans.
func climbsAboveRoot(uri []byte) bool {
	if bytes.IndexByte(uri, '%') < 0 && !bytes.Contains(uri, []byte("..")) {
		// No ".." however spelled: the common target, told by two
		// vectorised scans rather than the walk below (8 KiB: 8 µs).
		return false
	}
	if len(uri) > 0 && uri[0] != '/' {
		// Absolute form: the path begins after the authority, which
		// ends at the first "/", "?" or "#": "http://h?x/../.." has an
		// empty path (nginx serves it). Anything else ("*") has no path.
		_, rest, ok := bytes.Cut(uri, []byte("://"))
		if !ok {
			return false
		}
		i := bytes.IndexAny(rest, "/?#")
		if i < 0 || rest[i] != '/' {
			return false
		}
		uri = rest[i:]
	}
	depth := 0
	for i := 0; i < len(uri); {
		switch c := uri[i]; {
		case c == '?' || c == '#':
			return false
		case c == '/':
			i++
			continue
		case escapedSlash(uri, i):
			i += 3
			continue
		}
		dots, other := 0, false
	segment:
		for i < len(uri) {
			switch c := uri[i]; {
			case c == '/' || c == '?' || c == '#' || escapedSlash(uri, i):
				break segment
			case c == '.':
				dots++
				i++
			case c == '%' && i+2 < len(uri) && uri[i+1] == '2' && uri[i+2]|0x20 == 'e':
				dots++
				i += 3
			default:
				other = true
				i++
			}
		}
		switch {
		case other || dots > 2:
			depth++
		case dots == 2:
			if depth == 0 {
				return true
			}
			depth--
		}
	}
	return false
}

// escapedSlash reports whether uri holds "%2F" (or "%2f") at i.
func escapedSlash(uri []byte, i int) bool {
	return uri[i] == '%' && i+2 < len(uri) && uri[i+1] == '2' && uri[i+2]|0x20 == 'f'
}

// acmeChallengePrefix begins the path a CA asks for in an HTTP-01
// challenge (RFC 8555 8.3), always at the root of the host.
const acmeChallengePrefix = "/.well-known/acme-challenge/"

// errACMEChallenge refuses an HTTP-01 challenge request for a sandbox's
// host name. Answered by the sandbox, it let any sandbox owner have a
// publicly trusted certificate issued for the platform's
// "<port>-<id>.<domain>" names (a CA follows the redirect listener's 308
// and does not check the certificate there), each spending the domain's
// CA rate limit (Let's Encrypt: 50 a week) that the proxy's own
// on-demand issuance needs. The proxy itself never uses HTTP-01
// (certs: TLS-ALPN-01 or DNS-01). 403, not 404: the path is refused by
// policy, not unknown, and a 404 would read as the sandbox_not_found or
// port_not_mapped of a route problem.
var errACMEChallenge = proxyError{status: 403, code: CodeACMEChallenge, msg: "ACME HTTP-01 challenges for sandbox host names are not forwarded"}

// acmeChallengeFor reports whether h is a GET or HEAD of an HTTP-01
// challenge path on a host that names the sandbox of t (not one routed by
// its path or by a shared host's headers, which no CA sends). The prefix
// is compared first: one comparison on the hot path, no allocation. An
// absolute-form target is not looked at: a CA sends the origin form.
func acmeChallengeFor(h *fasthttp.RequestHeader, t *routing.Target) bool {
	uri := h.RequestURI()
	if len(uri) < len(acmeChallengePrefix) || string(uri[:len(acmeChallengePrefix)]) != acmeChallengePrefix {
		return false
	}
	return (h.IsGet() || h.IsHead()) && t.PathPrefix == 0 && !t.Shared
}
