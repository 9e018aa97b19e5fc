//go:build !unix

package routing

import (
	"io/fs"
	"os"
)

// keepOwner reports true: outside Unix a file has no owner and group bits
// to keep.
func keepOwner(*os.File, fs.FileInfo) bool { return true }
