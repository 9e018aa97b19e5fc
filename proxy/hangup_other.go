//go:build !linux

package proxy

import (
	"net"
	"syscall"
)

// hangups needs epoll; elsewhere a stream's departed client is found when
// its next heartbeat is due, and a request's waiting for its answer's head
// every clientCheck (clientHungUp).
type hangups struct{}

func newHangups() (*hangups, error) { return nil, nil }

func (h *hangups) watch(net.Conn, hangUpper) uint64                { return 0 }
func (h *hangups) watchReadable(syscall.RawConn, hangUpper) uint64 { return 0 }
func (h *hangups) unwatch(uint64)                                  {}
func (h *hangups) run()                                            {}
func (h *hangups) close()                                          {}

// clientHungUp reports whether the client closed c (a FIN with nothing
// unread before it, or a reset); without POLLRDHUP, a peek.
func clientHungUp(c net.Conn) bool { return clientClosed(c) }

// clientReset reports whether the peer reset c; without poll's POLLERR, a
// peek, which also takes a FIN with nothing unread before it for one.
func clientReset(c net.Conn) bool { return clientClosed(c) }
