package routing

import (
	"strings"
	"testing"
)

// A routes file with a control character (an escape sequence pasted from
// a terminal, a stray NUL or DEL) names the line it is on and the byte:
// the YAML parser refuses the whole file for it with "control characters
// are not allowed", and names no line, which in a 100k-route file left
// the operator with nothing to look for. Its UTF-8 errors were placed
// already (TestDecodeRoutesNamesTheLineOfInvalidUTF8).
func TestDecodeRoutesNamesTheLineOfAControlCharacter(t *testing.T) {
	for _, tc := range []struct {
		name, data, want string
	}{
		{"escape in a quoted value", "routes:\n  a:\n    HostIP: \"10.0.0.1\"\n    MaskRequestHost: \"\x1b[32mh\"\n", "line 4"},
		{"BEL in a plain value", "routes:\n  a:\n    HostIP: 10.0.0.1\x07\n", "line 3"},
		{"DEL in a comment", "# routes\n# \x7f\nroutes: {}\n", "line 2"},
		{"NUL in the first line", "\x00routes: {}\n", "line 1"},
		{"C1 control", "routes: {}\n\n# \u0090\n", "line 3"},
		{"noncharacter U+FFFE", "routes: {}\n# \ufffe\n", "line 2"},
		{"noncharacter U+FFFF", "routes: {}\n# \uffff\n", "line 2"},
		{"BEL after a NEL", "# \u0085\nroutes: {}\n# \x07\n", "line 3"}, // NEL is no control character
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := decodeRoutes([]byte(tc.data))
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "control character") {
				t.Fatalf("decodeRoutes = %v; want an error about a control character naming %s", err, tc.want)
			}
		})
	}
	// Tabs, carriage returns and NEL are no control characters to YAML.
	routes, err := decodeRoutes([]byte("routes:\r\n  a: {HostIP: 10.0.0.1}\t# \u0085\r\n"))
	if err != nil || len(routes) != 1 {
		t.Fatalf("decodeRoutes with a tab, CRLF and NEL = %v, %v; want its one route", routes, err)
	}
}
