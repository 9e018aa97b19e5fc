package routing

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// A routes file that is a mount point of its own (docker run -v
// ./routes.yaml:/etc/cubeproxy/routes.yaml, a Kubernetes subPath) cannot
// be replaced by a rename: the kernel answers EBUSY. The proxy started all
// the same, and then answered every admin change 500 with the change live
// in memory only, lost at the next restart. It is refused at startup, as
// a directory that cannot take the temporary file is; so is a link to
// such a file.
func TestCheckPersistPathRefusesAMountedFile(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "outside.yaml")
	conf := filepath.Join(dir, "conf")
	if err := os.Mkdir(conf, 0o700); err != nil {
		t.Fatal(err)
	}
	mounted := filepath.Join(conf, "routes.yaml")
	for _, p := range []string{src, mounted} {
		if err := os.WriteFile(p, []byte("routes:\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := unix.Mount(src, mounted, "", unix.MS_BIND, ""); err != nil {
		t.Skipf("cannot bind-mount a file here (needs root): %v", err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(mounted, 0); err != nil {
			t.Errorf("unmount %s: %v", mounted, err)
		}
	})
	link := filepath.Join(dir, "link.yaml")
	if err := os.Symlink(mounted, link); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{mounted, link} {
		err := CheckPersistPath(path)
		if err == nil {
			t.Errorf("CheckPersistPath(%s) = nil for a file that is a mount point", path)
			continue
		}
		if msg := err.Error(); !strings.Contains(msg, mounted) || !strings.Contains(msg, "mount") {
			t.Errorf("CheckPersistPath(%s) = %q, want it to name %s and say it is mounted", path, msg, mounted)
		}
	}
	// What the check foresees: the rewrite fails.
	s := NewMemoryStore()
	s.SetPersistPath(mounted)
	if err := s.Put(mustRoute(t, "a")); !errors.Is(err, unix.EBUSY) {
		t.Errorf("Put over the mounted file: %v, want EBUSY (else the check refuses a file that works)", err)
	}
	// A plain file beside it is fine.
	if err := CheckPersistPath(filepath.Join(conf, "other.yaml")); err != nil {
		t.Errorf("plain file: %v", err)
	}
}
