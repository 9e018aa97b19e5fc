// Package auth holds the proxy's credential checks as pure functions over
// request headers and route data: the per-sandbox traffic token, signed
// browser tokens (and the cookie they are traded for), and the admin token.
// It does no I/O and never logs; token values never appear in its errors.
package auth

// Rejection codes. The proxy answers every Rejection with 403 and puts the
// code in the JSON body; the codes are stable API.
const (
	// CodeTrafficTokenMissing: restricted route, no token header (or an empty one).
	CodeTrafficTokenMissing = "traffic_token_missing"
	// CodeTrafficTokenInvalid: restricted route, token header present but wrong.
	CodeTrafficTokenInvalid = "traffic_token_invalid"
	// CodeTrafficTokenNotConfigured: restricted route with no stored token (a data error).
	CodeTrafficTokenNotConfigured = "traffic_token_not_configured"
	// CodeSignedTokenMalformed: the signed token cannot be decoded.
	CodeSignedTokenMalformed = "signed_token_malformed"
	// CodeSignedTokenInvalid: the signed token's MAC matches none of the keys.
	CodeSignedTokenInvalid = "signed_token_invalid"
	// CodeSignedTokenWrongTarget: an authentic signed token for another sandbox or port.
	CodeSignedTokenWrongTarget = "signed_token_wrong_target"
	// CodeSignedTokenExpired: an authentic signed token past its expiry.
	CodeSignedTokenExpired = "signed_token_expired"
	// CodeSignedCookieForeignOrigin: an authentic cookie on a request whose
	// Origin (or, for a subresource, Referer) is another sandbox or site
	// (see CookieRequestAllowed).
	CodeSignedCookieForeignOrigin = "signed_cookie_foreign_origin"
)

// Rejection is a refused credential; callers match it with errors.As and map
// it to 403 with Code in the body. Reason is safe to show and to log: it
// never contains a token value.
type Rejection struct {
	Code   string // machine-readable, e.g. "invalid_token"
	Reason string // one sentence for a person
}

// Error returns the reason followed by the code.
func (r *Rejection) Error() string { return r.Reason + " (" + r.Code + ")" }

// Every refusal is one of these, shared: a refusal is what a client
// without a credential (or with a forged one) can make the proxy answer
// at will, and a new Rejection per request gave each a 32-byte allocation
// for the garbage collector. Callers must not modify them.
var (
	rejTrafficNotConfigured = &Rejection{CodeTrafficTokenNotConfigured, "sandbox is restricted but has no traffic access token configured"}
	rejTrafficMissing       = &Rejection{CodeTrafficTokenMissing, "traffic access token required"}
	rejTrafficInvalid       = &Rejection{CodeTrafficTokenInvalid, "traffic access token invalid"}
	rejTokenMalformed       = &Rejection{CodeSignedTokenMalformed, "signed token malformed"}
	rejTokenInvalid         = &Rejection{CodeSignedTokenInvalid, "signed token signature invalid"}
	rejTokenWrongTarget     = &Rejection{CodeSignedTokenWrongTarget, "signed token issued for another sandbox or port"}
	rejTokenExpired         = &Rejection{CodeSignedTokenExpired, "signed token expired"}
	rejCookieMalformed      = &Rejection{CodeSignedTokenMalformed, "sandbox cookie malformed"}
	rejCookieRebound        = &Rejection{CodeSignedTokenInvalid, "sandbox cookie was issued under another traffic access token (rotated?): open a new link"}
)
