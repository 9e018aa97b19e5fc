package routing

import (
	"os"
	"testing"
)

// A file system whose times are coarse (whole seconds on some network and
// older file systems) can show an edit made in place within the same tick
// as the file loaded, the inode and the time unchanged: its new size is
// still a change, which SIGHUP's check must report.
func TestEditWithinOneTimeTickIsAChange(t *testing.T) {
	path := writeFile(t, "routes:\n  a:\n    HostIP: \"10.0.0.1\"\n")
	s, err := LoadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	loaded, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	// In place (same inode), then the time the tick shows put back.
	if err := os.WriteFile(path, []byte("routes:\n  a:\n    HostIP: \"10.0.0.1\"\n  b:\n    HostIP: \"10.0.0.2\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(path, loaded.ModTime(), loaded.ModTime()); err != nil {
		t.Fatal(err)
	}
	if _, changed := s.FileChanged(); !changed {
		t.Fatal("a longer file with the inode and time it was loaded with reads as no change")
	}
}
