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
