package accesslog

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// A write the disk took only part of (full, or over the file size limit)
// left that part line in the file: unparseable, and, once space was
// freed, ended by a newline that after a truncation (an operator's, or
// copytruncate's) made the file's first line empty. The part line is cut
// off: every line of the file stays whole. The file size limit
// (RLIMIT_FSIZE) makes the kernel take part of a write exactly as a full
// disk does, without a mount; Go ignores its SIGXFSZ.
func TestPartLineCutFromFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "access.log")
	l, err := New(Config{Format: FormatCube, Path: path}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	l.Log(&Entry{Time: testTime, RequestID: "first"})
	var one int64
	testenv.WaitFor(t, 5*time.Second, "the first line written", func() bool {
		fi, err := os.Stat(path)
		one = fi.Size()
		return err == nil && one > 0
	})

	var old syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_FSIZE, &old); err != nil {
		t.Fatal(err)
	}
	limit := old
	limit.Cur = uint64(one + one/2) // room for half of the next line
	if err := syscall.Setrlimit(syscall.RLIMIT_FSIZE, &limit); err != nil {
		t.Skipf("cannot limit the file size: %v", err)
	}
	restore := func() {
		if err := syscall.Setrlimit(syscall.RLIMIT_FSIZE, &old); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(restore)
	l.Log(&Entry{Time: testTime, RequestID: "torn"})
	testenv.WaitFor(t, 5*time.Second, "the torn line counted as dropped", func() bool { return l.Dropped() == 1 })
	restore()
	if fi, err := os.Stat(path); err != nil || fi.Size() != one {
		t.Errorf("file of %d bytes after the torn write (%v), want %d: the first line alone", fi.Size(), err, one)
	}

	if err := os.Truncate(path, 0); err != nil { // what copytruncate does
		t.Fatal(err)
	}
	l.Log(&Entry{Time: testTime, RequestID: "kept"})
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
	if len(lines) != 1 || !bytes.HasSuffix(b, []byte("\n")) || len(strings.Split(lines[0], "||")) != 22 ||
		strings.Split(lines[0], "||")[19] != "kept" {
		t.Errorf("file holds %q, want the one whole line logged after the truncation", b)
	}
}
