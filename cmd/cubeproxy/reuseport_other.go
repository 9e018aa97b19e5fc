//go:build !linux

package main

import (
	"errors"
	"log/slog"
	"syscall"
)

// reusePortSupported: see reuseport_linux.go.
const reusePortSupported = false

// reusePort is never called: checkListeners refuses reuse_port here.
func reusePort(_, _ string, _ syscall.RawConn) error {
	return errors.New("reuse_port is supported on Linux only")
}

// warnTakeover is never called: checkListeners refuses reuse_port here.
func warnTakeover(*slog.Logger) {}

// portShared: no port is shared here (see reuseport_linux.go).
func portShared(string) bool { return false }

// reservePorts is never called: checkListeners refuses reuse_port here.
func reservePorts([][2]string) (func(), error) { return func() {}, nil }
