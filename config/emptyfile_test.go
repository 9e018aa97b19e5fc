package config

import "testing"

// A config file with nothing in it is refused, as an empty pipe is: a
// template that failed to render into it, or a ConfigMap mounted with an
// empty key, left the proxy on the built-in defaults without a word. A
// file that says it wants the defaults (a comment, {} or ---) loads.
func TestEmptyConfigFileIsRefused(t *testing.T) {
	for _, tc := range []struct {
		name, yaml, want string
	}{
		{"no bytes", "", "is empty: nothing in it sets anything"},
		{"blank lines", "\n  \n\t\n", "is empty"},
		{"CRLF blank lines", "\r\n\r\n", "is empty"},
		{"a byte order mark alone", "\xef\xbb\xbf", "is empty"},
		{"a comment", "# the built-in defaults\n", ""},
		{"an empty mapping", "{}\n", ""},
		{"a document marker", "---\n", ""},
	} {
		t.Run(tc.name, func(t *testing.T) { loadWants(t, tc.yaml, tc.want) })
	}
}
