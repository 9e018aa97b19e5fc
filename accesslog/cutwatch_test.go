package accesslog

import (
	"io/fs"
	"testing"
)

// sizeInfo is a fs.FileInfo of a given size, for a stat the test makes up.
type sizeInfo struct {
	fs.FileInfo
	size int64
}

func (i sizeInfo) Size() int64 { return i.size }

// The file watcher took the logger's own cut of a part line (a full disk
// took part of a write) for a truncation by someone else when the cut came
// in the middle of one of its looks: measured on the built binary, a 64k
// tmpfs filled under load gave the warning "access log file was truncated
// (logrotate's copytruncate?)" with size 65099 and expected_min_size 65536,
// the part line's 437 bytes, and counted it in
// cubeproxy_accesslog_truncations_total, sending the operator after a
// copytruncate that never ran. The writer's counting and the watcher's look
// are played here in the two orders that did it, a look's reads on either
// side of the cut, with the file's size kept by hand; then a real
// truncation must still be found.
func TestOwnPartLineCutIsNoTruncation(t *testing.T) {
	const line, part = 100, 60
	tests := []struct {
		name string
		// stat is the look's stat of a file of size bytes whose part line
		// cut cuts off: it cuts it before or after looking at the size.
		stat func(size *int64, cut func()) int64
	}{
		{"cut between the look's first read and its stat", func(size *int64, cut func()) int64 {
			cut()
			return *size
		}},
		{"cut between the look's stat and its last read", func(size *int64, cut func()) int64 {
			s := *size
			cut()
			return s
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := new(fileBytes)
			var w fileWatch
			var size int64
			write := func(ask, n int64) {
				b.start(ask)
				size += n
				b.finish(ask, n)
			}
			cut := func() {
				b.cutting(part)
				size -= part
				b.cut(part)
			}
			look := func(what string, stat func() int64) {
				t.Helper()
				fi, low, high, _ := b.around(func() (fs.FileInfo, error) { return sizeInfo{size: stat()}, nil })
				if c := w.sized(b, fi.Size(), low, high); c != nil {
					t.Fatalf("%s: truncation found (size %d, expected_min_size %d), but only the logger cut its own part line", what, c.size, c.least)
				}
			}
			plain := func() int64 { return size }

			look("first look", plain)
			write(line, line)
			look("after a whole line", plain)
			write(line, part) // the disk took part of the next line
			look("the cut during the look", func() int64 { return tt.stat(&size, cut) })
			write(line, line) // space freed: the line written again, whole
			look("after the line written again", plain)
			write(line, line)
			look("after one more line", plain)

			size = 0 // a copytruncate
			_, low, high, _ := b.around(func() (fs.FileInfo, error) { return sizeInfo{}, nil })
			if w.sized(b, 0, low, high) == nil {
				t.Errorf("a truncation to 0 of a file of %d bytes not found", 3*line)
			}
		})
	}
}
