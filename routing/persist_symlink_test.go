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
		viaLink  bool // the link points at another link, in a third directory
	}{
		{"absolute link", false, true, false},
		{"relative link", true, true, false},
		{"link to a file not there yet", false, false, false},
		{"relative link to a relative link", true, true, true},
		{"link to a link to a file not there yet", false, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			base := t.TempDir()
			data, conf, mid := filepath.Join(base, "data"), filepath.Join(base, "conf"), filepath.Join(base, "deep", "mid")
			dirs := []string{data, conf}
			if tc.viaLink {
				dirs = append(dirs, mid)
			}
			for _, d := range dirs {
				if err := os.MkdirAll(d, 0o700); err != nil {
					t.Fatal(err)
				}
			}
			target := filepath.Join(data, "routes.yaml")
			if tc.existing {
				if err := os.WriteFile(target, []byte("routes:\n  old: {HostIP: 10.0.0.1}\n"), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			// A relative link names its target from its own directory,
			// which is where the kernel resolves it from; mid is deeper
			// than conf so that resolving from the wrong one misses.
			symlink := func(to, at string) {
				t.Helper()
				if tc.relative {
					var err error
					if to, err = filepath.Rel(filepath.Dir(at), to); err != nil {
						t.Fatal(err)
					}
				}
				if err := os.Symlink(to, at); err != nil {
					t.Fatal(err)
				}
			}
			link, next := filepath.Join(conf, "routes.yaml"), target
			if tc.viaLink {
				next = filepath.Join(mid, "routes.yaml")
				symlink(target, next)
			}
			symlink(next, link)
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
			for _, dir := range dirs {
				if entries, _ := os.ReadDir(dir); len(entries) != 1 {
					t.Errorf("%s holds %d files after the write, want 1", dir, len(entries))
				}
			}
		})
	}
}

// The startup check must try the directory the writes will go to: for a
// link, its target's. A link into a directory that is not there (a data
// volume not mounted) passed the check, and every admin change then failed.
func TestCheckPersistPathFollowsSymlink(t *testing.T) {
	base := t.TempDir()
	link := filepath.Join(base, "routes.yaml")
	if err := os.Symlink(filepath.Join(base, "unmounted", "routes.yaml"), link); err != nil {
		t.Fatal(err)
	}
	if err := CheckPersistPath(link); err == nil {
		t.Fatal("CheckPersistPath passed a link into a missing directory; every write would fail")
	}
	if err := os.Mkdir(filepath.Join(base, "unmounted"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := CheckPersistPath(link); err != nil {
		t.Fatalf("with the directory there: %v", err)
	}
	if entries, _ := os.ReadDir(filepath.Join(base, "unmounted")); len(entries) != 0 {
		t.Errorf("the check left %d files in the target directory", len(entries))
	}
}

// ".." after a directory that is a symlink goes up from where the link
// points, as the kernel resolves it, not back over the link as a lexical
// clean (filepath.Join) takes it. Resolved lexically, the writes went to
// another file than the one loaded (here the decoy, in the directory the
// clean named), and a restart read the old table: every admin change
// since was lost. Both spellings: a routes file that is a relative link
// with "../", in a directory reached through a symlink, and a configured
// path with ".." after such a directory (whose temporary file went to the
// decoy directory, and the start refused when there was none).
func TestPersistResolvesDotDotAfterLinkedDir(t *testing.T) {
	for _, viaFileLink := range []bool{true, false} {
		name := map[bool]string{true: "relative link with ../", false: "path with .."}[viaFileLink]
		t.Run(name, func(t *testing.T) {
			// base/conf -> real/conf; base/real/data holds the table;
			// base/data is the decoy a lexical clean lands in.
			base := t.TempDir()
			dirs := []string{"real/conf", "real/data"}
			if viaFileLink {
				dirs = append(dirs, "data")
			}
			for _, d := range dirs {
				if err := os.MkdirAll(filepath.Join(base, d), 0o700); err != nil {
					t.Fatal(err)
				}
			}
			if err := os.Symlink(filepath.Join(base, "real", "conf"), filepath.Join(base, "conf")); err != nil {
				t.Fatal(err)
			}
			target := filepath.Join(base, "real", "data", "routes.yaml")
			if err := os.WriteFile(target, []byte("routes:\n  old: {HostIP: 10.0.0.1}\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(base, "conf") + "/../data/routes.yaml"
			if viaFileLink {
				path = filepath.Join(base, "conf", "routes.yaml")
				if err := os.Symlink("../data/routes.yaml", path); err != nil {
					t.Fatal(err)
				}
			}
			if err := CheckPersistPath(path); err != nil {
				t.Fatal(err)
			}
			s, err := LoadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			s.SetPersistPath(path)
			if err := s.Put(mustRoute(t, "new")); err != nil {
				t.Fatal(err)
			}
			reloaded, err := LoadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if _, ok := reloaded.Get("new"); !ok {
				t.Error("the file a restart reads lacks the route written")
			}
			if entries, _ := os.ReadDir(filepath.Join(base, "data")); len(entries) != 0 {
				t.Errorf("the write left %d files in %s, the directory a lexical clean names", len(entries), filepath.Join(base, "data"))
			}
		})
	}
}
