package config

import (
	"io"
	"strings"
	"testing"
)

// An unknown flag's error names the flag most likely meant, for the YAML
// key's spelling with a typo on top and for an upper-case spelling (an
// environment variable's name copied), and names none when no flag is
// close: a far-fetched hint would send the operator after the wrong flag.
func TestUnknownFlagHint(t *testing.T) {
	for _, tc := range []struct {
		name, flag, hint string // hint "" = none
	}{
		{"key spelling and a typo", "--tls_acme_emial=a@b.test", "--tls-acme-email"},
		{"upper case", "--HTTP_ADDR=:1", "--http-addr"},
		{"close to none", "--nope", ""},
		{"far from any", "--frobnicate-the-widgets", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Load([]string{tc.flag}, env(nil), io.Discard)
			if err == nil || !strings.Contains(err.Error(), "flag provided but not defined") {
				t.Fatalf("error %v, want an unknown flag's", err)
			}
			_, got, _ := strings.Cut(err.Error(), "(did you mean ")
			if want := tc.hint + "?)"; tc.hint == "" && got != "" || tc.hint != "" && got != want {
				t.Errorf("error %q, want the hint %q", err, tc.hint)
			}
		})
	}
}
