//go:build unix

package routing

import (
	"io/fs"
	"os"
	"syscall"
)

// keepOwner gives f, the new routes file, the owner and group of old, the
// file it replaces, and reports whether f ended in old's group: when not,
// old's group bits would give f to another group (the proxy's own), and
// the caller clears them. An owner that cannot be kept (a proxy not
// running as root) is no leak: the owner bits are the proxy's to use.
func keepOwner(f *os.File, old fs.FileInfo) bool {
	o, ok := old.Sys().(*syscall.Stat_t)
	if !ok {
		return true
	}
	cur, err := f.Stat()
	if err != nil {
		return false
	}
	if c, ok := cur.Sys().(*syscall.Stat_t); ok && c.Uid == o.Uid && c.Gid == o.Gid {
		return true
	}
	if f.Chown(int(o.Uid), int(o.Gid)) == nil {
		return true
	}
	return f.Chown(-1, int(o.Gid)) == nil
}
