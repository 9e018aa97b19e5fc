package proxy

import (
	"bufio"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/accesslog"
)

// A keep-alive connection's later head that stalls gets its 408, whatever
// time is left of the write deadline its previous answer set. fasthttp
// writes the error answer under that deadline: with nginx's 60 s for both
// client.read_timeout and client.write_timeout, every such 408 came after
// it, and the client saw the connection close with nothing, while the
// access log said 66 bytes were sent (measured on the binary: a head begun
// 1 s after an answer, closed bare at 60 s).
func TestStalledLaterHeadAnswered(t *testing.T) {
	t.Parallel()
	h, buf := logHarness(t, accesslog.FormatJSON, func(o *harnessOpts) {
		// The TLS case's handshake must end within the write timeout of
		// its start (fasthttp's getNextProto sets that deadline), and it
		// and the first request within the read timeout of the accept
		// (TestTLSHandshakeAndFirstHeadShareTheReadTimeout). At 100 and
		// 300 ms, a handshake slower than 100 ms (one took 296 ms on
		// loaded cores) was cut: EOF. 0.6 s left was found enough there.
		o.srv.ClientReadTimeout = time.Second
		o.srv.ClientBodyTimeout = time.Second
		// Shorter than the read and body timeouts: the previous answer's
		// write deadline has passed when the head's or body's read times
		// out.
		o.srv.ClientWriteTimeout = 600 * time.Millisecond
	})
	tlsAddr, roots := serveTLS(t, h)
	rln := listen(t, "127.0.0.1:0")
	go h.server.ServeRedirect(rln, "8443")
	const head = "GET /slow HTTP/1.1\r\nHost: 50005-stall.cube.test\r\n"
	const body = "POST /slow HTTP/1.1\r\nHost: 50005-stall.cube.test\r\nContent-Length: 100\r\n\r\nabc"
	for _, tc := range []struct {
		name, sent    string
		tls, redirect bool
	}{
		{"part of a head", head, false, false},
		{"part of a small body", body, false, false},
		{"TLS, part of a head", head, true, false},
		{"redirect, part of a head", head, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var c net.Conn
			switch {
			case tc.tls:
				tlc := tls.Client(dialRaw(t, tlsAddr), &tls.Config{RootCAs: roots, ServerName: "50005-stall.cube.test"})
				if err := tlc.Handshake(); err != nil {
					t.Fatal(err)
				}
				c = tlc
			case tc.redirect:
				c = dialRaw(t, rln.Addr().String())
			default:
				c = dialRaw(t, h.addr)
			}
			br := bufio.NewReader(c)
			keptRequest(t, c, br, "GET / HTTP/1.1\r\nHost: 50005-none.cube.test\r\n\r\n")
			if _, err := io.WriteString(c, tc.sent); err != nil {
				t.Fatal(err)
			}
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatalf("no answer to the stalled request: %v (log: %s)", err, buf.String())
			}
			resp.Body.Close()
			if resp.StatusCode != 408 {
				t.Fatalf("got %d, want 408", resp.StatusCode)
			}
		})
	}
}
