package proxy

import (
	"crypto/tls"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/cube-sandbox/cubeproxy/accesslog"
	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// A TLS handshake the proxy's own certificate lookup refused carried no
// request, and is neither logged nor counted, as any other failed
// handshake: the acme source answers a name it may serve but cannot now
// (an on-demand order failed or over on_demand_rate, the route store or
// the ACME storage failing, the wildcard not yet obtained) with an error
// of its own, which crypto/tls hands on as it stands, not as a "tls: "
// error. Earlier builds took it for a malformed request: every such
// handshake wrote a 400 bad_request line with no host or method to the
// access log and counted it, a line per handshake a client retried.
func TestRefusedCertificateLogsNoRequest(t *testing.T) {
	t.Parallel()
	h, buf := logHarness(t, accesslog.FormatJSON)
	ca := testenv.NewCA(t, "proxy test CA")
	cert := ca.Certificate(t, "*.cube.test")
	ln := listen(t, "127.0.0.1:0")
	go h.server.ServeTLS(ln, &tls.Config{GetCertificate: func(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
		switch hello.ServerName {
		case "50005-later.cube.test":
			return nil, errors.New("on-demand issuance for 50005-later.cube.test: on-demand issuance rate limit reached")
		case "50005-unknown.cube.test":
			return nil, nil // crypto/tls's own "tls: no certificates configured"
		}
		return &cert, nil
	}})
	for _, name := range []string{"50005-later.cube.test", "50005-unknown.cube.test"} {
		c := tls.Client(dialRaw(t, ln.Addr().String()), &tls.Config{RootCAs: ca.Pool(), ServerName: name})
		if err := c.Handshake(); err == nil {
			t.Fatalf("%s: the handshake succeeded", name)
		}
		c.Close()
	}
	// The log is written in order: once a later request's line is there,
	// so is any line of the handshakes'.
	later := h.req("GET", "50005-none.cube.test", "/", nil)
	later.Header.Set("X-Cube-Request-Id", "after-refused-handshakes")
	resp := h.do(later)
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Fatalf("later request: got %d, want 404", resp.StatusCode)
	}
	buf.waitJSON(t, "after-refused-handshakes")
	for _, ln := range strings.Split(buf.String(), "\n") {
		var e map[string]any
		if json.Unmarshal([]byte(ln), &e) == nil && e["x_cube_request_id"] != "after-refused-handshakes" {
			t.Errorf("a refused handshake was logged as a request: %s", ln)
		}
	}
}
