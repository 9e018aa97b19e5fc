package auth

import (
	"strings"
	"testing"
)

func TestAdminAuthorized(t *testing.T) {
	const tok = "admin-secret-token-value"
	tests := []struct {
		name                  string
		configured, presented string
		want                  bool
	}{
		{"match", tok, tok, true},
		{"wrong", tok, "admin-secret-token-valuX", false},
		{"prefix", tok, tok[:10], false},
		{"longer", tok, tok + "x", false},
		{"missing", tok, "", false},
		{"case differs", tok, "ADMIN-secret-token-value", false},
		{"nothing configured, nothing presented", "", "", false},
		{"nothing configured, something presented", "", tok, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := AdminAuthorized([]byte(tt.configured), []byte(tt.presented)); got != tt.want {
				t.Fatalf("AdminAuthorized = %v, want %v", got, tt.want)
			}
		})
	}
	if AdminAuthorized(nil, nil) {
		t.Fatal("nil configured token matched")
	}
}

// A configured token that no HTTP header can carry would make every admin
// request a 403: clients strip a header value's surrounding whitespace,
// and cannot send control characters (a secret file's trailing newline
// ends up in the environment variable).
func TestCheckAdminToken(t *testing.T) {
	for _, tc := range []struct {
		token string
		ok    bool
		want  string // in the refusal
	}{
		{"", true, ""}, // no token: loopback only
		{"s3cret-token", true, ""},
		{"with inner space", true, ""},
		{"ünïcode", true, ""},
		{"nbsp\u00a0", true, ""}, // not HTTP whitespace: sent as is
		{"s3cret\n", false, "control character"},
		{"s3cret\r\n", false, "control character"},
		{" s3cret", false, "whitespace"},
		{"s3cret\t", false, "whitespace"},
		{"s3\x00cret", false, "control character"},
		{"s3\x7fcret", false, "control character"},
		{" ", false, "whitespace"},
		// A header may carry an inner tab; the refusal must not say otherwise.
		{"s3\tcret", false, "a tab (at byte 2)"},
	} {
		err := CheckAdminToken(tc.token)
		if (err == nil) != tc.ok || err != nil && !strings.Contains(err.Error(), tc.want) {
			t.Errorf("CheckAdminToken(%q) = %v, want ok %v and %q", tc.token, err, tc.ok, tc.want)
		}
	}
}
