package namedfile

import (
	"errors"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// readWithin runs Read and fails the test, rather than hanging it, when
// Read has not returned within a deadline (a FIFO's open blocks forever).
func readWithin(t *testing.T, path string, limit int64) ([]byte, error) {
	t.Helper()
	type result struct {
		b   []byte
		err error
	}
	done := make(chan result, 1)
	go func() {
		b, err := Read(path, limit)
		done <- result{b, err}
	}()
	select {
	case r := <-done:
		return r.b, r.err
	case <-time.After(10 * time.Second):
		t.Fatalf("Read(%s) has not returned after 10s", path)
		return nil, nil
	}
}

func TestRead(t *testing.T) {
	if runtime.GOOS == "windows" {
		t.Skip("FIFOs, devices and unix sockets are POSIX")
	}
	dir := t.TempDir()
	at := func(name string) string { return filepath.Join(dir, name) }

	if err := os.WriteFile(at("small"), []byte("hello"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(at("exact"), make([]byte, 1024), 0o600); err != nil {
		t.Fatal(err)
	}
	testenv.Mkfifo(t, dir, "fifo")
	if err := os.Symlink(at("fifo"), at("link-to-fifo")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(at("small"), at("link-to-small")); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(at("dir"), 0o700); err != nil {
		t.Fatal(err)
	}
	// Sparse: a size far above the limit without the disk space.
	testenv.SparseFile(t, dir, "sparse", MaxRoutes+1)
	ln, err := net.Listen("unix", at("sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()

	for _, tc := range []struct {
		name  string
		path  string
		limit int64
		want  string // the contents, or the error's text
		is    error
	}{
		{"regular file", at("small"), MaxSmall, "hello", nil},
		{"symlink to a regular file", at("link-to-small"), MaxSmall, "hello", nil},
		{"exactly the limit", at("exact"), 1024, strings.Repeat("\x00", 1024), nil},
		{"one byte above the limit", at("exact"), 1023, "is 1 KiB, above the 1023 bytes", ErrTooLarge},
		{"missing", at("missing"), MaxSmall, "no such file", fs.ErrNotExist},
		{"FIFO with no writer", at("fifo"), MaxSmall, "is a named pipe (FIFO), not a regular file", ErrNotRegular},
		{"symlink to a FIFO", at("link-to-fifo"), MaxSmall, "is a named pipe (FIFO), not a regular file", ErrNotRegular},
		{"directory", at("dir"), MaxSmall, "is a directory, not a regular file", ErrNotRegular},
		{"character device", "/dev/zero", MaxSmall, "/dev/zero is a character device, not a regular file", ErrNotRegular},
		{"unix socket", at("sock"), MaxSmall, "is a socket, not a regular file", ErrNotRegular},
		{"sparse file above the routes limit", at("sparse"), MaxRoutes, "is 67108865 bytes, above the 64 MiB", ErrTooLarge},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := readWithin(t, tc.path, tc.limit)
			if tc.is == nil {
				if err != nil || string(b) != tc.want {
					t.Fatalf("Read = %q, %v; want %q", b, err, tc.want)
				}
				return
			}
			if !errors.Is(err, tc.is) || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), tc.path) {
				t.Fatalf("Read = %q, %v; want an error matching %v, naming %s and containing %q", b, err, tc.is, tc.path, tc.want)
			}
		})
	}
}

// TestReadBoundsWhatItReads: a file whose size says nothing of its
// contents (as one that grows after the stat) is still cut at the limit.
// Files in /proc are regular and report size 0.
func TestReadBoundsWhatItReads(t *testing.T) {
	const path = "/proc/self/maps"
	if fi, err := os.Stat(path); err != nil || fi.Size() != 0 || !fi.Mode().IsRegular() {
		t.Skipf("needs Linux's /proc (a regular file of size 0): %v", err)
	}
	_, err := readWithin(t, path, 16)
	if !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), "holds more than the 16 bytes") {
		t.Fatalf("Read = %v; want it refused as above 16 bytes", err)
	}
}
