package proxy

import (
	"crypto/tls"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// A tunnel that a kill or the drain cuts closes its TLS client at once,
// even when that client stopped reading: crypto/tls's Close sends a
// close_notify with a 5 s write deadline of its own, and into a full send
// buffer that alert waited the five seconds, per tunnel, under the pool's
// lock (a kill) or the registry's (the drain). The client's send buffer is
// filled here through the TCP connection under the TLS one, so that no
// write is in flight when the tunnel is cut, as when the sandbox's last
// burst filled it.
func TestTunnelCutClosesStalledTLSClientAtOnce(t *testing.T) {
	ca := testenv.NewCA(t, "tunnel cut CA")
	cert := ca.Certificate(t, "*.cube.test")
	for _, tc := range []struct {
		name string
		mark func(*tunnel)
	}{
		{"killed", func(tn *tunnel) { tn.killed.Store(true) }},
		{"drain", func(tn *tunnel) { tn.drainCut.Store(true) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ln := listen(t, "127.0.0.1:0")
			t.Cleanup(func() { ln.Close() })
			s, c := acceptPair(t, ln)
			server := tls.Server(s, &tls.Config{Certificates: []tls.Certificate{cert}})
			client := tls.Client(c, &tls.Config{RootCAs: ca.Pool(), ServerName: "x.cube.test"})
			errc := make(chan error, 1)
			go func() { errc <- client.Handshake() }()
			if err := server.Handshake(); err != nil {
				t.Fatal(err)
			}
			if err := <-errc; err != nil {
				t.Fatal(err)
			}
			testenv.Fill(t, rawConn(s)) // the client reads nothing from here on

			backend, _ := acceptPair(t, ln)
			tn := &tunnel{client: server, backend: backend}
			tc.mark(tn)
			start := time.Now()
			tn.close()
			if d := time.Since(start); d > time.Second {
				t.Errorf("cutting the tunnel took %v: its TLS client's close waited", d)
			}
		})
	}
}
