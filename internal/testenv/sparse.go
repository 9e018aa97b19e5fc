package testenv

import (
	"os"
	"path/filepath"
	"testing"
)

// SparseFile makes a file called name in dir that reads as size zero
// bytes but takes no disk, for tests of size limits, and returns its path.
func SparseFile(t testing.TB, dir, name string, size int64) string {
	t.Helper()
	path := filepath.Join(dir, name)
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	return path
}
