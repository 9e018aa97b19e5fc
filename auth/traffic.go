package auth

import "crypto/subtle"

// Names of the request headers that carry the traffic token. The E2B
// spelling wins when both are present.
const (
	HeaderE2BTrafficToken  = "e2b-traffic-access-token"
	HeaderCubeTrafficToken = "cube-traffic-access-token"
)

// HeaderPeeker reads one request header by name, case-insensitively;
// *fasthttp.RequestHeader satisfies it (as long as header-name normalizing is
// not disabled on the server).
type HeaderPeeker interface {
	Peek(key string) []byte
}

// CheckTraffic decides whether a request may reach a sandbox port. It returns
// nil when allowed and a *Rejection otherwise; it allocates nothing either
// way (the rejections are shared).
//
// Order: a public route is always allowed (any token sent is ignored). A
// restricted route without a stored token is refused even on an exempt port:
// that is corrupt route data and must never be served open. An exempt port is
// then allowed without a token. Otherwise the token is read from
// e2b-traffic-access-token, or from cube-traffic-access-token only when the
// first is absent or empty; an empty value counts as missing. The value is
// compared exactly: no trimming (the HTTP parser already drops the optional
// whitespace around a field value; anything left is part of the token).
func CheckTraffic(public bool, stored string, exempt bool, h HeaderPeeker) error {
	if public {
		return nil
	}
	if len(stored) == 0 {
		return rejTrafficNotConfigured
	}
	if exempt {
		return nil
	}
	presented := PresentedTrafficToken(h)
	if len(presented) == 0 {
		return rejTrafficMissing
	}
	if !trafficTokenEqual(stored, presented) {
		return rejTrafficInvalid
	}
	return nil
}

// PresentedTrafficToken returns the token the request carries (nil when it
// carries none), applying the same header precedence as CheckTraffic.
func PresentedTrafficToken(h HeaderPeeker) []byte {
	if v := h.Peek(HeaderE2BTrafficToken); len(v) > 0 {
		return v
	}
	return h.Peek(HeaderCubeTrafficToken)
}

// trafficTokenEqual compares in constant time. subtle.ConstantTimeCompare
// returns early only on a length mismatch, which depends on no byte of
// either value and reveals only the stored token's length (64 hex characters
// by contract, so nothing secret). The compiler converts stored without a
// copy because the compare only reads it (0 allocations, see the tests).
func trafficTokenEqual(stored string, presented []byte) bool {
	return subtle.ConstantTimeCompare([]byte(stored), presented) == 1
}

// SameTrafficToken reports whether two routes' stored traffic tokens are
// the same (both empty included), compared in constant time as a
// presented one is: a route change keeps what the old token opened only
// when the token did not change.
func SameTrafficToken(a, b string) bool {
	return subtle.ConstantTimeCompare([]byte(a), []byte(b)) == 1
}
