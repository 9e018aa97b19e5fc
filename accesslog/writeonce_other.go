//go:build !unix

package accesslog

import "os"

// newFileWriter returns f.Write: one write(2) a call is Unix's.
func newFileWriter(f *os.File) func([]byte) (int, error) { return f.Write }
