package routing

import (
	"os"
	"path/filepath"
	"testing"
)

// A change whose file write failed is answered with an error, and the
// caller retries it. A retried delete finds the route already gone from
// memory: it must still bring the file up to date, or the retry succeeds
// while the file keeps the route, and the next restart serves it again.
func TestPersistRetriedDeleteWritesTheFile(t *testing.T) {
	for _, tc := range []struct {
		name  string
		retry func(s *MemoryStore) error
	}{
		{"Remove", func(s *MemoryStore) error {
			ok, err := s.Remove("gone")
			if ok {
				t.Error("the retried Remove found the route again")
			}
			return err
		}},
		{"Remove of another absent id", func(s *MemoryStore) error { _, err := s.Remove("never-there"); return err }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			base := t.TempDir()
			dir := filepath.Join(base, "routes")
			if err := os.Mkdir(dir, 0o700); err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(dir, "routes.yaml")
			if err := os.WriteFile(path, []byte("routes:\n  gone: {HostIP: 10.0.0.1}\n  kept: {HostIP: 10.0.0.2}\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			s, err := LoadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			s.SetPersistPath(path)

			// The directory is away (an unmounted volume): the write fails.
			moved := filepath.Join(base, "elsewhere")
			if err := os.Rename(dir, moved); err != nil {
				t.Fatal(err)
			}
			if ok, err := s.Remove("gone"); !ok || err == nil {
				t.Fatalf("Remove with the directory away = %v, %v; want true and a write error", ok, err)
			}
			if err := os.Rename(moved, dir); err != nil {
				t.Fatal(err)
			}

			if err := tc.retry(s); err != nil {
				t.Fatalf("retry: %v", err)
			}
			reloaded, err := LoadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if _, ok := reloaded.Get("gone"); ok {
				t.Error("the retried delete succeeded, but the file still holds the route: a restart serves it again")
			}
			if _, ok := reloaded.Get("kept"); !ok {
				t.Error("the file lost the route that was kept")
			}
		})
	}
}
