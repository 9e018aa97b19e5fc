package routing

import (
	"fmt"
	"strings"
	"testing"
)

// A key indented between two levels (3 spaces: under a route's 2, above
// its fields' 4) is the YAML parser's "did not find expected key", which
// it reports at the line where the mapping it was in starts: "line 1" for
// a slip anywhere in the routes mapping, so in a table of thousands of
// routes the error pointed nowhere. The error must name the line of the
// slip itself.
func TestDecodeRoutesNamesTheLineOfAMisindentedKey(t *testing.T) {
	var b strings.Builder
	b.WriteString("routes:\n")
	for i := range 200 {
		fmt.Fprintf(&b, "  sb%03d:\n    HostIP: \"10.0.0.1\"\n    \"3000\": \"3000\"\n", i)
	}
	good := b.String()
	for _, tc := range []struct {
		name, indent string
	}{
		{"field at 3 spaces", "   "},
		{"field at 5 spaces", "     "},
		{"field at 1 space", " "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Line 302 (1-based) is the HostIP of sb100.
			lines := strings.Split(good, "\n")
			lines[301] = tc.indent + strings.TrimSpace(lines[301])
			_, err := decodeRoutes([]byte(strings.Join(lines, "\n")))
			if err == nil || !strings.Contains(err.Error(), "line 302:") {
				t.Fatalf("decodeRoutes = %v; want an error naming line 302", err)
			}
		})
	}
	if _, err := decodeRoutes([]byte(good)); err != nil {
		t.Fatal(err)
	}
}
