//go:build !linux

package proxy

import "net"

// waitConn returns at once: elsewhere the reserve is spent on the accept
// that failed, whether or not a connection waits (see acceptReserved).
func waitConn(net.Listener, <-chan struct{}) error { return nil }
