package routing

import (
	"os"
	"path/filepath"
	"testing"
)

// With persist_routes the file is the proxy's table written out, not a
// second source: an edit made to it while the proxy runs is neither read
// nor kept, and the next admin change writes the table over it (README,
// Routes). A restart then reads the file as last written.
func TestPersistOverwritesHandEdit(t *testing.T) {
	s, path := persistedStore(t)

	edited := "routes:\n  a:\n    HostIP: \"10.0.0.1\"\n  hand:\n    HostIP: \"10.0.0.9\"\n"
	if err := os.WriteFile(path, []byte(edited), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, ok := s.Get("hand"); ok {
		t.Fatal("the running table picked up a route written to the file by hand")
	}
	if err := s.Put(mustRoute(t, "b")); err != nil {
		t.Fatal(err)
	}

	restarted, err := LoadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for id, want := range map[string]bool{"a": true, "b": true, "hand": false} {
		if _, ok := restarted.Get(id); ok != want {
			t.Errorf("route %q in the file after the admin change: %v, want %v", id, ok, want)
		}
	}
}

// persistedStore writes a routes file holding route a, loads it and writes
// admin changes back to it, as serve does with persist_routes.
func persistedStore(t *testing.T) (*MemoryStore, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "routes.yaml")
	if err := os.WriteFile(path, []byte("routes:\n  a:\n    HostIP: \"10.0.0.1\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	s, err := LoadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	s.SetPersistPath(path)
	return s, path
}
