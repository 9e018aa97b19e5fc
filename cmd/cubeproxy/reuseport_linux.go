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
// set it (a proxy started with reuse_port), so this one lacks it.
func portShared(addr string) bool {
	fd, err := bindShared(addr)
	if err != nil || fd < 0 {
		return false
	}
	unix.Close(fd)
	return true
}

// reservePorts binds a socket with SO_REUSEPORT to each of addrs (setting
// name and address), as the listener will be, and returns what closes
// them, or the first failure as listenError words it. Bound, never
// listening: a listening socket joins its port's group, and the kernel
// hands it connections at once; one of a start that then failed on a later
// address (a metrics_addr in use) closed over them, resetting clients the
// running proxy would have served.
func reservePorts(addrs [][2]string) (release func(), err error) {
	var fds []int
	release = func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	}
	for _, ka := range addrs {
		fd, err := bindShared(ka[1])
		if err != nil {
			release()
			return nil, listenError(ka[0], ka[1], true, err)
		}
		if fd >= 0 {
			fds = append(fds, fd)
		}
	}
	return release, nil
}

// bindShared binds a TCP socket with SO_REUSEPORT (and SO_REUSEADDR, as Go
// sets on a listener) to addr without listening on it, and returns its
// descriptor; -1 and no error when no such socket could be made for it (a
// name that does not resolve, a zone, no IPv6): the listener's own open
// then says what is wrong. The bind's error reads as a listener's
// ("listen tcp <addr>: bind: …").
func bindShared(addr string) (int, error) {
	ta, err := net.ResolveTCPAddr("tcp", addr)
	if err != nil || ta.Zone != "" {
		return -1, nil
	}
	// Go listens on a wildcard address (none, 0.0.0.0 or ::) with one
	// IPv6 socket that takes IPv4 too, so the probe binds that.
	family, sa := unix.AF_INET6, unix.Sockaddr(&unix.SockaddrInet6{Port: ta.Port})
	if ip4 := ta.IP.To4(); ip4 != nil && !ip4.IsUnspecified() {
		sa4 := &unix.SockaddrInet4{Port: ta.Port}
		copy(sa4.Addr[:], ip4)
		family, sa = unix.AF_INET, sa4
	} else if ta.IP != nil && !ta.IP.IsUnspecified() {
		copy(sa.(*unix.SockaddrInet6).Addr[:], ta.IP.To16())
	}
	fd, err := unix.Socket(family, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, unix.IPPROTO_TCP)
	if err != nil {
		return -1, nil
	}
	if family == unix.AF_INET6 {
		_ = unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_V6ONLY, 0)
	}
	if unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEADDR, 1) != nil ||
		unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEPORT, 1) != nil {
		unix.Close(fd)
		return -1, nil
	}
	if err := unix.Bind(fd, sa); err != nil {
		unix.Close(fd)
		return -1, &net.OpError{Op: "listen", Net: "tcp", Addr: ta, Err: os.NewSyscallError("bind", err)}
	}
	return fd, nil
}
