package config

import "testing"

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
		{"domains: []\nshared_hosts: []\n", ""},
		{"domains: ['*.cube.app', .b.test]\n", ""},
	} {
		t.Run(tc.body, func(t *testing.T) {
			loadWants(t, tc.body, tc.want)
		})
	}
}
