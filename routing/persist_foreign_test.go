package routing

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// The store reads its routes file once and, persisting, writes its own
// table over it: a hand edit, or the change another process persisting to
// the same file made, is not served and is gone at the next write
// (README, Routes). That must not pass in silence: FileChanged tells
// SIGHUP's check that the file is no longer the one loaded or last
// written, and OnOverwrite is told of each write that replaced such a
// file, never of one that replaced the store's own.
func TestPersistTellsOfAChangedFileItOverwrites(t *testing.T) {
	path := filepath.Join(t.TempDir(), "routes.yaml")
	if err := os.WriteFile(path, []byte("routes:\n  a:\n    HostIP: \"10.0.0.1\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	load := func() (*MemoryStore, *[]string) {
		t.Helper()
		s, err := LoadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		s.SetPersistPath(path)
		var told []string
		s.OnOverwrite(func(p string) { told = append(told, p) })
		return s, &told
	}
	changed := func(s *MemoryStore) bool {
		t.Helper()
		p, ch := s.FileChanged()
		if p != path {
			t.Fatalf("FileChanged names %q, want %q", p, path)
		}
		return ch
	}
	put := func(s *MemoryStore, id string) {
		t.Helper()
		if err := s.Put(mustRoute(t, id)); err != nil {
			t.Fatal(err)
		}
	}

	s, told := load()
	if changed(s) {
		t.Fatal("the file just loaded reads as changed")
	}
	put(s, "b")
	if changed(s) || len(*told) != 0 {
		t.Fatalf("after the store's own write: changed %v, told %q; want neither", changed(s), *told)
	}

	// A hand edit.
	if err := os.WriteFile(path, []byte("routes:\n  hand:\n    HostIP: \"10.0.0.9\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if !changed(s) {
		t.Fatal("a hand edit of the file is not seen as a change")
	}
	put(s, "c")
	if !slices.Equal(*told, []string{path}) {
		t.Fatalf("the write over the hand edit told %q, want [%s]", *told, path)
	}
	if changed(s) {
		t.Fatal("the file the store wrote itself reads as changed")
	}

	// Another process persisting to the same file: each write of one
	// replaces the other's.
	other, otherTold := load()
	put(s, "d")
	put(other, "e")
	if len(*otherTold) != 1 || len(*told) != 1 {
		t.Fatalf("two stores writing one file: the second's write told %q, the first's %q; want one each (the second's only)", *otherTold, *told)
	}
	if !changed(s) {
		t.Fatal("the file another store wrote is not seen as a change")
	}

	// The file removed is a change too.
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if !changed(other) {
		t.Fatal("the file removed is not seen as a change")
	}
}

// The store of a routes file LoadFile found missing knows the file: one
// written since is a change (SIGHUP's check tells of it), none yet is not.
func TestMissingFileStoreSeesTheFileAppear(t *testing.T) {
	path := filepath.Join(t.TempDir(), "routes.yaml")
	s := NewMemoryStoreOfMissingFile(path)
	if p, ch := s.FileChanged(); p != path || ch {
		t.Fatalf("with the file still missing: FileChanged %q %v, want %q false", p, ch, path)
	}
	if err := os.WriteFile(path, []byte("routes: {}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if p, ch := s.FileChanged(); p != path || !ch {
		t.Fatalf("with the file written since: FileChanged %q %v, want %q true", p, ch, path)
	}
}
