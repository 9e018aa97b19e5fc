package testenv

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// PackageSources returns the text of the non-test Go files in the current
// directory (a test's package), for tests that check rules in the code
// itself, such as which compares a secret may reach.
func PackageSources(t testing.TB) []string {
	t.Helper()
	paths, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	var srcs []string
	for _, p := range paths {
		if strings.HasSuffix(p, "_test.go") {
			continue
		}
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		srcs = append(srcs, string(b))
	}
	return srcs
}
