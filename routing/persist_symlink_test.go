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
// one.
func TestPersistFollowsSymlink(t *testing.T) {
	data := t.TempDir()
	target := filepath.Join(data, "routes.yaml")
	if err := os.WriteFile(target, []byte("routes:\n  old: {HostIP: 10.0.0.1}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	conf := t.TempDir()
	link := filepath.Join(conf, "routes.yaml")
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	if err := CheckPersistPath(link); err != nil {
		t.Fatal(err)
	}
	s, err := LoadFile(link)
	if err != nil {
		t.Fatal(err)
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
}
