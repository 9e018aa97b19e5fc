//go:build unix

package config

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The config file must be a regular file of at most 4 MiB: a FIFO hung
// serve and check forever, /dev/zero or a huge file named by mistake was
// read until the process ran out of memory.
func TestLoadRefusesWhatIsNoConfigFile(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "cubeproxy.fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Skipf("mkfifo: %v", err)
	}
	link := filepath.Join(dir, "cubeproxy.yaml")
	if err := os.Symlink(fifo, link); err != nil {
		t.Fatal(err)
	}
	sparse := filepath.Join(dir, "huge.yaml")
	f, err := os.Create(sparse)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(4<<20 + 1); err != nil { // sparse: no disk used
		t.Fatal(err)
	}
	f.Close()
	for _, tc := range []struct {
		name, path, want string
	}{
		{"FIFO", fifo, "is a named pipe (FIFO), not a regular file"},
		{"symlink to a FIFO", link, "is a named pipe (FIFO), not a regular file"},
		{"directory", dir, "is a directory, not a regular file"},
		{"/dev/zero", "/dev/zero", "is a character device, not a regular file"},
		{"sparse file above 4 MiB", sparse, "above the 4 MiB"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			done := make(chan error, 1)
			go func() {
				_, err := Load([]string{"--config", tc.path}, env(nil), io.Discard)
				done <- err
			}()
			var err error
			select {
			case err = <-done:
			case <-time.After(10 * time.Second):
				t.Fatalf("Load --config %s has not returned after 10s", tc.path)
			}
			if err == nil || !strings.Contains(err.Error(), tc.path) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Load = %v; want an error naming %s: %q", err, tc.path, tc.want)
			}
		})
	}
}
