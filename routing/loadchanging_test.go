package routing

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// appendRoute appends route id to the routes file at path, as a writer
// that is not done yet (a cp over it, a script writing route by route)
// does, so that what a reader got before holds only part of the table.
func appendRoute(t *testing.T, path, id string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := fmt.Fprintf(f, "  %s:\n    HostIP: \"10.0.0.2\"\n", id); err != nil {
		t.Fatal(err)
	}
}

// A routes file written while the start reads it (cut at a route's end,
// which is YAML) loaded as the routes written so far, and the proxy
// served that half table as the whole one: every other sandbox answered
// 404 until a restart. A file that changed while read is read again; one
// that keeps changing is refused.
func TestLoadFileRereadsAFileChangedWhileRead(t *testing.T) {
	path := filepath.Join(t.TempDir(), "routes.yaml")
	if err := os.WriteFile(path, []byte("routes:\n  a:\n    HostIP: \"10.0.0.1\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	s, err := loadFile(path, func(attempt int) {
		if attempt == 1 {
			appendRoute(t, path, "b")
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := s.Get("b"); !ok || len(s.List()) != 2 {
		t.Fatalf("LoadFile of a file that grew while read = %d routes, b %v; want both routes", len(s.List()), ok)
	}

	n := 0
	keepWriting := func(int) {
		n++
		appendRoute(t, path, fmt.Sprintf("c%d", n))
	}
	if _, err := loadFile(path, keepWriting); err == nil || !strings.Contains(err.Error(), "changed while it was read") {
		t.Fatalf("LoadFile of a file that never stops changing: %v; want it refused", err)
	}
}

// A file replaced whole while it is read (renamed over, as persist_routes
// writes it) did not change under the reader: what was opened is one
// whole table, and it is loaded, the file then known as changed since.
// It was read again, and refused after five replacements: a reuse_port
// successor starting beside a proxy whose admin API was busy (a write
// every few milliseconds, persisted) could not start, "the file changed
// while it was read, 5 times in a row".
func TestLoadFileTakesAFileReplacedWholeWhileRead(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "routes.yaml")
	if err := os.WriteFile(path, []byte("routes:\n  a:\n    HostIP: \"10.0.0.1\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	replace := func(attempt int) {
		tmp := filepath.Join(dir, ".routes.yaml.tmp")
		table := fmt.Sprintf("routes:\n  a:\n    HostIP: \"10.0.0.1\"\n  r%d:\n    HostIP: \"10.0.0.2\"\n", attempt)
		if err := os.WriteFile(tmp, []byte(table), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, path); err != nil {
			t.Fatal(err)
		}
	}
	s, err := loadFile(path, replace)
	if err != nil {
		t.Fatalf("LoadFile of a file replaced whole during each read: %v; want the table first opened", err)
	}
	if routes := s.List(); len(routes) != 1 {
		t.Fatalf("loaded %d routes, want the 1 of the file as opened", len(routes))
	}
	if _, changed := s.FileChanged(); !changed {
		t.Fatal("FileChanged = false after the file was replaced during the load; want true")
	}
}
