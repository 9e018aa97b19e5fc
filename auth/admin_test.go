package auth

import "testing"

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
