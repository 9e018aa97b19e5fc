//go:build unix

package routing

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/internal/namedfile"
	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// loadWithin runs LoadFile and fails the test, rather than hanging it,
// when LoadFile has not returned within a deadline: opening a FIFO with
// no writer blocks forever.
func loadWithin(t *testing.T, path string) error {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		_, err := LoadFile(path)
		done <- err
	}()
	select {
	case err := <-done:
		return err
	case <-time.After(10 * time.Second):
		t.Fatalf("LoadFile(%s) has not returned after 10s", path)
		return nil
	}
}

// A routes file that is not a regular file, or far too large, is refused
// with an error naming it: a FIFO hung the start, /dev/zero or a huge
// file was read until the process ran out of memory.
func TestLoadFileRefusesWhatIsNoRoutesFile(t *testing.T) {
	dir := t.TempDir()
	fifo := testenv.Mkfifo(t, dir, "routes.fifo")
	sparse := testenv.SparseFile(t, dir, "routes.huge", namedfile.MaxRoutes+1)
	for _, tc := range []struct {
		name, path, want string
	}{
		{"FIFO", fifo, "is a named pipe (FIFO), not a regular file"},
		{"directory", dir, "is a directory, not a regular file"},
		{"/dev/zero", "/dev/zero", "is a character device, not a regular file"},
		{"sparse file above 64 MiB", sparse, "above the 64 MiB"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := loadWithin(t, tc.path)
			if err == nil || !strings.Contains(err.Error(), tc.path) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("LoadFile = %v; want an error naming %s: %q", err, tc.path, tc.want)
			}
		})
	}
}

// persist_routes never writes a file the next start would refuse: the
// change stays in memory, the write is an error, the file keeps the
// previous table.
func TestPersistRefusesAFileLoadFileWouldRefuse(t *testing.T) {
	path := filepath.Join(t.TempDir(), "routes.yaml")
	before := "routes:\n  a: {HostIP: 10.0.0.1}\n"
	if err := os.WriteFile(path, []byte(before), 0o600); err != nil {
		t.Fatal(err)
	}
	s, err := LoadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	s.SetPersistPath(path)
	one, err := encodeRoutes(s.List())
	if err != nil {
		t.Fatal(err)
	}
	s.fileLimit = len(one) // the table as it is fits, one more route does not
	b, err := ParseRouteStrict("b", map[string]string{"HostIP": "10.0.0.2"})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Put(b); err == nil || !strings.Contains(err.Error(), fmt.Sprintf("above the %d bytes", len(one))) {
		t.Fatalf("Put of a route the file has no room for = %v; want the write refused", err)
	}
	if _, ok := s.Get("b"); !ok {
		t.Error("the route is not in memory")
	}
	if got, err := os.ReadFile(path); err != nil || string(got) != before {
		t.Errorf("routes file = %q, %v; want it unchanged", got, err)
	}
	// The limit is exact: one byte above is refused, the limit itself is
	// written (LoadFile reads that much).
	two, err := encodeRoutes(s.List())
	if err != nil {
		t.Fatal(err)
	}
	s.fileLimit = len(two) - 1
	if err := s.Put(b); err == nil {
		t.Fatal("Put of a table one byte above the limit succeeded; want the write refused")
	}
	s.fileLimit = len(two)
	if err := s.Put(b); err != nil {
		t.Fatalf("Put of a table exactly at the limit = %v; want it written", err)
	}
	if got, err := os.ReadFile(path); err != nil || string(got) != string(two) {
		t.Errorf("routes file = %q, %v; want the table of two routes", got, err)
	}
}
