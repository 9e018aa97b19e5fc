package config

import (
	"io"
	"strings"
	"testing"
)

// A syntax error names its line wherever it is: the decoder leaves the
// line out for one on the first line, and for a control character or a
// byte that is no UTF-8 anywhere (a character pasted from a terminal or
// a document), which left the operator to search the whole file.
func TestSyntaxErrorsNameTheirLine(t *testing.T) {
	for _, tc := range []struct {
		name, yaml, want string
	}{
		// The scanner's words alone do not say the character is a tab,
		// which looks like the spaces around it.
		{"a tab on the first line", "\thttp_addr: ':1'\n", "line 1: found character that cannot start any token (a tab: YAML indents with spaces only)"},
		{"a tab on a later line", "http_addr: ':1'\n\tadmin_addr: ':2'\n", "line 2: found character that cannot start any token (a tab: YAML indents with spaces only)"},
		{"a tab indenting a nested key", "cache:\n\tsize: 5\n", "line 2: found character that cannot start any token (a tab: YAML indents with spaces only)"},
		{"a tab after a value", "cache:\n  size: 5\t\n  ttl_min:\t5s\n", ""},
		{"a control character", "http_addr: ':1'\nlog_level: in\x01fo\n", "line 2: control characters are not allowed (byte 0x01)"},
		{"a control character after CRLF lines", "http_addr: ':1'\r\ncache:\r\n  size: 5\x1b\r\n", "line 3: control characters are not allowed (byte 0x1b)"},
		{"no UTF-8", "http_addr: ':1'\n\nlog_level: \xff\xfe\n", "line 3: invalid leading UTF-8 octet (byte 0xff)"},
		{"a C1 control character", "http_addr: ':1'\nnode_ip: \u009b1\n", "line 2: control characters are not allowed"},
		// Not about a place in the text: no line is made up.
		{"an unknown anchor", "http_addr: ':1'\ncache:\n  size: *nope\n", "cubeproxy.yaml: yaml: unknown anchor 'nope' referenced"},
	} {
		t.Run(tc.name, func(t *testing.T) { loadWants(t, tc.yaml, tc.want) })
	}
}

// A character other than a tab that cannot start a token (@, `) is not
// blamed on a tab elsewhere on its line.
func TestSyntaxErrorBlamesNoOtherTab(t *testing.T) {
	_, err := Load([]string{"--config", writeFile(t, "log_level: info\ninstance_id: @me\t# a tab in the comment\n")}, env(nil), io.Discard)
	if err == nil || !strings.Contains(err.Error(), "line 2: found character that cannot start any token") || strings.Contains(err.Error(), "a tab") {
		t.Fatalf("Load = %v; want line 2's error, no tab blamed", err)
	}
}
