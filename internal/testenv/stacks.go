package testenv

import (
	"runtime"
	"strings"
)

// Stacks returns the stack of every goroutine, one string each, as
// runtime.Stack prints them; the buffer grows until all of them fit.
func Stacks() []string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return strings.Split(string(buf[:n]), "\n\n")
		}
		buf = make([]byte, 2*len(buf))
	}
}
