package routing

import (
	"strings"
	"testing"
)

// A tab that indents a line of the routes file looks like the spaces
// around it, and the parser says only "found character that cannot start
// any token": the error now says it is a tab, as the config file's does.
// A character other than a tab that cannot start a token is not blamed
// on a tab elsewhere on its line.
func TestDecodeRoutesSaysATabIndents(t *testing.T) {
	for _, tc := range []struct {
		name, data string
		tab        bool
	}{
		{"tab before a field", "routes:\n  a:\n\tHostIP: 1.2.3.4\n", true},
		{"tab after spaces", "routes:\n  a:\n    HostIP: 1.2.3.4\n  \t  SandboxIP: 1.2.3.5\n", true},
		{"tab before a nested item", "routes:\n  a:\n    - \t- b\n", true},
		{"at sign", "routes:\n  a:\n    HostIP: @1.2.3.4\t\n", false},
		{"percent sign", "routes:\n  a:\n    HostIP:\t%1.2.3.4\n", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := decodeRoutes([]byte(tc.data))
			if err == nil {
				t.Fatal("decodeRoutes succeeded")
			}
			if got := strings.Contains(err.Error(), "a tab"); got != tc.tab {
				t.Fatalf("decodeRoutes = %v; blames a tab: %v, want %v", err, got, tc.tab)
			}
		})
	}
}
