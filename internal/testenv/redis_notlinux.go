//go:build !linux

package testenv

import "os/exec"

// dieWithTest would have the kernel kill cmd's process with the test
// binary, which only Linux offers (Pdeathsig): elsewhere a test binary that
// ends without its cleanups leaves its redis-servers running.
func dieWithTest(*exec.Cmd) {}
