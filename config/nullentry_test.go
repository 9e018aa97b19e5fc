package config

import "testing"

// A list entry written with no value (`- ` alone, `[~]`: a template such
// as `- {{ .Values.domain }}` that rendered nothing, unquoted) was dropped
// by the decoder: a domains list of only that one let every domain
// through, without a word, where the quoted form, domains: [""], is
// refused. Any list's null entry is now refused, naming it and its line.
func TestNullListEntries(t *testing.T) {
	for _, tc := range []struct {
		body, want string // want: "" loads
	}{
		{"domains:\n  - \n", "line 2: an entry of domains has no value"},
		{"domains: [cube.app, ~]\n", "line 1: an entry of domains has no value"},
		{"shared_hosts: [null]\n", "line 1: an entry of shared_hosts has no value"},
		{"auth:\n  exempt_ports:\n    - 80\n    -\n", "line 4: an entry of auth.exempt_ports has no value"},
		{"auth:\n  signing_keys: [~]\n", "line 2: an entry of auth.signing_keys has no value"},
		{"none: &n\ndomains: [*n]\n", "unknown key none"}, // unknown keys still come first
		// An entry written as an alias of an empty value is as empty.
		{"shared_hosts: &e\ndomains: [cube.app, *e]\n", "line 1: an entry of domains has no value"},
		{"domains: []\nshared_hosts:\n", ""},
		{"domains: [cube.app, b.test, ]\n", ""},
	} {
		t.Run(tc.body, func(t *testing.T) {
			loadWants(t, tc.body, tc.want)
		})
	}
}
