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
