package auth

import (
	"strings"
	"testing"
	"time"
)

// A cookie is bound to the route's traffic token: when the platform rotates
// the token (to cut off whoever holds the old one), every browser session
// made before ends, while a cookie for the current token keeps working.
func TestCookieBinding(t *testing.T) {
	const traffic = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
	const rotated = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"
	old, rotating, newOnly := mustSigner(t, key1), mustSigner(t, key2, key1), mustSigner(t, key2)
	exp := testNow.Add(time.Hour)
	tok := mustSign(t, old, "sbx", 8080, exp)
	cookie := old.CookieValue([]byte(tok), traffic)
	if !strings.HasPrefix(cookie, tok+".") {
		t.Fatalf("cookie value %q does not carry the token", cookie)
	}
	flip := func(s string, i int) string {
		b := []byte(s)
		if b[i] = 'A'; s[i] == 'A' {
			b[i] = 'B'
		}
		return string(b)
	}
	tests := []struct {
		name    string
		signer  *Signer
		value   string
		traffic string
		id      string
		port    uint16
		now     time.Time
		want    string
	}{
		{"valid", old, cookie, traffic, "sbx", 8080, testNow, ""},
		{"key rotation: old key still listed", rotating, cookie, traffic, "sbx", 8080, testNow, ""},
		{"traffic token rotated", old, cookie, rotated, "sbx", 8080, testNow, CodeSignedTokenInvalid},
		{"traffic token removed", old, cookie, "", "sbx", 8080, testNow, CodeSignedTokenInvalid},
		{"bare token (no binding)", old, tok, traffic, "sbx", 8080, testNow, CodeSignedTokenMalformed},
		{"binding tampered", old, flip(cookie, len(cookie)-5), traffic, "sbx", 8080, testNow, CodeSignedTokenInvalid},
		{"binding not canonical", old, cookie[:len(cookie)-1] + "_", traffic, "sbx", 8080, testNow, CodeSignedTokenMalformed},
		{"binding cut", old, cookie[:len(cookie)-1], traffic, "sbx", 8080, testNow, CodeSignedTokenMalformed},
		{"binding only", old, cookie[len(tok):], traffic, "sbx", 8080, testNow, CodeSignedTokenMalformed},
		{"token tampered", old, flip(cookie, 4), traffic, "sbx", 8080, testNow, CodeSignedTokenInvalid},
		{"expired", old, cookie, traffic, "sbx", 8080, exp, CodeSignedTokenExpired},
		{"another port", old, cookie, traffic, "sbx", 9090, testNow, CodeSignedTokenWrongTarget},
		{"another sandbox", old, cookie, traffic, "sbx2", 8080, testNow, CodeSignedTokenWrongTarget},
		{"signing key removed", newOnly, cookie, traffic, "sbx", 8080, testNow, CodeSignedTokenInvalid},
		{"empty", old, "", traffic, "sbx", 8080, testNow, CodeSignedTokenMalformed},
		{"dots only", old, strings.Repeat(".", 40), traffic, "sbx", 8080, testNow, CodeSignedTokenMalformed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := tt.signer.VerifyCookie([]byte(tt.value), tt.id, tt.port, tt.traffic, tt.now)
			assertRejection(t, err, tt.want)
			if err == nil && !got.Equal(time.Unix(exp.Unix(), 0)) {
				t.Errorf("expiry %v, want the token's %v", got, exp)
			}
			if err != nil && strings.Contains(err.Error(), tt.traffic) && tt.traffic != "" {
				t.Errorf("error %q shows the traffic token", err)
			}
		})
	}
	// A binding made by the new first key verifies where that key is listed.
	if _, err := newOnly.VerifyCookie([]byte(rotating.CookieValue([]byte(tok), traffic)), "sbx", 8080, traffic, testNow); err == nil {
		t.Error("a cookie whose token the signer cannot verify was accepted")
	}
	newTok := mustSign(t, rotating, "sbx", 8080, exp)
	if _, err := newOnly.VerifyCookie([]byte(rotating.CookieValue([]byte(newTok), traffic)), "sbx", 8080, traffic, testNow); err != nil {
		t.Errorf("cookie made by the first key, verified by it: %v", err)
	}
}

func TestVerifyCookieAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector makes sync.Pool drop items at random; allocations are checked by the run without -race")
	}
	const traffic = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	s := mustSigner(t, key2, key1)
	v := []byte(s.CookieValue([]byte(mustSign(t, s, "sbx-1", 8080, testNow.Add(time.Minute))), traffic))
	allocs := testing.AllocsPerRun(1000, func() {
		if _, err := s.VerifyCookie(v, "sbx-1", 8080, traffic, testNow); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Fatalf("%v allocations verifying a valid cookie, want 0", allocs)
	}
}

// The binding MAC length-prefixes the traffic token, so moving bytes
// between it and the signed token never yields the same MAC input: without
// the prefix, traffic "ab" with token "c…" would hash like "a" with "bc…".
func TestCookieBindingLengthPrefixed(t *testing.T) {
	s := mustSigner(t, key1)
	m := s.pool.Get().(*macScratch)
	defer s.pool.Put(m)
	a := string(s.binding(m, m.hashes[0], []byte("cdef"), "ab"))
	b := string(s.binding(m, m.hashes[0], []byte("bcdef"), "a"))
	if a == b {
		t.Error("binding(traffic \"ab\", token \"cdef\") equals binding(\"a\", \"bcdef\"): the traffic token is not length-prefixed")
	}
}
