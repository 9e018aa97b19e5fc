package proxy

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// teeConn keeps a copy of what its reads return.
type teeConn struct {
	net.Conn
	got bytes.Buffer
}

func (c *teeConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	c.got.Write(b[:n])
	return n, err
}

// A TLS client given the plain port (https:// with http_addr) gets a 400
// bad_request in clear text and the connection closed at once, on the
// plain listener and on the redirect listener alike, and the refusal is
// logged, as the README's TLS section says (nginx answers it 400 too). A
// real crypto/tls client sends its ClientHello; what comes back is read
// beneath it.
func TestTLSHandshakeOnPlainListenerAnswered400(t *testing.T) {
	h, logs := logHarness(t, "json")
	rln := listen(t, "127.0.0.1:0")
	go h.server.ServeRedirect(rln, "8443")

	for _, tc := range []struct {
		name, addr string
	}{
		{"plain listener", h.addr},
		{"redirect listener", rln.Addr().String()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			raw := &teeConn{Conn: dialRaw(t, tc.addr)}
			start := time.Now()
			err := tls.Client(raw, &tls.Config{ServerName: "3000-box.cube.test"}).Handshake()
			if err == nil || !strings.Contains(err.Error(), "does not look like a TLS handshake") {
				t.Fatalf("handshake error %v, want the client's \"does not look like a TLS handshake\"", err)
			}
			// The rest of the answer, up to the close (dialRaw's 10 s
			// deadline fails a connection left open).
			if _, err := io.Copy(&raw.got, raw.Conn); err != nil {
				t.Fatalf("after %d bytes: %v (the connection is not closed)", raw.got.Len(), err)
			}
			if took := time.Since(start); took > 5*time.Second {
				t.Errorf("answered and closed after %v, want at once", took)
			}
			resp, err := http.ReadResponse(bufio.NewReader(&raw.got), nil)
			if err != nil {
				t.Fatalf("answer %q: %v", raw.got.String(), err)
			}
			body, _ := io.ReadAll(resp.Body)
			checkProxyError(t, resp, string(body), 400, CodeBadRequest)
			if !resp.Close {
				t.Error("the 400 does not say Connection: close")
			}
			id := resp.Header.Get(HeaderRequestID)
			if id == "" {
				t.Fatalf("the 400 has no %s", HeaderRequestID)
			}
			if e := logs.waitJSON(t, id); e["status"] != float64(400) || e["error_code"] != CodeBadRequest {
				t.Errorf("logged %v %v, want 400 %s", e["status"], e["error_code"], CodeBadRequest)
			}
		})
	}
}
