package auth_test

import (
	"strings"
	"testing"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// DESIGN.md's layout: auth is pure functions over headers and a route,
// with no I/O, and never imports proxy (dependencies point cmd -> proxy
// -> routing, auth, certs). A package that could open files or sockets
// could not be reasoned about as a pure check.
func TestImportsArePure(t *testing.T) {
	testenv.ImportsAvoid(t, "proxy", "cmd")
	for _, imp := range testenv.Imports(t, true) {
		switch {
		case imp == "os", imp == "net", imp == "syscall", imp == "io/fs", imp == "log", imp == "log/slog",
			strings.HasPrefix(imp, "os/"), strings.HasPrefix(imp, "net/"):
			t.Errorf("auth imports %s: its checks do no I/O", imp)
		}
	}
}
