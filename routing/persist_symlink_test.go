package routing

import (
	"os"
	"path/filepath"
	"testing"
)

// A routes file that is a symlink (routes.yaml in the config directory
// pointing at the copy in a data directory, which is the one the operator
// backs up and edits) stays one: the file it points to is rewritten, in
// its own directory, which is the one that must be writable. Renamed over
// the link, the new table landed beside it and the target kept the old
// one (or, for a link to a file not there yet, never got one).
func TestPersistFollowsSymlink(t *testing.T) {
	for _, tc := range []struct {
		name     string
		relative bool // the link names its target relative to its directory
		existing bool // the target exists before the first write
	}{
		{"absolute link", false, true},
		{"relative link", true, true},
		{"link to a file not there yet", false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			base := t.TempDir()
			data, conf := filepath.Join(base, "data"), filepath.Join(base, "conf")
			for _, d := range []string{data, conf} {
				if err := os.Mkdir(d, 0o700); err != nil {
					t.Fatal(err)
				}
			}
			target := filepath.Join(data, "routes.yaml")
			if tc.existing {
				if err := os.WriteFile(target, []byte("routes:\n  old: {HostIP: 10.0.0.1}\n"), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			link := filepath.Join(conf, "routes.yaml")
			linkTo := target
			if tc.relative {
				linkTo = filepath.Join("..", "data", "routes.yaml")
			}
			if err := os.Symlink(linkTo, link); err != nil {
				t.Fatal(err)
			}
			if err := CheckPersistPath(link); err != nil {
				t.Fatal(err)
			}
			s := NewMemoryStore()
			if tc.existing {
				var err error
				if s, err = LoadFile(link); err != nil {
					t.Fatal(err)
				}
			}
			s.SetPersistPath(link)
			if err := s.Put(mustRoute(t, "new")); err != nil {
				t.Fatal(err)
			}
			if fi, err := os.Lstat(link); err != nil || fi.Mode()&os.ModeSymlink == 0 {
				t.Fatalf("after a write the routes file is %v (%v), want the symlink kept", fi.Mode(), err)
			}
			reloaded, err := LoadFile(target)
			if err != nil {
				t.Fatal(err)
			}
			if _, ok := reloaded.Get("new"); !ok {
				t.Error("the file the link points to lacks the route written")
			}
			for _, dir := range []string{data, conf} {
				if entries, _ := os.ReadDir(dir); len(entries) != 1 {
					t.Errorf("%s holds %d files after the write, want 1", dir, len(entries))
				}
			}
		})
	}
}
