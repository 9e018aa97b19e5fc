package routing

import (
	"os"
	"path/filepath"
	"testing"
)

// SIGHUP's look at the routes file (FileChanged) may come while an admin
// change's write is under way: after its file is renamed over the routes
// file, before the store records what it wrote (a directory fsync lies
// between). The file then holds the store's own table, and the look said
// it changed: the operator was warned that an edit was not served, and
// that the next admin change would write over it, where nothing but the
// proxy had touched the file.
func TestOwnWriteInProgressIsNoChange(t *testing.T) {
	for _, tc := range []struct {
		name   string
		loaded bool // a start that loaded the file (else it found none)
	}{
		{"loaded", true},
		{"started without the file", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "routes.yaml")
			var s *MemoryStore
			if tc.loaded {
				if err := os.WriteFile(path, []byte("routes:\n  a:\n    HostIP: \"10.0.0.1\"\n"), 0o600); err != nil {
					t.Fatal(err)
				}
				var err error
				if s, err = LoadFile(path); err != nil {
					t.Fatal(err)
				}
			} else {
				s = NewMemoryStoreOfMissingFile(path)
			}
			s.SetPersistPath(path)
			overwrites := 0
			s.OnOverwrite(func(string) { overwrites++ })

			looks := 0
			s.afterRename = func() {
				looks++
				if _, changed := s.FileChanged(); changed {
					t.Error("FileChanged during the store's own write, its file renamed in place: changed, want unchanged")
				}
			}
			if err := s.Put(mustRoute(t, "b")); err != nil {
				t.Fatal(err)
			}
			if looks != 1 {
				t.Fatalf("the write ran its after-rename hook %d times, want 1", looks)
			}
			if _, changed := s.FileChanged(); changed {
				t.Error("FileChanged after the write: changed, want unchanged")
			}
			if overwrites != 0 {
				t.Errorf("the write warned of %d overwrites of a file only the store wrote", overwrites)
			}

			// A real edit is still seen, also during a write: one renamed
			// over the file after the store's (as another proxy persisting
			// to it would).
			s.afterRename = func() {
				edited := filepath.Join(filepath.Dir(path), "edit")
				if err := os.WriteFile(edited, []byte("routes:\n  c:\n    HostIP: \"10.0.0.3\"\n"), 0o600); err != nil {
					t.Fatal(err)
				}
				if err := os.Rename(edited, path); err != nil {
					t.Fatal(err)
				}
				if _, changed := s.FileChanged(); !changed {
					t.Error("FileChanged of a file edited during the store's write: unchanged, want changed")
				}
			}
			if err := s.Put(mustRoute(t, "d")); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// A file renamed over the routes file while a write's own file is being
// written (another proxy persisting to it, as a reuse_port successor
// beside its predecessor does; a hand edit saved then) is replaced by
// that write, and its routes are gone from the file: the write must say
// so (OnOverwrite), as it does for one changed before it began. The look
// came before the temporary file was written and synced (seconds at
// 100k routes), and a change in that time was overwritten in silence.
func TestPersistTellsOfAFileChangedDuringItsWrite(t *testing.T) {
	s, path := persistedStore(t)
	var told []string
	s.OnOverwrite(func(p string) { told = append(told, p) })

	other := []byte("routes:\n  other:\n    HostIP: \"10.0.0.2\"\n")
	s.beforeRename = func() {
		s.beforeRename = nil // the first write only
		tmp := filepath.Join(filepath.Dir(path), "other")
		if err := os.WriteFile(tmp, other, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, path); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Put(mustRoute(t, "b")); err != nil {
		t.Fatal(err)
	}
	if len(told) != 1 || told[0] != path {
		t.Errorf("a write that replaced a file renamed in during it told %q, want [%q]", told, path)
	}
	// The store's own file is in place now: no change, and the next
	// write replaces only what this one wrote.
	if _, changed := s.FileChanged(); changed {
		t.Error("FileChanged after the write: changed, want unchanged")
	}
	if err := s.Put(mustRoute(t, "c")); err != nil {
		t.Fatal(err)
	}
	if len(told) != 1 {
		t.Errorf("the next write told of %d overwrites in all, want 1", len(told))
	}
}

// A look (SIGHUP) that took the store's state just before a whole write
// ran, and read the file after it, found the store's new table: compared
// with what the store knew when the look began, it was called a change.
func TestLookAcrossAWholeWriteIsNoChange(t *testing.T) {
	s, _ := persistedStore(t)
	s.OnOverwrite(func(string) { t.Error("the store's write told of an overwrite of its own file") })
	written := false
	s.mu.Lock()
	s.lookStarted = func() {
		if written {
			return // the write's own look, or the look's second round
		}
		written = true
		if err := s.Put(mustRoute(t, "b")); err != nil {
			t.Error(err)
		}
	}
	s.mu.Unlock()
	if _, changed := s.FileChanged(); changed {
		t.Error("FileChanged across the store's own whole write: changed, want unchanged")
	}
	if !written {
		t.Fatal("the write did not run during the look")
	}
}
