package auth

import (
	"errors"
	"strings"
	"testing"
	"time"
)

// FuzzVerifyCookie feeds any cookie value (a client's Cookie header is
// untrusted) to VerifyCookie: a *Rejection or acceptance, never a panic,
// and an accepted value is exactly the one CookieValue makes for its token
// and the route's traffic token (one spelling, bound to that token). And
// the cookie CookieValue makes for the fuzzed target verifies, under that
// traffic token only.
func FuzzVerifyCookie(f *testing.F) {
	s := mustSigner(f, key1, key2)
	const traffic = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	tok := mustSign(f, s, "sbx-1", 8080, testNow.Add(time.Minute))
	good := s.CookieValue([]byte(tok), traffic)
	f.Add(good, "sbx-1", uint16(8080), traffic)
	f.Add(good, "sbx-1", uint16(8080), "")
	f.Add(good+"A", "sbx-1", uint16(8080), traffic)
	f.Add(tok+".", "sbx-1", uint16(8080), traffic)
	f.Add(strings.Replace(good, ".", "..", 1), "sbx-1", uint16(8080), traffic)
	f.Add("", "", uint16(0), "")
	f.Fuzz(func(t *testing.T, value, id string, port uint16, trafficToken string) {
		// The other side: the cookie made for the fuzzed target and
		// traffic token verifies, and stops verifying once the route's
		// traffic token changes.
		if id != "" && len(id) <= MaxSandboxIDLen && port != 0 {
			own := s.CookieValue([]byte(mustSign(t, s, id, port, testNow.Add(time.Hour))), trafficToken)
			if _, err := s.VerifyCookie([]byte(own), id, port, trafficToken, testNow); err != nil {
				t.Fatalf("own cookie for %q port %d traffic %q: %v", id, port, trafficToken, err)
			}
			if _, err := s.VerifyCookie([]byte(own), id, port, trafficToken+"x", testNow); !isRejection(err, CodeSignedTokenInvalid) {
				t.Fatalf("cookie for traffic %q verified under %q: %v", trafficToken, trafficToken+"x", err)
			}
		}
		_, err := s.VerifyCookie([]byte(value), id, port, trafficToken, testNow)
		if err != nil {
			var r *Rejection
			if !errors.As(err, &r) || !strings.HasPrefix(r.Code, "signed_token_") {
				t.Fatalf("unexpected error %v", err)
			}
			return
		}
		token, _, _ := strings.Cut(value, ".")
		if _, err := s.Verify(token, id, port, testNow); err != nil {
			t.Fatalf("cookie %q accepted, its token %q is not: %v", value, token, err)
		}
		if want := s.CookieValue([]byte(token), trafficToken); value != want {
			t.Fatalf("cookie %q accepted; the value made for its token is %q", value, want)
		}
	})
}
