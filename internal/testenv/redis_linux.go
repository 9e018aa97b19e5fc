//go:build linux

package testenv

import (
	"os/exec"
	"syscall"
)

// dieWithTest has the kernel kill cmd's process when the thread that
// started it, a thread of the test binary, exits. A test binary that
// ends past its -timeout, or on one test's panic, runs no other test's
// cleanup: one run whose test panicked left 46 redis-servers of the
// parallel tests beside it running for the rest of the machine's life,
// holding their ports and their cluster state.
func dieWithTest(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
