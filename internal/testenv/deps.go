package testenv

import (
	"errors"
	"os/exec"
	"strings"
	"testing"
)

// Imports returns what the package in the current directory imports:
// directly (direct) or at any depth (-deps), standard library included,
// as `go list` reports it for the build the test runs in.
func Imports(t testing.TB, direct bool) []string {
	t.Helper()
	format := "{{join .Imports \"\\n\"}}"
	args := []string{"list", "-f", format, "."}
	if !direct {
		args = []string{"list", "-deps", "."}
	}
	out, err := exec.Command("go", args...).Output()
	if err != nil {
		var stderr string
		if ee := (*exec.ExitError)(nil); errors.As(err, &ee) {
			stderr = string(ee.Stderr)
		}
		t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, stderr)
	}
	return strings.Fields(string(out))
}

// ImportsAvoid fails t when the package in the current directory depends,
// at any depth, on one of the module's packages named in banned (or one
// below it). DESIGN.md's dependencies point one way, cmd -> proxy ->
// routing, auth, certs; proxy importing the package under test already
// makes the reverse a compile error, cmd would not.
func ImportsAvoid(t testing.TB, banned ...string) {
	t.Helper()
	const module = "github.com/cube-sandbox/cubeproxy/"
	for _, dep := range Imports(t, false) {
		rest, ok := strings.CutPrefix(dep, module)
		if !ok {
			continue
		}
		for _, b := range banned {
			if rest == b || strings.HasPrefix(rest, b+"/") {
				t.Errorf("depends on %s", dep)
			}
		}
	}
}
