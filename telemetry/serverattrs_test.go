package telemetry

import (
	"strings"
	"testing"
	"unicode/utf8"
)

// splitAuthority reads the host and port of every authority form a
// request can carry; a port that is no port number gives no server.port.
func TestSplitAuthority(t *testing.T) {
	for _, tc := range []struct {
		in, host string
		port     int
	}{
		{"8080-abc.cube.test", "8080-abc.cube.test", 0},
		{"8080-abc.cube.test:8443", "8080-abc.cube.test", 8443},
		{"8080-abc.cube.test:", "8080-abc.cube.test", 0},
		{"8080-abc.cube.test:99999", "8080-abc.cube.test", -1},
		{"8080-abc.cube.test:0", "8080-abc.cube.test", -1},
		{"8080-abc.cube.test:8a", "8080-abc.cube.test", -1},
		{"10.0.0.1:81", "10.0.0.1", 81},
		{"[::1]:9001", "::1", 9001},
		{"[::1]", "::1", 0},
		{"::1", "::1", 0},
		{"[::1", "[::1", 0},
	} {
		host, port := splitAuthority([]byte(tc.in))
		if string(host) != tc.host || port != tc.port {
			t.Errorf("splitAuthority(%q) = %q, %d; want %q, %d", tc.in, host, port, tc.host, tc.port)
		}
	}
}

// attrText keeps text within its limit on a character boundary, as valid
// UTF-8 (a run of invalid bytes one U+FFFD, as strings.ToValidUTF8 has
// it), whatever bytes it is given.
func TestAttrTextLimit(t *testing.T) {
	for _, tc := range []struct {
		in    string
		limit int
		want  string
	}{
		{"curl/8.5.0", 1024, "curl/8.5.0"},
		{"abcdef", 4, "abcd"},
		{"abcé", 4, "abc"}, // é is two bytes: cut before it
		{"abcé", 5, "abcé"},
		{"a\xff\xfeb", 1024, "a\uFFFDb"},
		{"a\xff\xfeb", 3, "a"}, // U+FFFD is three bytes
		{"a\xff\xfeb", 5, "a\uFFFDb"},
		{strings.Repeat("€", 400), MaxHeaderAttr, strings.Repeat("€", MaxHeaderAttr/3)},
	} {
		var b strings.Builder
		end := attrText{b: &b}.add([]byte(tc.in), tc.limit)
		got := b.String()
		if got != tc.want || end != len(got) {
			t.Errorf("add(%q, %d) = %q (end %d), want %q", tc.in, tc.limit, got, end, tc.want)
		}
		if !utf8.ValidString(got) || len(got) > tc.limit {
			t.Errorf("add(%q, %d) = %q: invalid UTF-8 or over the limit", tc.in, tc.limit, got)
		}
	}
}
