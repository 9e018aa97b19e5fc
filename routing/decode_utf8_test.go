package routing

import (
	"strings"
	"testing"
)

// A routes file with a byte that is not UTF-8 (a value pasted from a
// Latin-1 document, a file saved by an editor in the wrong encoding) names
// the line it is on: the YAML parser's own error ("invalid leading UTF-8
// octet") named none, which in a 100k-route file left the operator with
// nothing to look for. A comment counts too: the parser refuses the whole
// file for it. A file in UTF-16, which the parser reads by its byte-order
// mark, is not UTF-8 and must not be refused as such.
func TestDecodeRoutesNamesTheLineOfInvalidUTF8(t *testing.T) {
	for _, tc := range []struct {
		name, data, want string
	}{
		{"in a value", "routes:\n  a:\n    HostIP: \"10.0.0.1\"\n    MaskRequestHost: \"h\xe9te\"\n", "line 4"},
		{"in a comment", "# routes\n\n# caf\xe9\nroutes: {}\n", "line 3"},
		{"cut sequence at the end", "routes: {}\n# \xe2\x82", "line 2"},
		{"in the first line", "\xffroutes: {}\n", "line 1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := decodeRoutes([]byte(tc.data))
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "UTF-8") {
				t.Fatalf("decodeRoutes = %v; want an error about UTF-8 naming %s", err, tc.want)
			}
		})
	}
	utf16 := "\xff\xfe" + strings.Join(strings.Split("routes:\n  a: {HostIP: 10.0.0.1}\n", ""), "\x00") + "\x00"
	routes, err := decodeRoutes([]byte(utf16))
	if err != nil || len(routes) != 1 {
		t.Fatalf("decodeRoutes of a UTF-16 file = %v, %v; want its one route", routes, err)
	}
}
