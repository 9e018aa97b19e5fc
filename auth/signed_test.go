package auth

import (
	"encoding/base64"
	"errors"
	"net/url"
	"strings"
	"testing"
	"time"
)

const (
	key1 = "k1-0123456789abcdef0123456789abcdef"
	key2 = "k2-0123456789abcdef0123456789abcdef"
)

var testNow = time.Unix(1_800_000_000, 250_000_000)

func mustSigner(t testing.TB, keys ...string) *Signer {
	t.Helper()
	s, err := NewSigner(keys)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func mustSign(t testing.TB, s *Signer, id string, port uint16, exp time.Time) string {
	t.Helper()
	tok, err := s.Sign(id, port, exp)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// reencode decodes a token, lets mutate change the raw bytes, and encodes it again.
func reencode(t *testing.T, tok string, mutate func([]byte)) string {
	t.Helper()
	raw, err := base64.RawURLEncoding.DecodeString(tok)
	if err != nil {
		t.Fatal(err)
	}
	mutate(raw)
	return base64.RawURLEncoding.EncodeToString(raw)
}

func TestSignedToken(t *testing.T) {
	s := mustSigner(t, key1)
	exp := testNow.Add(10 * time.Minute)
	tok := mustSign(t, s, "sbx-1", 8080, exp)
	if url.QueryEscape(tok) != tok {
		t.Fatalf("token %q is not URL-safe", tok)
	}

	tests := []struct {
		name  string
		token string
		id    string
		port  uint16
		now   time.Time
		want  string
	}{
		{"happy path", tok, "sbx-1", 8080, testNow, ""},
		{"last valid second", tok, "sbx-1", 8080, exp.Add(-time.Second), ""},
		{"expired at expiry", tok, "sbx-1", 8080, exp, CodeSignedTokenExpired},
		{"expired later", tok, "sbx-1", 8080, exp.Add(time.Hour), CodeSignedTokenExpired},
		{"another sandbox", tok, "sbx-2", 8080, testNow, CodeSignedTokenWrongTarget},
		{"sandbox id prefix", tok, "sbx-", 8080, testNow, CodeSignedTokenWrongTarget},
		{"another port", tok, "sbx-1", 8081, testNow, CodeSignedTokenWrongTarget},
		{"tampered signature", reencode(t, tok, func(b []byte) { b[len(b)-1] ^= 1 }), "sbx-1", 8080, testNow, CodeSignedTokenInvalid},
		{"tampered expiry", reencode(t, tok, func(b []byte) { b[8]++ }), "sbx-1", 8080, testNow, CodeSignedTokenInvalid},
		{"tampered port", reencode(t, tok, func(b []byte) { b[10] ^= 1 }), "sbx-1", 8081, testNow, CodeSignedTokenInvalid},
		{"tampered sandbox", reencode(t, tok, func(b []byte) { b[headerLen+4] = '2' }), "sbx-2", 8080, testNow, CodeSignedTokenInvalid},
		{"unknown version", reencode(t, tok, func(b []byte) { b[0] = 2 }), "sbx-1", 8080, testNow, CodeSignedTokenMalformed},
		{"truncated", tok[:len(tok)-4], "sbx-1", 8080, testNow, CodeSignedTokenInvalid},
		{"empty", "", "sbx-1", 8080, testNow, CodeSignedTokenMalformed},
		{"not base64", "!!!!", "sbx-1", 8080, testNow, CodeSignedTokenMalformed},
		{"too short", "AQID", "sbx-1", 8080, testNow, CodeSignedTokenMalformed},
		{"padding", tok + "==", "sbx-1", 8080, testNow, CodeSignedTokenMalformed},
		{"newline the decoder would skip", tok[:10] + "\n" + tok[10:], "sbx-1", 8080, testNow, CodeSignedTokenMalformed},
		{"standard alphabet", strings.NewReplacer("-", "+", "_", "/").Replace(tok) + "+", "sbx-1", 8080, testNow, CodeSignedTokenMalformed},
		{"impossible length", tok + "A", "sbx-1", 8080, testNow, CodeSignedTokenMalformed},
		{"huge", strings.Repeat("A", 100000), "sbx-1", 8080, testNow, CodeSignedTokenMalformed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := s.Verify(tt.token, tt.id, tt.port, tt.now)
			assertRejection(t, err, tt.want)
			if tt.want == "" && !got.Equal(time.Unix(exp.Unix(), 0)) {
				t.Fatalf("expiry = %v, want %v", got, exp.Truncate(time.Second))
			}
			gotB, errB := s.VerifyBytes([]byte(tt.token), tt.id, tt.port, tt.now)
			if !gotB.Equal(got) || (err == nil) != (errB == nil) {
				t.Fatalf("VerifyBytes disagrees with Verify: %v %v / %v %v", gotB, errB, got, err)
			}
		})
	}
}

// TestSignedTokenNonCanonical: base64 bits past the last byte must be zero,
// so each token has exactly one accepted spelling.
func TestSignedTokenNonCanonical(t *testing.T) {
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
	s := mustSigner(t, key1)
	// Ids of 3 and 4 bytes give 62- and 63-character tokens, whose last
	// character carries unused low bits.
	for _, sid := range []string{"sbx", "sbxx"} {
		tok := mustSign(t, s, sid, 80, testNow.Add(time.Minute))
		last := strings.IndexByte(alphabet, tok[len(tok)-1])
		if len(tok)%4 == 0 || last&1 != 0 {
			t.Fatalf("token length %d / last char %q: test premise broken", len(tok), tok[len(tok)-1])
		}
		mangled := tok[:len(tok)-1] + string(alphabet[last|1])
		_, err := s.Verify(mangled, sid, 80, testNow)
		assertRejection(t, err, CodeSignedTokenMalformed)
	}
}

func TestSignedTokenKeyRotation(t *testing.T) {
	exp := testNow.Add(time.Hour)
	old := mustSigner(t, key1)
	rotating := mustSigner(t, key2, key1)
	rotated := mustSigner(t, key2)
	staged := mustSigner(t, key1, key2)

	oldTok := mustSign(t, old, "sbx", 443, exp)
	newTok := mustSign(t, rotating, "sbx", 443, exp)
	stagedTok := mustSign(t, staged, "sbx", 443, exp)
	if oldTok == newTok {
		t.Fatal("the first key must sign")
	}
	tests := []struct {
		name   string
		signer *Signer
		token  string
		want   string
	}{
		{"old token, old key still listed", rotating, oldTok, ""},
		{"new token, rotating signer", rotating, newTok, ""},
		{"new token, rotated signer", rotated, newTok, ""},
		{"old token, old key removed", rotated, oldTok, CodeSignedTokenInvalid},
		{"new token, old-only signer", old, newTok, CodeSignedTokenInvalid},
		// The README's fleet rotation: the new key is added second on
		// every instance first, so what any of them signs meanwhile is
		// accepted by all, updated or not.
		{"staged signer's token, old-only signer", old, stagedTok, ""},
		{"staged signer's token, rotating signer", rotating, stagedTok, ""},
		{"new token, staged signer", staged, newTok, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := tt.signer.Verify(tt.token, "sbx", 443, testNow)
			assertRejection(t, err, tt.want)
		})
	}
}

func TestNewSigner(t *testing.T) {
	short := strings.Repeat("s", MinKeyLen-1)
	tests := []struct {
		name string
		keys []string
		ok   bool
	}{
		{"none", nil, false},
		{"empty key", []string{""}, false},
		{"short key", []string{short}, false},
		{"short old key", []string{key1, short}, false},
		{"minimum length", []string{strings.Repeat("m", MinKeyLen)}, true},
		{"two keys", []string{key1, key2}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := NewSigner(tt.keys)
			if (err == nil) != tt.ok {
				t.Fatalf("err = %v, want ok=%v", err, tt.ok)
			}
			if err != nil && strings.Contains(err.Error(), short) {
				t.Fatalf("error %q contains the key", err)
			}
		})
	}
}

func TestSignInput(t *testing.T) {
	s := mustSigner(t, key1)
	longest := strings.Repeat("a", MaxSandboxIDLen)
	tests := []struct {
		name string
		id   string
		port uint16
		ok   bool
	}{
		{"ok", "sbx", 1, true},
		{"longest id", longest, 65535, true},
		{"empty id", "", 80, false},
		{"id too long", longest + "a", 80, false},
		{"port zero", "sbx", 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tok, err := s.Sign(tt.id, tt.port, testNow.Add(time.Minute))
			if (err == nil) != tt.ok {
				t.Fatalf("err = %v, want ok=%v", err, tt.ok)
			}
			if err == nil {
				if _, err := s.Verify(tok, tt.id, tt.port, testNow); err != nil {
					t.Fatalf("own token rejected: %v", err)
				}
			}
		})
	}
}

func TestVerifyAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector makes sync.Pool drop items at random; allocations are checked by the run without -race")
	}
	s := mustSigner(t, key2, key1)
	tok := []byte(mustSign(t, mustSigner(t, key1), "sbx-1", 8080, testNow.Add(time.Minute)))
	tokS := string(tok)
	allocs := testing.AllocsPerRun(1000, func() {
		if _, err := s.VerifyBytes(tok, "sbx-1", 8080, testNow); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Verify(tokS, "sbx-1", 8080, testNow); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Fatalf("%v allocations verifying a valid token, want 0", allocs)
	}
}

func TestVerifyConcurrent(t *testing.T) {
	s := mustSigner(t, key1, key2)
	tok := mustSign(t, s, "sbx", 80, testNow.Add(time.Minute))
	done := make(chan error)
	for range 8 {
		go func() {
			var err error
			for range 200 {
				if _, err = s.Verify(tok, "sbx", 80, testNow); err != nil {
					break
				}
				if _, err = s.Sign("sbx", 80, testNow); err != nil {
					break
				}
			}
			done <- err
		}()
	}
	for range 8 {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
}

// FuzzVerify feeds any token (a query parameter is untrusted) to Verify: a
// *Rejection or acceptance, and an accepted token is the one the signer
// issues for its claims. The other side, for the fuzzed target: the
// signer's own token verifies until its expiry, and for no other port.
func FuzzVerify(f *testing.F) {
	s := mustSigner(f, key1, key2)
	f.Add(mustSign(f, s, "sbx-1", 8080, testNow.Add(time.Minute)), "sbx-1", uint16(8080))
	f.Add(mustSign(f, s, strings.Repeat("z", MaxSandboxIDLen), 1, testNow.Add(-time.Minute)), "x", uint16(1))
	f.Add("", "", uint16(0))
	f.Add("AQ", "a", uint16(1))
	f.Add("AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA", "a", uint16(2))
	f.Fuzz(func(t *testing.T, token, id string, port uint16) {
		if id != "" && len(id) <= MaxSandboxIDLen && port != 0 {
			until := testNow.Add(time.Hour)
			own := mustSign(t, s, id, port, until)
			if exp, err := s.Verify(own, id, port, testNow); err != nil || exp.Unix() != until.Unix() {
				t.Fatalf("own token for %q port %d: %v, %v", id, port, exp, err)
			}
			if _, err := s.Verify(own, id, port, until); !isRejection(err, CodeSignedTokenExpired) {
				t.Fatalf("own token for %q port %d at its expiry: %v", id, port, err)
			}
			if _, err := s.Verify(own, id, port^1, testNow); !isRejection(err, CodeSignedTokenWrongTarget) {
				t.Fatalf("token for %q port %d verified for port %d: %v", id, port, port^1, err)
			}
		}
		exp, err := s.Verify(token, id, port, testNow)
		if err != nil {
			var r *Rejection
			if !errors.As(err, &r) || !strings.HasPrefix(r.Code, "signed_token_") {
				t.Fatalf("unexpected error %v", err)
			}
			return
		}
		// Only a token this signer issued verifies, and it has one spelling.
		again := mustSign(t, s, id, port, exp)
		if again != token {
			t.Fatalf("verified %q but signing its claims gives %q", token, again)
		}
	})
}

func TestMaxTokenLen(t *testing.T) {
	if want := base64.RawURLEncoding.EncodedLen(maxRawLen); maxTokenLen != want {
		t.Fatalf("maxTokenLen = %d, want %d", maxTokenLen, want)
	}
}

// isRejection reports whether err is a *Rejection with code.
func isRejection(err error, code string) bool {
	var r *Rejection
	return errors.As(err, &r) && r.Code == code
}
