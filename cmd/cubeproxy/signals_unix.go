//go:build unix

package main

import "syscall"

// nginx's signals for "reopen the log files" (USR1) and "binary upgrade"
// (USR2), which operators and logrotate files carried over send.
const (
	sigReopen  = syscall.SIGUSR1
	sigUpgrade = syscall.SIGUSR2
)
