//go:build !unix

package proclog

import "io"

// Pollable returns out unchanged: the non-blocking duplicate it makes of a
// stdout pipe on Unix has no counterpart here.
func Pollable(out io.Writer) (w io.Writer, closeOut func() error) {
	return out, func() error { return nil }
}
