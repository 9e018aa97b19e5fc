package main

import "syscall"

// groupAttr starts a child in a process group of its own that the kernel
// sends SIGTERM when the thread that started it exits (Pdeathsig): a test
// binary that dies anyway (a panic elsewhere in the package, a kill) takes
// the group's leader with it.
func groupAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
}
