//go:build unix && !linux

package main

import "syscall"

// groupAttr starts a child in a process group of its own. Only Linux has
// Pdeathsig: elsewhere a test binary that dies without its cleanup leaves
// the group running.
func groupAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}
