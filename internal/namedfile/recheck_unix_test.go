//go:build unix

package namedfile

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// TestOpenJudgesWhatItOpened: the name Open checked may name something
// else by the time it is opened (a rename over it, a file removed and
// made again). What was opened is judged as the name was: a FIFO put
// there is neither waited on nor returned, and neither is a directory, a
// device or a file above the limit; a regular file that replaced the
// checked one (an atomic replacement) is opened, and its state returned.
func TestOpenJudgesWhatItOpened(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		name    string
		replace func(path string) error // makes path anew, once removed
		is      error                   // nil: opened, reading "newer"
	}{
		{"FIFO with no writer", func(path string) error { return syscall.Mkfifo(path, 0o600) }, ErrNotRegular},
		{"directory", func(path string) error { return os.Mkdir(path, 0o700) }, ErrNotRegular},
		{"symlink to a character device", func(path string) error { return os.Symlink("/dev/zero", path) }, ErrNotRegular},
		{"file above the limit", func(path string) error { return os.WriteFile(path, make([]byte, 17), 0o600) }, ErrTooLarge},
		{"regular file", func(path string) error { return os.WriteFile(path, []byte("newer"), 0o600) }, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(dir, tc.name)
			if err := os.WriteFile(path, []byte("old"), 0o600); err != nil {
				t.Fatal(err)
			}
			type opened struct {
				f       *os.File
				fi      os.FileInfo
				err     error
				replErr error
			}
			// Open runs apart: were a FIFO's open to block, the test
			// fails rather than hangs.
			done := make(chan opened, 1)
			go func() {
				var o opened
				o.f, o.fi, o.err = open(path, 16, func() {
					if o.replErr = os.Remove(path); o.replErr == nil {
						o.replErr = tc.replace(path)
					}
				})
				done <- o
			}()
			o := testenv.Recv(t, done, 10*time.Second, "Open to return")
			if o.f != nil {
				defer o.f.Close()
			}
			if o.replErr != nil {
				t.Fatalf("replacing %s: %v", path, o.replErr)
			}
			if tc.is != nil {
				if !errors.Is(o.err, tc.is) || o.f != nil {
					t.Fatalf("Open of a name replaced by a %s = %v, %v; want no file and an error matching %v", tc.name, o.f, o.err, tc.is)
				}
				return
			}
			if o.err != nil {
				t.Fatalf("Open of a name replaced by a %s: %v", tc.name, o.err)
			}
			if b, err := ReadFrom(o.f, path, 16); err != nil || string(b) != "newer" || o.fi.Size() != 5 {
				t.Fatalf("Open of a name replaced by a %s read %q, %v (size %d); want the new file", tc.name, b, err, o.fi.Size())
			}
		})
	}
}
