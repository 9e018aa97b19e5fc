//go:build !unix

package main

import "syscall"

// No SIGUSR1 or SIGUSR2 here: numbers no signal has, never delivered.
const (
	sigReopen  = syscall.Signal(-1)
	sigUpgrade = syscall.Signal(-2)
)
