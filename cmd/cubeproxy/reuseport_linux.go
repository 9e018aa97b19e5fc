package main

import (
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"
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

// warnTakeover logs what a takeover of this process's ports will reset.
func warnTakeover(log *slog.Logger) {
	if w := takeoverWarning(os.ReadFile(migrateReqPath)); w != "" {
		log.Warn(w)
	}
}

// migrateReqPath is the sysctl that lets the kernel move connections
// queued on a closing SO_REUSEPORT listener to another one of its group.
const migrateReqPath = "/proc/sys/net/ipv4/tcp_migrate_req"

// takeoverWarning says what a takeover will reset, given the sysctl's
// content as read (or the error reading it), or "" when nothing. Without
// it, connections still in this process's accept queue when its drain
// closes the listeners are reset: an operator who set reuse_port to
// refuse no connection should hear that at start, not from clients.
func takeoverWarning(content []byte, err error) string {
	switch {
	case err != nil:
		return "reuse_port: this kernel cannot move queued connections to the next process (no net.ipv4.tcp_migrate_req, Linux 5.14+): the few still queued when this process stops will be reset"
	case strings.TrimSpace(string(content)) == "0":
		return "reuse_port: net.ipv4.tcp_migrate_req is 0: connections still queued when this process stops will be reset; set it to 1 in this network namespace to hand them to the next process"
	}
	return ""
}

// portShared reports whether addr's port, found in use by a listener
// opened without SO_REUSEPORT, could be bound with it: the process there
// set it (a proxy started with reuse_port), so this one lacks it. It
// binds a socket and never listens on it: a listening one would join the
// port's group and could take a client's connection, reset at its close.
func portShared(addr string) bool {
	ta, err := net.ResolveTCPAddr("tcp", addr)
	if err != nil {
		return false
	}
	// Go listens on a wildcard address (none, 0.0.0.0 or ::) with one
	// IPv6 socket that takes IPv4 too, so the probe binds that.
	family, sa := unix.AF_INET6, unix.Sockaddr(&unix.SockaddrInet6{Port: ta.Port})
	if ip4 := ta.IP.To4(); ip4 != nil && !ip4.IsUnspecified() {
		sa4 := &unix.SockaddrInet4{Port: ta.Port}
		copy(sa4.Addr[:], ip4)
		family, sa = unix.AF_INET, sa4
	} else if ta.IP != nil && !ta.IP.IsUnspecified() {
		sa6 := sa.(*unix.SockaddrInet6)
		copy(sa6.Addr[:], ta.IP.To16())
	}
	fd, err := unix.Socket(family, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, unix.IPPROTO_TCP)
	if err != nil {
		return false
	}
	defer unix.Close(fd)
	if family == unix.AF_INET6 {
		_ = unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_V6ONLY, 0)
	}
	if unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEPORT, 1) != nil {
		return false
	}
	return unix.Bind(fd, sa) == nil
}
