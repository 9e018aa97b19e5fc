//go:build unix

package accesslog

import (
	"io/fs"
	"syscall"
)

// deleted reports whether the file fi describes (from an open file's
// Stat) has no name left.
func deleted(fi fs.FileInfo) bool {
	st, ok := fi.Sys().(*syscall.Stat_t)
	return ok && st.Nlink == 0
}
