package main

import (
	"context"
	"net"
)

// listenTCP opens a TCP listener on addr. With reuse set the socket gets
// SO_REUSEPORT first, so that a second process started the same way can
// bind the same port while this one still serves: the new version takes
// over the ports before the old one drains, and no client is refused in
// between (Kubernetes' DaemonSet maxSurge with host networking, or two
// processes under one supervisor).
func listenTCP(ctx context.Context, addr string, reuse bool) (net.Listener, error) {
	var lc net.ListenConfig
	if reuse {
		lc.Control = reusePort
	}
	return lc.Listen(ctx, "tcp", addr)
}
