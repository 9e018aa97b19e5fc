package auth

import (
	"crypto/sha256"
	"crypto/subtle"
)

// HeaderAdminToken carries the admin API credential.
const HeaderAdminToken = "X-Cube-Admin-Token"

// AdminAuthorized reports whether the presented admin token equals the
// configured one. An empty configured token never matches anything (the
// proxy applies the loopback-only rule for that case). Both values are
// hashed first so the constant-time compare always runs over 32 bytes: not
// even the configured token's length shows in the timing.
func AdminAuthorized(configured, presented []byte) bool {
	if len(configured) == 0 {
		return false
	}
	c := sha256.Sum256(configured)
	p := sha256.Sum256(presented)
	return subtle.ConstantTimeCompare(c[:], p[:]) == 1
}
