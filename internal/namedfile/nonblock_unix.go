//go:build unix

package namedfile

import "syscall"

// noBlock makes opening a FIFO return at once, whether or not a writer
// has it open.
const noBlock = syscall.O_NONBLOCK
