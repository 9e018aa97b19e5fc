package main

import (
	"fmt"
	"syscall"

	"golang.org/x/sys/unix"
)

// reusePortSupported: elsewhere SO_REUSEPORT either does not exist or does
// not spread connections over the sockets that share a port (on macOS the
// last one bound takes them all), so a takeover would not be gradual.
const reusePortSupported = true

// reusePort sets SO_REUSEPORT on a socket before it is bound.
func reusePort(_, _ string, c syscall.RawConn) error {
	var serr error
	if err := c.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEPORT, 1)
	}); err != nil {
		return err
	}
	if serr != nil {
		return fmt.Errorf("setsockopt SO_REUSEPORT: %w", serr)
	}
	return nil
}
