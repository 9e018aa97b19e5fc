//go:build unix

package accesslog

import (
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A short write to the log file (a full disk) while another process
// appends to the same file (a second instance, the old process of a
// reuse_port takeover): the rest of the line was written in a second
// write(2), after the other writer's line, which broke both (measured with
// the binary, two instances on a tmpfs kept full: two broken lines in 2 of
// 4 runs of 60,000 requests), and the part line was cut by its length
// from the end of the file, which held the other writer's line by then.
// Now each write starts at a line's start, and a part line is cut only
// while the file ends with it. The file watcher's bounds on the bytes
// written (fileBytes) take in the cut: it finds a truncation in the
// copytruncate alone, not in the logger's own cut of its part line. The
// short write is the kernel's (a real
// write of part of p), so is the other writer's line (its own O_APPEND
// descriptor); only their order is chosen.
func TestShortWriteToSharedFile(t *testing.T) {
	lines := []string{cubeLine(&Entry{RequestID: "a"}) + "\n", cubeLine(&Entry{RequestID: "b"}) + "\n",
		cubeLine(&Entry{RequestID: "c"}) + "\n"}
	other := cubeLine(&Entry{RequestID: "other"}) + "\n"
	p := []byte(strings.Join(lines, ""))
	short := len(lines[0]) + 10 // the first line and part of the second
	tests := []struct {
		name string
		// then runs after the short write, before it returns: the other
		// writer of the file (w appends a line) or the file system's
		// space. It returns how many bytes the next writes may take.
		then      func(t *testing.T, path string, w *os.File) (room int)
		want      string // the file
		wantN     int    // returned by Write
		kept      int
		failed    bool
		truncated bool // by then, as the file watcher should find
	}{
		{"room again at once", func(*testing.T, string, *os.File) int { return len(p) },
			strings.Join(lines, ""), len(p), 0, false, false},
		{"no room for a whole line", func(*testing.T, string, *os.File) int { return 10 },
			lines[0], len(lines[0]), 1, true, false},
		{"another writer appends after the part line", func(t *testing.T, _ string, w *os.File) int {
			if _, err := w.WriteString(other); err != nil {
				t.Fatal(err)
			}
			return len(p)
		}, lines[0] + lines[1][:10] + other, len(lines[0]), 1, true, false},
		{"copytruncate, then another writer appends", func(t *testing.T, path string, w *os.File) int {
			if err := os.Truncate(path, 0); err != nil {
				t.Fatal(err)
			}
			if _, err := w.WriteString(other); err != nil {
				t.Fatal(err)
			}
			return len(p)
		}, other, len(lines[0]), 1, true, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "access.log")
			f, err := openLog(path)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			w, err := openLog(path) // the other process's descriptor
			if err != nil {
				t.Fatal(err)
			}
			defer w.Close()
			s := newSink(f, f)
			write, calls, room := s.writeOnce, 0, 0
			s.writeOnce = func(b []byte) (int, error) {
				if calls++; calls == 1 {
					n, err := write(b[:short])
					room = tt.then(t, path, w)
					return n, err
				}
				return write(b[:min(len(b), room)])
			}
			var watch fileWatch
			watch.sized(s.written, 0, 0, 0) // the file as opened: empty
			n, err := s.Write(p)
			if (err != nil) != tt.failed || n != tt.wantN || s.kept != tt.kept && tt.failed {
				t.Errorf("Write = %d, %v (kept %d), want %d, failed %v (kept %d)", n, err, s.kept, tt.wantN, tt.failed, tt.kept)
			}
			if s.midLine {
				t.Errorf("midLine set: the next write would start with an empty line")
			}
			b, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if string(b) != tt.want {
				t.Errorf("file holds\n%q\nwant\n%q", b, tt.want)
			}
			_, low, high, _ := s.written.around(func() (fs.FileInfo, error) { return nil, nil })
			if cut := watch.sized(s.written, int64(len(b)), low, high); (cut != nil) != tt.truncated {
				t.Errorf("file watcher found truncation %+v (written: begun %d, done %d), want truncated %v",
					cut, s.written.begun.Load(), s.written.done.Load(), tt.truncated)
			}
		})
	}
}
