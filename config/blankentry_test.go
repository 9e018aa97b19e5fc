package config

import (
	"io"
	"strings"
	"testing"
)

// An empty entry of domains or shared_hosts in the file (a template that
// rendered nothing: domains: ["{{ .Values.domain }}"]) was skipped: a
// domains list of only such entries let every domain through, as the
// environment's CUBEPROXY_DOMAINS="," did before it was refused, and
// "." or "*.." alone was the same. An empty list, written as one, still means any.
func TestBlankHostEntries(t *testing.T) {
	for _, tc := range []struct {
		body, want string // want: "" loads
	}{
		{"domains: ['']\n", `domains: entry 1 is empty`},
		{"domains: [cube.app, ' ']\n", `domains: entry 2 is empty`},
		{"domains: ['*..']\n", `domains: entry 1 ("*..") names no domain`},
		{"domains: ['.']\n", `domains: entry 1 (".") names no domain`},
		{"shared_hosts: ['']\n", `shared_hosts: entry 1 is empty`},
		// One name, not a list: told as such, not as "entry 1".
		{"tls:\n  domain: ' '\n", `tls.domain: " " names no domain; write the name, or remove it`},
		{"tls:\n  domain: .\n", `tls.domain: "." names no domain`},
		{"domains: []\nshared_hosts: []\n", ""},
		{"domains: ['*.cube.app', .b.test]\n", ""},
	} {
		t.Run(tc.body, func(t *testing.T) {
			loadWants(t, tc.body, tc.want)
		})
	}
}

// Two names in one entry, as a variable written space- or
// semicolon-separated gives them, are told how a list is written.
func TestHostEntryWithTwoNames(t *testing.T) {
	for _, v := range []string{"a.app b.app", "a.app;b.app"} {
		_, err := Load(nil, env(map[string]string{"CUBEPROXY_DOMAINS": v}), io.Discard)
		if err == nil || !strings.Contains(err.Error(), "a list is comma-separated (a.app,b.app)") {
			t.Errorf("CUBEPROXY_DOMAINS=%q: %v", v, err)
		}
	}
}
