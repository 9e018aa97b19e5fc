package config

import (
	"io"
	"strings"
	"testing"
)

// An unknown flag's error names the flag most likely meant, for the YAML
// key's spelling with a typo on top and for an upper-case spelling (an
// environment variable's name copied), both flags a word fits when two
// do, and names none when no flag is
// close: a far-fetched hint would send the operator after the wrong flag.
func TestUnknownFlagHint(t *testing.T) {
	for _, tc := range []struct {
		name, flag, hint string // hint "" = none
	}{
		{"key spelling and a typo", "--tls_acme_emial=a@b.test", "--tls-acme-email"},
		{"upper case", "--HTTP_ADDR=:1", "--http-addr"},
		{"two fit", "--max-conns=10", "--client-max-conns or --upstream-max-conns"},
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

// Suggest names a word's typo, the name it cuts short or runs past (a
// command's), and the one flag it ends (its section left out), both when
// two fit, but no name when three fit or the word is a single generic
// one: --port would have been sent to --tls-redirect-port.
func TestSuggest(t *testing.T) {
	commands := []string{"serve", "check", "demo", "token", "health", "version", "help"}
	flags := []string{"admin-addr", "admin-token", "client-max-conns", "http-addr", "https-addr", "instance-id",
		"admin-metrics-loopback", "routes", "telemetry-trace-sample-ratio", "tls-redirect-port", "upstream-max-conns"}
	for _, tc := range []struct {
		word  string
		names []string
		want  string
	}{
		{"serv", commands, "serve"},
		{"Server", commands, "serve"},
		{"healthz", commands, "health"},
		{"chek", commands, "check"},
		{"versio", commands, "version"},
		{"bog", commands, ""},
		{"he", commands, ""}, // too short to tell
		{"--admin-adr", flags, "admin-addr"},
		{"--admin_addr", flags, "admin-addr"},
		{"--trace-sample-ratio", flags, "telemetry-trace-sample-ratio"},
		{"--sample-ratio", flags, "telemetry-trace-sample-ratio"},
		{"--instance", flags, "instance-id"},
		{"--routes-file", flags, "routes"},
		{"--max-conns", flags, "client-max-conns upstream-max-conns"},
		{"--upstream-max", flags, "upstream-max-conns"},
		{"--ht", flags, ""},    // too short to tell
		{"--admin", flags, ""}, // three fit: says too little
		{"--port", flags, ""},  // one word: not tls-redirect-port
		{"--frobnicate", flags, ""},
	} {
		if got := strings.Join(Suggest(tc.word, tc.names), " "); got != tc.want {
			t.Errorf("Suggest(%q) = %q, want %q", tc.word, got, tc.want)
		}
	}
}
