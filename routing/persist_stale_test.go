package routing

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

// A crash between a rewrite's CreateTemp and its rename leaves a
// .routes.yaml.tmp-* file (0600, as large as the table) that nothing else
// removes. The start removes those of its own routes file older than the
// grace period, and keeps younger ones (a reuse_port predecessor may be
// writing one), other files' temporaries, and anything not a plain file.
func TestRemoveStaleTemps(t *testing.T) {
	old := time.Now().Add(-2 * time.Minute)
	for _, tc := range []struct {
		name    string
		file    string // created in the routes file's directory
		dir     bool   // a directory rather than a file
		link    bool   // a symlink (to routes.yaml) rather than a file
		mtime   time.Time
		removed bool
	}{
		{"stale temporary", ".routes.yaml.tmp-123456", false, false, old, true},
		{"another stale temporary", ".routes.yaml.tmp-42", false, false, old, true},
		{"young temporary", ".routes.yaml.tmp-777", false, false, time.Now(), false},
		{"another file's temporary", ".other.yaml.tmp-123", false, false, old, false},
		{"the prefix alone", ".routes.yaml.tmp-", false, false, old, false},
		{"a directory named like one", ".routes.yaml.tmp-9", true, false, old, false},
		{"a symlink named like one", ".routes.yaml.tmp-8", false, true, old, false},
		{"an operator's backup", "routes.yaml.bak", false, false, old, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "routes.yaml")
			if err := os.WriteFile(path, []byte("routes: {}\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Chtimes(path, old, old); err != nil {
				t.Fatal(err)
			}
			p := filepath.Join(dir, tc.file)
			var err error
			switch {
			case tc.dir:
				err = os.Mkdir(p, 0o700)
			case tc.link:
				err = os.Symlink(path, p)
			default:
				err = os.WriteFile(p, []byte("routes: {partial"), 0o600)
			}
			if err != nil {
				t.Fatal(err)
			}
			if !tc.link {
				if err := os.Chtimes(p, tc.mtime, tc.mtime); err != nil {
					t.Fatal(err)
				}
			}
			removed, err := RemoveStaleTemps(path, time.Minute)
			if err != nil {
				t.Fatalf("RemoveStaleTemps: %v", err)
			}
			_, statErr := os.Lstat(p)
			gone := os.IsNotExist(statErr)
			if gone != tc.removed {
				t.Errorf("%s removed = %v, want %v (removed list %v)", tc.file, gone, tc.removed, removed)
			}
			var want []string
			if tc.removed {
				want = []string{p}
			}
			if !slices.Equal(removed, want) {
				t.Errorf("removed list %v, want %v", removed, want)
			}
			if _, err := os.Stat(path); err != nil {
				t.Errorf("the routes file itself: %v", err)
			}
		})
	}
}

// A routes file that is a symlink is rewritten in its target's directory
// (see followLink): that is where its temporaries are left, and where the
// start looks; the link's own directory is not the writer's.
func TestRemoveStaleTempsFollowsSymlink(t *testing.T) {
	old := time.Now().Add(-2 * time.Minute)
	data, linkDir := t.TempDir(), t.TempDir()
	target := filepath.Join(data, "routes.yaml")
	if err := os.WriteFile(target, []byte("routes: {}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(linkDir, "routes.yaml")
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	stale := filepath.Join(data, ".routes.yaml.tmp-1")
	besideLink := filepath.Join(linkDir, ".routes.yaml.tmp-2")
	for _, p := range []string{stale, besideLink} {
		if err := os.WriteFile(p, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(p, old, old); err != nil {
			t.Fatal(err)
		}
	}
	removed, err := RemoveStaleTemps(link, time.Minute)
	if err != nil || !slices.Equal(removed, []string{stale}) {
		t.Errorf("RemoveStaleTemps = %v, %v; want [%s]", removed, err, stale)
	}
	if _, err := os.Stat(besideLink); err != nil {
		t.Errorf("a file beside the link was touched: %v", err)
	}
}

// A write that crashed in a real store leaves exactly the name the sweep
// looks for: the test above names its files by hand, this one checks the
// pattern against writeFileAtomic's own.
func TestRemoveStaleTempsMatchesTheWritersName(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "routes.yaml")
	if err := CheckPersistPath(path); err != nil {
		t.Fatal(err)
	}
	f, err := os.CreateTemp(dir, tempPattern(path))
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	old := time.Now().Add(-2 * time.Minute)
	if err := os.Chtimes(f.Name(), old, old); err != nil {
		t.Fatal(err)
	}
	removed, err := RemoveStaleTemps(path, time.Minute)
	if err != nil || !slices.Equal(removed, []string{f.Name()}) {
		t.Errorf("RemoveStaleTemps = %v, %v; want [%s]", removed, err, f.Name())
	}
}
