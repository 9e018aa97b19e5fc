package routing

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// A routes file whose inode or time changed but whose bytes did not is no
// change: Kubernetes swaps a ConfigMap volume's ..data link to a new copy
// of every key when any one of them changes (the config file edited, the
// routes file as it was), and touch, a backup restore or a deploy that
// copies the same file again give it a new time. SIGHUP's check warned
// that the routes were not served, and with persist_routes the next write
// warned that what was changed there was gone, where nothing was.
func TestSameBytesInANewFileAreNoChange(t *testing.T) {
	const text = "routes:\n  a:\n    HostIP: \"10.0.0.1\"\n"
	// persist: with persist_routes (serve sets the path of the file it
	// loaded at once); write: a Put has rewritten the file since.
	for _, tc := range []struct {
		name           string
		persist, write bool
	}{
		{"loaded", false, false},
		{"persisted, not written yet", true, false},
		{"written", true, true},
	} {
		persist := tc.persist
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "routes.yaml")
			if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
				t.Fatal(err)
			}
			s, err := LoadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			told := 0
			if persist {
				s.SetPersistPath(path)
				s.OnOverwrite(func(string) { told++ })
			}
			if tc.write {
				if err := s.Put(mustRoute(t, "b")); err != nil {
					t.Fatal(err)
				}
			}
			same, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			changed := func() bool {
				t.Helper()
				_, ch := s.FileChanged()
				return ch
			}

			// touch: a new time, the same inode and bytes.
			later := time.Now().Add(time.Hour)
			if err := os.Chtimes(path, later, later); err != nil {
				t.Fatal(err)
			}
			if changed() {
				t.Error("the file touched reads as changed")
			}
			// The same bytes in another file renamed over it (a ConfigMap's
			// ..data swap, an editor's save).
			tmp := filepath.Join(dir, "routes.yaml.new")
			if err := os.WriteFile(tmp, same, 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Rename(tmp, path); err != nil {
				t.Fatal(err)
			}
			if changed() {
				t.Error("the same bytes renamed over the file read as changed")
			}
			if persist {
				if err := os.Chtimes(path, later.Add(time.Hour), later.Add(time.Hour)); err != nil {
					t.Fatal(err)
				}
				if err := s.Put(mustRoute(t, "c")); err != nil {
					t.Fatal(err)
				}
				if told != 0 {
					t.Errorf("a write over the file it last wrote, touched since: told of %d overwrites, want none", told)
				}
			}

			// Other bytes are a change, as before.
			if err := os.WriteFile(path, []byte("routes:\n  hand:\n    HostIP: \"10.0.0.9\"\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			if !changed() {
				t.Error("a hand edit reads as no change")
			}
			if persist {
				if err := s.Put(mustRoute(t, "d")); err != nil {
					t.Fatal(err)
				}
				if told != 1 {
					t.Errorf("a write over a hand edit: told of %d overwrites, want 1", told)
				}
			}
		})
	}
}
