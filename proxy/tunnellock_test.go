package proxy

import (
	"crypto/tls"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// tlsPair returns the two ends of a real TLS connection over loopback TCP,
// handshake done, with small socket buffers so that a client that stops
// reading fills them quickly. Both ends close with the test.
func tlsPair(t *testing.T) (server, client *tls.Conn) {
	t.Helper()
	ca := testenv.NewCA(t, "tunnel test CA")
	cert := ca.Certificate(t, "ws.cube.test")
	ln := listen(t, "127.0.0.1:0")
	t.Cleanup(func() { ln.Close() })
	srvRaw, raw := acceptPair(t, ln)
	_ = raw.(*net.TCPConn).SetReadBuffer(4 << 10)
	_ = srvRaw.(*net.TCPConn).SetWriteBuffer(4 << 10)
	server = tls.Server(srvRaw, &tls.Config{Certificates: []tls.Certificate{cert}})
	client = tls.Client(raw, &tls.Config{RootCAs: ca.Pool(), ServerName: "ws.cube.test"})
	hs := make(chan error, 1)
	go func() { hs <- client.Handshake() }()
	if err := server.Handshake(); err != nil {
		t.Fatal(err)
	}
	if err := <-hs; err != nil {
		t.Fatal(err)
	}
	return server, client
}

// Closing a tunnel holds its lock across no I/O. crypto/tls's Close sends
// a TLS client a close_notify under a 5 s write deadline of its own, which
// a client that stopped reading makes it wait out; closed under the
// tunnel's lock, that held the tunnel's other copy (its deadlines, the cut
// of a client that stopped reading) and, worse, the drain's cut (under the
// registry's lock, so every stream's start and end) and a sandbox's kill
// (under its pool's), each up to 5 s per tunnel. A cut that comes while
// the close waits also ends that wait, closing the socket under it.
func TestTunnelCloseHoldsNoLockAcrossTLSWrite(t *testing.T) {
	server, _ := tlsPair(t) // the client end never reads
	// Fill the client's receive buffer and the server's send buffer: the
	// last write times out with no room left.
	buf := make([]byte, 16<<10)
	for {
		_ = server.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
		if _, err := server.Write(buf); err != nil {
			if !isTimeout(err) {
				t.Fatal(err)
			}
			break
		}
	}
	backendLn := listen(t, "127.0.0.1:0")
	t.Cleanup(func() { backendLn.Close() })
	_, backend := acceptPair(t, backendLn)
	tn := &tunnel{client: server, backend: backend}

	closed := make(chan struct{})
	go func() {
		tn.close() // the tunnel's own end: a copy finished
		close(closed)
	}()
	testenv.WaitFor(t, 3*time.Second, "close sending its close_notify to the client that does not read", func() bool {
		_, stacks := liveGoroutines()
		return strings.Contains(strings.Join(stacks, "\n"), "crypto/tls.(*Conn).closeNotify")
	})
	for _, tc := range []struct {
		name string
		call func()
	}{
		{"the other copy's write deadline", func() { _ = tn.moveWriteDeadline(tn.backend, time.Minute, &tn.sendDeadline) }},
		{"cutting a client that stopped reading", tn.cutClient},
		{"a kill's cut", func() { tn.killed.Store(true); tn.close() }},
	} {
		done := make(chan struct{})
		go func() {
			tc.call()
			close(done)
		}()
		select {
		case <-done:
		case <-time.After(time.Second):
			t.Errorf("%s waited for close's TLS write to the client", tc.name)
			<-done
		}
	}
	select {
	case <-closed:
	case <-time.After(time.Second):
		t.Error("the close kept waiting for its close_notify after a kill cut the tunnel")
		<-closed
	}
}
