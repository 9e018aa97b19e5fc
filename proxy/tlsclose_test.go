package proxy

import (
	"crypto/tls"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// A TLS connection whose write timed out (its client took nothing for
// client.write_timeout) closes at once, without the close_notify alert
// crypto/tls's Close sends under a 5 s write deadline of its own: into the
// socket the client had stopped emptying, it held every such close 5 s
// more, with its goroutine, its descriptor and its access log line
// (measured on the binary, a WebSocket over HTTPS whose client stopped
// reading, write_timeout 3s: closed and logged after 8.0 s, Close itself
// 5.0 s; over HTTP 3.0 s; nginx 1.22.1 over TLS closed at 3 s, as it sends
// no close_notify after a timeout).
func TestTLSCloseAfterAWriteTimeoutIsImmediate(t *testing.T) {
	ca := testenv.NewCA(t, "proxy test CA")
	cert := ca.Certificate(t, "a.cube.test")
	const timeout = 300 * time.Millisecond
	ln := &tlsListener{Listener: listen(t, "127.0.0.1:0"), cfg: &tls.Config{Certificates: []tls.Certificate{cert}},
		handshakes: &handshakes{}, sendTimeout: timeout}
	client := tls.Client(dialSmallWindow(t, ln.Addr().String()), &tls.Config{RootCAs: ca.Pool(), ServerName: "a.cube.test"})
	go func() { _ = client.Handshake() }() // then it reads nothing
	c, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	tc := c.(*tlsConn)
	if err := tc.Handshake(); err != nil {
		t.Fatalf("handshake: %v", err)
	}
	chunk := []byte(strings.Repeat("x", 64<<10))
	_ = c.SetWriteDeadline(time.Now().Add(timeout))
	for err == nil {
		_, err = c.Write(chunk)
	}
	if ne, ok := err.(net.Error); !ok || !ne.Timeout() {
		t.Fatalf("write to a client that reads nothing: %v, want a timeout", err)
	}
	// Fill what room the send buffer still had, byte by byte beneath the
	// TLS layer, as a client that took nothing for the timeout leaves it.
	raw := tc.NetConn()
	_ = raw.SetWriteDeadline(time.Now().Add(timeout))
	for {
		if _, err := raw.Write([]byte{0}); err != nil {
			break
		}
	}
	start := time.Now()
	_ = c.Close()
	if took := time.Since(start); took > time.Second {
		t.Fatalf("Close after a write timeout took %v, want at once", took.Round(10*time.Millisecond))
	}
}
