package auth

import (
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"strings"
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

// CheckAdminToken refuses a configured admin token that no request can
// present: HTTP clients and servers strip a header value's leading and
// trailing whitespace and cannot carry control characters, so such a
// token (typically a secret file's trailing newline) would answer every
// admin request 403. An empty token is fine (loopback only).
func CheckAdminToken(token string) error {
	if token == "" {
		return nil
	}
	// Only space and tab: HTTP's whitespace around a field value.
	if strings.Trim(token, " \t") != token {
		return errors.New("admin_token has leading or trailing whitespace, which no HTTP header can carry (a trailing newline from a secret file?): every admin request would be refused")
	}
	for i := 0; i < len(token); i++ {
		if token[i] == '\t' {
			// A header may carry an inner tab, but a tab in a token is
			// almost surely a paste or a file's formatting, and the
			// clients and tools an operator types it into may not keep it.
			return fmt.Errorf("admin_token has a tab (at byte %d): a token of printable characters is what every client sends unchanged", i)
		}
		if c := token[i]; c < ' ' || c == 0x7f {
			return fmt.Errorf("admin_token has a control character (at byte %d), which no HTTP header can carry: every admin request would be refused", i)
		}
	}
	return nil
}
