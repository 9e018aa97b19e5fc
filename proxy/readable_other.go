//go:build !unix

package proxy

import (
	"errors"
	"net"
)

// canWaitReadable: without MSG_PEEK SSE streams stay on fasthttp's writer.
const canWaitReadable = false

func (c *upstreamConn) waitReadable() error {
	return errors.New("waitReadable is not supported on this platform")
}

// idleOK cannot look at the socket here; a close racing the request is
// left to roundTrip's retry.
func (c *upstreamConn) idleOK() bool { return true }

// clientClosed cannot look at the socket here: a client that left is
// noticed when a heartbeat write fails.
func clientClosed(net.Conn) bool { return false }

// awaitFirstByte returns at once here: without MSG_PEEK, a TLS
// connection stops being reclaimable as its handshake begins
// (tlsConn.Handshake).
func awaitFirstByte(net.Conn) {}

// clientSentMore cannot look at the socket here; nothing is detached
// (canWaitReadable), so no stream ends with its connection.
func clientSentMore(net.Conn) bool { return false }

// answerWaiting is never asked here: without epoll, an answer that comes
// while the body is sent is read once the body is (hangups.watchReadable).
func (c *upstreamConn) answerWaiting() answerSeen { return answerGoesOn }

// wake cannot shut the socket here: the caller closes it.
func wake(net.Conn) bool { return false }

// shut closes c; nil: nothing.
func shut(c net.Conn) {
	if c != nil {
		_ = c.Close()
	}
}

// initRaw: nothing here looks at the socket itself.
func (c *upstreamConn) initRaw() error {
	return errors.New("raw socket access is not supported on this platform")
}
