package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// End-to-end TLS tests: the whole program (serve) with a YAML config, real
// listeners, real certificates and a real ACME server (pebble in-process).

// tlsProxy is one cubeproxy running in-process.
type tlsProxy struct {
	a         *app
	logs      *syncBuffer // its process log
	https     string      // host:port of the HTTPS listener
	http      string      // host:port of the plain HTTP listener
	httpsPort string
	stop      func() // cancel serve and wait for it (also run at cleanup)
}

// startTLSProxy writes yamlBody to a config file and runs serve with it
// until the test ends; the proxy's logs are printed when the test fails.
func startTLSProxy(t *testing.T, yamlBody string) *tlsProxy {
	t.Helper()
	path := filepath.Join(t.TempDir(), "cubeproxy.yaml")
	if err := os.WriteFile(path, []byte(yamlBody), 0o600); err != nil {
		t.Fatal(err)
	}
	r := runServe(t, []string{"--config", path}, noEnv)
	a := r.a
	p := &tlsProxy{a: a, logs: r.logs, https: addrOf(a.httpsLn), http: addrOf(a.httpLn), stop: r.stop}
	if p.https != "" {
		_, p.httpsPort, _ = net.SplitHostPort(p.https)
	}
	return p
}

// tlsConfigYAML is a loopback config for domain cube.test with the given
// routes (sandbox id -> backend port, exposed as container port 50005) and
// tls: section.
func tlsConfigYAML(t *testing.T, routes map[string]int, tlsSection string) string {
	t.Helper()
	var rb strings.Builder
	rb.WriteString("routes:\n")
	for id, port := range routes {
		fmt.Fprintf(&rb, "  %s:\n    HostIP: \"127.0.0.1\"\n    \"50005\": \"%d\"\n", id, port)
	}
	if len(routes) == 0 {
		rb.Reset()
		rb.WriteString("routes: {}\n")
	}
	routesFile := filepath.Join(t.TempDir(), "routes.yaml")
	if err := os.WriteFile(routesFile, []byte(rb.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf(`http_addr: "127.0.0.1:0"
https_addr: "127.0.0.1:0"
admin_addr: "127.0.0.1:0"
domains: ["cube.test"]
routes: %q
drain_timeout: 2s
log_level: debug
access_log:
  format: "off"
%s`, routesFile, tlsSection)
}

// tlsWhoami is a sandbox backend that names itself and echoes what it got.
func tlsWhoami(t *testing.T, id string) int {
	return tlsBackend(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "sandbox=%s host=%s proto=%s uri=%s", id, r.Host, r.Header.Get("X-Forwarded-Proto"), r.RequestURI)
	}))
}

// tlsBackend serves h over plain HTTP on loopback and returns its port.
func tlsBackend(t *testing.T, h http.Handler) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().(*net.TCPAddr).Port
}

// tlsClientConn is one TLS connection carrying HTTP/1.1 requests, so a
// test controls SNI, ALPN and keep-alive exactly.
type tlsClientConn struct {
	c  *tls.Conn
	br *bufio.Reader
}

// dialTLSProxy connects to addr and performs the handshake with cfg; an
// empty cfg.ServerName sends no SNI (a client dialing the node IP).
func dialTLSProxy(addr string, cfg *tls.Config) (*tlsClientConn, error) {
	raw, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return nil, err
	}
	c := tls.Client(raw, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := c.HandshakeContext(ctx); err != nil {
		raw.Close()
		return nil, err
	}
	return &tlsClientConn{c: c, br: bufio.NewReader(c)}, nil
}

// get sends GET uri with the Host header host and returns status and body.
func (c *tlsClientConn) get(host, uri string) (int, string, error) {
	_ = c.c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := fmt.Fprintf(c.c, "GET %s HTTP/1.1\r\nHost: %s\r\n\r\n", uri, host); err != nil {
		return 0, "", err
	}
	resp, err := http.ReadResponse(c.br, nil)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), err
}

func (c *tlsClientConn) leaf() *x509.Certificate { return c.c.ConnectionState().PeerCertificates[0] }

func (c *tlsClientConn) close() { _ = c.c.Close() }

// trustSNI verifies the server against pool for name, sent as SNI.
func trustSNI(pool *x509.CertPool, name string) *tls.Config {
	return &tls.Config{RootCAs: pool, ServerName: name, NextProtos: []string{"http/1.1"}}
}

// trustNoSNI sends no SNI and verifies the chain against pool for name (the
// Host the requests carry) by hand, as a client dialing an IP would.
func trustNoSNI(pool *x509.CertPool, name string) *tls.Config {
	return &tls.Config{
		NextProtos:         []string{"http/1.1"},
		InsecureSkipVerify: true, // replaced by VerifyConnection
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return errors.New("no peer certificate")
			}
			inter := x509.NewCertPool()
			for _, c := range cs.PeerCertificates[1:] {
				inter.AddCert(c)
			}
			_, err := cs.PeerCertificates[0].Verify(x509.VerifyOptions{Roots: pool, Intermediates: inter, DNSName: name})
			return err
		},
	}
}

// tlsHTTPClient is a net/http client over TLS with cfg.
func tlsHTTPClient(t *testing.T, cfg *tls.Config) *http.Client {
	tr := &http.Transport{TLSClientConfig: cfg}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 30 * time.Second}
}

// files source: a test CA and a wildcard for cube.test (what mkcert makes).
// SNI and no-SNI clients both get the wildcard, requests are routed by Host,
// and replaced files are served without a restart.
func TestTLSFilesWildcard(t *testing.T) {
	ca := testenv.NewCA(t, "cubeproxy test CA")
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "cube.test.pem"), filepath.Join(dir, "cube.test-key.pem")
	first := ca.WritePair(t, certFile, keyFile, "cube.test", "*.cube.test")

	p := startTLSProxy(t, tlsConfigYAML(t, map[string]int{"abc": tlsWhoami(t, "abc"), "xyz": tlsWhoami(t, "xyz")}, fmt.Sprintf(`tls:
  source: files
  domain: cube.test
  files:
    - cert_file: %q
      key_file: %q
  reload_interval: 50ms
`, certFile, keyFile)))

	tests := []struct {
		name string
		cfg  *tls.Config
	}{
		{"SNI of the sandbox host", trustSNI(ca.Pool(), "50005-abc.cube.test")},
		{"no SNI (client dials the IP)", trustNoSNI(ca.Pool(), "50005-abc.cube.test")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := dialTLSProxy(p.https, tt.cfg)
			if err != nil {
				t.Fatalf("handshake: %v", err)
			}
			defer c.close()
			if got := c.leaf().SerialNumber; got.Cmp(first.SerialNumber) != 0 {
				t.Fatalf("served serial %v, want the wildcard's %v", got, first.SerialNumber)
			}
			if p := c.c.ConnectionState().NegotiatedProtocol; p != "http/1.1" {
				t.Fatalf("ALPN %q, want http/1.1", p)
			}
			// Two sandboxes on one connection: routing follows Host, not SNI.
			for _, id := range []string{"abc", "xyz"} {
				host := "50005-" + id + ".cube.test"
				status, body, err := c.get(host, "/p?q=1")
				if err != nil {
					t.Fatal(err)
				}
				want := fmt.Sprintf("sandbox=%s host=%s proto=https uri=/p?q=1", id, host)
				if status != http.StatusOK || body != want {
					t.Fatalf("%s: %d %q, want 200 %q", host, status, body, want)
				}
			}
		})
	}

	t.Run("replaced files are served without restart", func(t *testing.T) {
		open, err := dialTLSProxy(p.https, trustSNI(ca.Pool(), "50005-abc.cube.test"))
		if err != nil {
			t.Fatal(err)
		}
		defer open.close()
		second := ca.WritePair(t, certFile, keyFile, "cube.test", "*.cube.test")
		testenv.Eventually(t, 10*time.Second, func() error {
			c, err := dialTLSProxy(p.https, trustNoSNI(ca.Pool(), "50005-abc.cube.test"))
			if err != nil {
				return err
			}
			defer c.close()
			if got := c.leaf().SerialNumber; got.Cmp(second.SerialNumber) != 0 {
				return fmt.Errorf("still serving serial %v, want %v", got, second.SerialNumber)
			}
			return nil
		})
		c, err := dialTLSProxy(p.https, trustSNI(ca.Pool(), "50005-xyz.cube.test"))
		if err != nil {
			t.Fatal(err)
		}
		defer c.close()
		if c.leaf().SerialNumber.Cmp(second.SerialNumber) != 0 {
			t.Fatal("SNI handshake after reload got the old certificate")
		}
		if status, body, err := c.get("50005-xyz.cube.test", "/"); err != nil || status != 200 || !strings.HasPrefix(body, "sandbox=xyz ") {
			t.Fatalf("after reload: %d %q %v", status, body, err)
		}
		// A connection opened before the reload keeps working.
		if status, body, err := open.get("50005-abc.cube.test", "/"); err != nil || status != 200 || !strings.HasPrefix(body, "sandbox=abc ") {
			t.Fatalf("connection from before the reload: %d %q %v", status, body, err)
		}
	})
}

// self_signed is the default with https_addr set and no certificate source:
// the development certificate names the domain, its wildcard, localhost and
// 127.0.0.1, ALPN is http/1.1 and never h2, and plain HTTP still proxies.
func TestTLSSelfSignedDefault(t *testing.T) {
	p := startTLSProxy(t, tlsConfigYAML(t, map[string]int{"abc": tlsWhoami(t, "abc")}, "tls:\n  domain: cube.test\n"))

	c, err := dialTLSProxy(p.https, &tls.Config{
		InsecureSkipVerify: true, ServerName: "50005-abc.cube.test", NextProtos: []string{"h2", "http/1.1"},
	})
	if err != nil {
		t.Fatalf("handshake: %v", err)
	}
	defer c.close()
	if got := c.c.ConnectionState().NegotiatedProtocol; got != "http/1.1" {
		t.Fatalf("client offered h2 and http/1.1, negotiated %q; want http/1.1", got)
	}
	leaf := c.leaf()
	if leaf.Issuer.String() != leaf.Subject.String() {
		t.Fatalf("issuer %q != subject %q: not self-signed", leaf.Issuer, leaf.Subject)
	}
	for _, name := range []string{"cube.test", "50005-abc.cube.test", "localhost", "127.0.0.1"} {
		if err := leaf.VerifyHostname(name); err != nil {
			t.Errorf("certificate does not cover %s: %v", name, err)
		}
	}
	if err := leaf.VerifyHostname("a.b.cube.test"); err == nil {
		t.Error("certificate covers a.b.cube.test: more than domain + one wildcard label")
	}
	if status, body, err := c.get("50005-abc.cube.test", "/x"); err != nil || status != 200 || body != "sandbox=abc host=50005-abc.cube.test proto=https uri=/x" {
		t.Fatalf("over TLS: %d %q %v", status, body, err)
	}

	// A client that speaks only h2 (gRPC) must not get it (fasthttp is
	// HTTP/1 only): its handshake fails with the alert the README names.
	if h2, err := dialTLSProxy(p.https, &tls.Config{InsecureSkipVerify: true, ServerName: "cube.test", NextProtos: []string{"h2"}}); err == nil {
		proto := h2.c.ConnectionState().NegotiatedProtocol
		h2.close()
		t.Fatalf("an h2-only client completed the handshake (ALPN %q)", proto)
	} else if !strings.Contains(err.Error(), "tls: no application protocol") {
		t.Fatalf("an h2-only client: %v, want the no_application_protocol alert", err)
	}

	// curl --http1.0 offers ALPN http/1.0 alone; nginx accepts it, and
	// its handshake failed here with no_application_protocol.
	h10, err := dialTLSProxy(p.https, &tls.Config{InsecureSkipVerify: true, ServerName: "50005-abc.cube.test", NextProtos: []string{"http/1.0"}})
	if err != nil {
		t.Fatalf("a client offering http/1.0 alone: %v", err)
	}
	defer h10.close()
	if got := h10.c.ConnectionState().NegotiatedProtocol; got != "http/1.0" {
		t.Fatalf("a client offering http/1.0 alone negotiated %q", got)
	}
	_ = h10.c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := fmt.Fprintf(h10.c, "GET /v10 HTTP/1.0\r\nHost: 50005-abc.cube.test\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	resp10, err := http.ReadResponse(h10.br, nil)
	if err != nil {
		t.Fatalf("HTTP/1.0 over ALPN http/1.0: %v", err)
	}
	body10, _ := io.ReadAll(resp10.Body)
	resp10.Body.Close()
	if want := "sandbox=abc host=50005-abc.cube.test proto=https uri=/v10"; resp10.StatusCode != 200 || string(body10) != want {
		t.Fatalf("HTTP/1.0 over ALPN http/1.0: %d %q, want %q", resp10.StatusCode, body10, want)
	}

	// Without redirect_http the plain listener keeps proxying.
	req, _ := http.NewRequest("GET", "http://"+p.http+"/plain", nil)
	req.Host = "50005-abc.cube.test"
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if want := "sandbox=abc host=50005-abc.cube.test proto=http uri=/plain"; resp.StatusCode != 200 || string(body) != want {
		t.Fatalf("plain HTTP: %d %q, want %q", resp.StatusCode, body, want)
	}
}

// redirect_http: plain HTTP answers 308 to the same URI on the HTTPS port
// and never reaches the sandbox.
func TestTLSRedirectHTTP(t *testing.T) {
	var hits atomic.Int64
	port := tlsBackend(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		fmt.Fprintf(w, "sandbox=abc uri=%s", r.RequestURI)
	}))
	p := startTLSProxy(t, tlsConfigYAML(t, map[string]int{"abc": port}, "tls:\n  domain: cube.test\n  redirect_http: true\n"))
	noFollow := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}

	tests := []struct {
		name   string
		method string
		host   string
		uri    string
	}{
		{"GET with query", "GET", "50005-abc.cube.test", "/a/b?x=1&y=%2F"},
		{"Host with the HTTP port", "GET", "50005-abc.cube.test:8081", "/"},
		{"POST keeps its method (308)", "POST", "50005-abc.cube.test", "/submit?z"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req, _ := http.NewRequest(tt.method, "http://"+p.http+tt.uri, strings.NewReader(""))
			req.Host = tt.host
			req.Header.Set("X-Cube-Request-Id", "redir-"+tt.method)
			resp, err := noFollow.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			want := "https://50005-abc.cube.test:" + p.httpsPort + tt.uri
			if resp.StatusCode != http.StatusPermanentRedirect || resp.Header.Get("Location") != want {
				t.Fatalf("%d Location %q, want 308 %q", resp.StatusCode, resp.Header.Get("Location"), want)
			}
			if got := resp.Header.Get("X-Cube-Request-Id"); got != "redir-"+tt.method {
				t.Errorf("redirect's X-Cube-Request-Id %q, want the client's", got)
			}
			// The redirect target is served by the HTTPS listener.
			loc, _ := url.Parse(resp.Header.Get("Location"))
			c, err := dialTLSProxy(p.https, &tls.Config{InsecureSkipVerify: true, ServerName: loc.Hostname()})
			if err != nil {
				t.Fatal(err)
			}
			defer c.close()
			if status, body, err := c.get(loc.Host, loc.RequestURI()); err != nil || status != 200 || body != "sandbox=abc uri="+tt.uri {
				t.Fatalf("following the redirect: %d %q %v", status, body, err)
			}
		})
	}
	if n := hits.Load(); n != int64(len(tests)) {
		t.Fatalf("sandbox saw %d requests, want %d (only the HTTPS follow-ups)", n, len(tests))
	}

	// A client on the node's IPv6 address gets a URL it can follow.
	for _, host := range []string{"[2001:db8::1]:8081", "[2001:db8::1]"} {
		req, _ := http.NewRequest("GET", "http://"+p.http+"/x?y", nil)
		req.Host = host
		resp, err := noFollow.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if want := "https://[2001:db8::1]:" + p.httpsPort + "/x?y"; resp.Header.Get("Location") != want {
			t.Errorf("Host %s: Location %q, want %q", host, resp.Header.Get("Location"), want)
		}
	}
}

// Behind a load balancer or a port mapping (the platform listens on :8080
// and is reached on 443), the redirect must name the port clients reach,
// not the listener's: tls.redirect_port says which, and 443 is left out.
func TestTLSRedirectPublicPort(t *testing.T) {
	noFollow := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	tests := []struct {
		name, port, want string
	}{
		{"443 is the URL's default", "443", "https://50005-abc.cube.test/x?y"},
		{"another public port", "9443", "https://50005-abc.cube.test:9443/x?y"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := startTLSProxy(t, tlsConfigYAML(t, nil, "tls:\n  domain: cube.test\n  redirect_http: true\n  redirect_port: "+tt.port+"\n"))
			req, _ := http.NewRequest("GET", "http://"+p.http+"/x?y", nil)
			req.Host = "50005-abc.cube.test:80"
			resp, err := noFollow.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusPermanentRedirect || resp.Header.Get("Location") != tt.want {
				t.Fatalf("%d Location %q, want 308 %q", resp.StatusCode, resp.Header.Get("Location"), tt.want)
			}
		})
	}
}

// A WebSocket (wss://) and an SSE stream work end to end over TLS.
func TestTLSWebSocketAndSSE(t *testing.T) {
	ca := testenv.NewCA(t, "cubeproxy test CA")
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "c.pem"), filepath.Join(dir, "k.pem")
	ca.WritePair(t, certFile, keyFile, "cube.test", "*.cube.test")

	wsEnded := make(chan error, 1)
	wsPort := tlsBackend(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, &websocket.AcceptOptions{Subprotocols: []string{"echo.v1"}})
		if err != nil {
			wsEnded <- err
			return
		}
		c.SetReadLimit(1 << 20)
		for {
			typ, msg, err := c.Read(r.Context())
			if err != nil {
				wsEnded <- err
				return
			}
			if err := c.Write(r.Context(), typ, msg); err != nil {
				wsEnded <- err
				return
			}
		}
	}))

	const events = 5
	ack := make(chan int)
	sseDone := make(chan error, 1)
	ssePort := tlsBackend(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(200)
		f := w.(http.Flusher)
		for i := 1; i <= events; i++ {
			fmt.Fprintf(w, "id: %d\ndata: event %d\n\n", i, i)
			f.Flush()
			// The next event waits for the client's ack: any buffering in the
			// proxy (or its TLS writer) deadlocks here.
			select {
			case got := <-ack:
				if got != i {
					sseDone <- fmt.Errorf("ack %d for event %d", got, i)
					return
				}
			case <-time.After(10 * time.Second):
				sseDone <- fmt.Errorf("no ack for event %d: the proxy held it back", i)
				return
			}
		}
		sseDone <- nil
	}))

	p := startTLSProxy(t, tlsConfigYAML(t, map[string]int{"ws": wsPort, "sse": ssePort}, fmt.Sprintf(
		"tls:\n  source: files\n  files:\n    - cert_file: %q\n      key_file: %q\n", certFile, keyFile)))

	t.Run("websocket", func(t *testing.T) {
		host := "50005-ws.cube.test"
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		c, resp, err := websocket.Dial(ctx, "wss://"+p.https+"/ws", &websocket.DialOptions{
			HTTPClient: tlsHTTPClient(t, trustSNI(ca.Pool(), host)), Host: host, Subprotocols: []string{"echo.v1"},
		})
		if err != nil {
			t.Fatalf("wss dial through the proxy: %v", err)
		}
		defer c.CloseNow()
		if resp.TLS == nil || resp.TLS.PeerCertificates[0].VerifyHostname(host) != nil {
			t.Fatal("handshake did not run over TLS with the wildcard")
		}
		if c.Subprotocol() != "echo.v1" {
			t.Errorf("subprotocol %q", c.Subprotocol())
		}
		c.SetReadLimit(1 << 20)
		for _, msg := range [][]byte{[]byte("hello over wss"), bytes.Repeat([]byte{7}, 100<<10)} {
			if err := c.Write(ctx, websocket.MessageBinary, msg); err != nil {
				t.Fatal(err)
			}
			_, got, err := c.Read(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, msg) {
				t.Fatalf("echo of %d bytes came back as %d bytes", len(msg), len(got))
			}
		}
		if err := c.Close(websocket.StatusNormalClosure, "done"); err != nil {
			t.Fatalf("close: %v", err)
		}
		select {
		case err := <-wsEnded:
			if websocket.CloseStatus(err) != websocket.StatusNormalClosure {
				t.Fatalf("backend saw %v, want a normal close relayed through the tunnel", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("backend never saw the close")
		}
	})

	t.Run("sse", func(t *testing.T) {
		host := "50005-sse.cube.test"
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, "GET", "https://"+p.https+"/events", nil)
		req.Host = host
		resp, err := tlsHTTPClient(t, trustSNI(ca.Pool(), host)).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if resp.TLS == nil || resp.Header.Get("Content-Type") != "text/event-stream" {
			t.Fatalf("tls %v, content-type %q", resp.TLS != nil, resp.Header.Get("Content-Type"))
		}
		br := bufio.NewReader(resp.Body)
		for i := 1; i <= events; i++ {
			var ev strings.Builder
			for {
				line, err := br.ReadString('\n')
				if err != nil {
					t.Fatalf("event %d: %v (got %q)", i, err, ev.String())
				}
				if line == "\n" {
					break
				}
				ev.WriteString(line)
			}
			if want := fmt.Sprintf("id: %d\ndata: event %d\n", i, i); ev.String() != want {
				t.Fatalf("event %d = %q, want %q", i, ev.String(), want)
			}
			select {
			case ack <- i:
			case err := <-sseDone:
				t.Fatalf("the backend stopped before event %d's ack: %v", i, err)
			case <-time.After(10 * time.Second):
				t.Fatalf("the backend never took event %d's ack", i)
			}
		}
		if err := <-sseDone; err != nil {
			t.Fatal(err)
		}
	})
}

// pebbleRootsFile writes the certificate of pebble's own HTTPS endpoint as
// PEM, for tls.acme.trusted_roots_file.
func pebbleRootsFile(t *testing.T, pb *testenv.Pebble) string {
	t.Helper()
	u, err := url.Parse(pb.DirectoryURL)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := tls.Dial("tcp", u.Host, &tls.Config{InsecureSkipVerify: true})
	if err != nil {
		t.Fatalf("pebble endpoint: %v", err)
	}
	defer conn.Close()
	cert := conn.ConnectionState().PeerCertificates[0]
	if _, err := cert.Verify(x509.VerifyOptions{Roots: pb.ClientRootPool, DNSName: u.Hostname()}); err != nil {
		t.Fatalf("pebble endpoint certificate is not the one in ClientRootPool: %v", err)
	}
	path := filepath.Join(t.TempDir(), "pebble-roots.pem")
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// acmeTLSSection is a tls: section for pebble and the test DNS server; extra
// lines go under acme:.
func acmeTLSSection(t *testing.T, pb *testenv.Pebble, dnsSrv *testenv.DNSServer, extra string) string {
	return fmt.Sprintf(`tls:
  source: acme
  domain: cube.test
  acme:
    ca: %q
    email: ops@cube.test
    trusted_roots_file: %q
    storage_dir: %q
%s    dns:
      provider: rfc2136
      options:
        server: %q
        key_name: %q
        key_alg: %q
        key_secret: %q
      resolvers: [%q]
      propagation_timeout: -1s
`, pb.DirectoryURL, pebbleRootsFile(t, pb), t.TempDir(), extra,
		dnsSrv.Addr, dnsSrv.KeyName, dnsSrv.KeyAlg, dnsSrv.KeySecret, dnsSrv.Addr)
}

// With domains empty (the routing parser then takes any domain), on-demand
// still holds names to tls.domain: a name under a domain someone else
// points at the node places no order and spends none of the budget that
// the node's own sandboxes need.
func TestTLSACMEOnDemandOnlyUnderTLSDomain(t *testing.T) {
	dnsSrv := testenv.StartDNS(t, "cube.test")
	pb := testenv.StartPebble(t, dnsSrv.Addr)
	y := tlsConfigYAML(t, map[string]int{"abc": tlsWhoami(t, "abc")},
		acmeTLSSection(t, pb, dnsSrv, "    skip_wildcard: true\n    on_demand: true\n    on_demand_rate: 1\n"))
	y = strings.Replace(y, `domains: ["cube.test"]`, `domains: []`, 1)
	p := startTLSProxy(t, y)
	roots := pb.IssuerRootPool(t)

	if c, err := dialTLSProxy(p.https, trustSNI(roots, "50005-abc.attacker.example")); err == nil {
		c.close()
		t.Fatalf("a name under another domain got a certificate for %v", c.leaf().DNSNames)
	}
	if n := pb.Orders(); n != 0 {
		t.Fatalf("a name under another domain placed %d orders", n)
	}
	c, err := dialTLSProxy(p.https, trustSNI(roots, "50005-abc.cube.test"))
	if err != nil {
		t.Fatalf("the sandbox's own name, after the foreign one: %v", err)
	}
	c.close()
}

// acme: the wildcard is obtained at startup through DNS-01 (the shipped
// RFC 2136 provider updating the test DNS server) from pebble, and requests
// through the proxy verify against pebble's issuing root.
func TestTLSACMEWildcard(t *testing.T) {
	dnsSrv := testenv.StartDNS(t, "cube.test")
	pb := testenv.StartPebble(t, dnsSrv.Addr)
	p := startTLSProxy(t, tlsConfigYAML(t, map[string]int{"abc": tlsWhoami(t, "abc")},
		acmeTLSSection(t, pb, dnsSrv, "    sync: true\n")))

	orders := pb.Orders()
	if orders < 1 || dnsSrv.Updates() < 2 {
		t.Fatalf("after a sync start: %d orders, %d DNS updates; want the wildcard through DNS-01", orders, dnsSrv.Updates())
	}
	roots := pb.IssuerRootPool(t)
	tests := []struct {
		name string
		cfg  *tls.Config
	}{
		{"SNI of the sandbox host", trustSNI(roots, "50005-abc.cube.test")},
		{"no SNI gets the wildcard", trustNoSNI(roots, "50005-abc.cube.test")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := dialTLSProxy(p.https, tt.cfg)
			if err != nil {
				t.Fatalf("handshake verified against pebble's root: %v", err)
			}
			defer c.close()
			if names := c.leaf().DNSNames; !containsName(names, "*.cube.test") {
				t.Fatalf("served %v, want the wildcard", names)
			}
			status, body, err := c.get("50005-abc.cube.test", "/acme")
			if want := "sandbox=abc host=50005-abc.cube.test proto=https uri=/acme"; err != nil || status != 200 || body != want {
				t.Fatalf("%d %q %v, want 200 %q", status, body, err, want)
			}
		})
	}
	// Names the wildcard does not cover, with no on-demand to obtain one:
	// refused with the alert that says the name is wrong (RFC 6066 §3).
	for _, name := range []string{"50005-abc.elsewhere.test", "a.50005-abc.cube.test"} {
		if c, err := dialTLSProxy(p.https, trustSNI(roots, name)); err == nil {
			c.close()
			t.Fatalf("%s got a certificate for %v", name, c.leaf().DNSNames)
		} else if !strings.Contains(err.Error(), "remote error: tls: unrecognized name") {
			t.Fatalf("%s: handshake failed with %v, want the unrecognized_name alert", name, err)
		}
	}
	if got := pb.Orders(); got != orders {
		t.Fatalf("serving placed %d more orders; the wildcard must come from memory", got-orders)
	}
}

func containsName(names []string, want string) bool {
	for _, n := range names {
		if n == want {
			return true
		}
	}
	return false
}

// On-demand only (skip_wildcard): a hostname of an existing route gets its
// own certificate during the handshake; names of unknown sandboxes, ports
// the route does not expose and other domains are refused without an order
// reaching pebble.
func TestTLSACMEOnDemand(t *testing.T) {
	dnsSrv := testenv.StartDNS(t, "cube.test")
	pb := testenv.StartPebble(t, dnsSrv.Addr)
	// Ids the routing table takes whose host name is no DNS name: no CA
	// issues for them, so an order would only spend the budget.
	longID := strings.Repeat("l", 60) // "50005-" + 60 bytes: a 66-byte label
	who := tlsWhoami(t, "abc")
	p := startTLSProxy(t, tlsConfigYAML(t, map[string]int{"abc": who, "a_b": who, longID: who},
		acmeTLSSection(t, pb, dnsSrv, "    skip_wildcard: true\n    on_demand: true\n")))
	if n := pb.Orders(); n != 0 {
		t.Fatalf("on-demand only: %d orders at startup", n)
	}
	roots := pb.IssuerRootPool(t)

	tests := []struct {
		name       string
		sni        string
		wantOK     bool
		wantOrders int64 // orders this handshake places
	}{
		{"unknown sandbox refused", "50005-nobody.cube.test", false, 0},
		{"port the route does not expose refused", "50006-abc.cube.test", false, 0},
		{"other domain refused", "50005-abc.elsewhere.test", false, 0},
		{"leading-zero spelling of the port refused", "050005-abc.cube.test", false, 0},
		{"id with an underscore refused", "50005-a_b.cube.test", false, 0},
		{"label longer than 63 bytes refused", "50005-" + longID + ".cube.test", false, 0},
		{"no SNI refused (no wildcard to default to)", "", false, 0},
		{"existing route gets a certificate", "50005-abc.cube.test", true, 1},
		{"second handshake served from memory", "50005-abc.cube.test", true, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := pb.Orders()
			cfg := trustSNI(roots, tt.sni)
			if tt.sni == "" {
				cfg = trustNoSNI(roots, "50005-abc.cube.test")
			}
			c, err := dialTLSProxy(p.https, cfg)
			if got := pb.Orders() - before; got != tt.wantOrders {
				t.Fatalf("pebble saw %d new orders, want %d", got, tt.wantOrders)
			}
			if !tt.wantOK {
				if err == nil {
					c.close()
					t.Fatalf("handshake succeeded with %v", c.leaf().DNSNames)
				}
				// What clients show (curl: "tlsv1 unrecognized name");
				// the README names it. internal_error would say the
				// proxy is broken.
				if !strings.Contains(err.Error(), "remote error: tls: unrecognized name") {
					t.Fatalf("handshake failed with %v, want the unrecognized_name alert", err)
				}
				// One line per refusal. The process log is written in
				// order by its own goroutine: once the handshake's line
				// is out, every earlier line is too.
				if tt.sni == "" {
					return
				}
				testenv.WaitFor(t, 5*time.Second, "the handshake's refusal line", func() bool {
					return strings.Contains(p.logs.String(), `"sni":"`+tt.sni+`"`)
				})
				if n := refusalLines(p.logs.String(), tt.sni); n != 1 {
					t.Fatalf("the refusal of %s is logged %d times, want once:\n%s", tt.sni, n, p.logs)
				}
				return
			}
			if err != nil {
				t.Fatalf("handshake: %v", err)
			}
			defer c.close()
			if names := c.leaf().DNSNames; len(names) != 1 || names[0] != tt.sni {
				t.Fatalf("certificate names %v, want exactly [%s]", names, tt.sni)
			}
			if status, body, err := c.get(tt.sni, "/od"); err != nil || status != 200 || !strings.HasPrefix(body, "sandbox=abc ") {
				t.Fatalf("request: %d %q %v", status, body, err)
			}
		})
	}
}

// An on-demand order that takes longer than client.read_timeout and
// write_timeout (here DNS-01 with a propagation delay of 2 s against 1 s
// timeouts) still gives the client that waited for it its certificate:
// the wait is the proxy's. The timeouts, set at the accept, ran out during
// the order, and that client's handshake ended in EOF once the
// certificate was in memory; only a second connection got it.
func TestTLSACMEOnDemandOrderLongerThanTheClientTimeouts(t *testing.T) {
	dnsSrv := testenv.StartDNS(t, "cube.test")
	pb := testenv.StartPebble(t, dnsSrv.Addr)
	section := acmeTLSSection(t, pb, dnsSrv, "    skip_wildcard: true\n    on_demand: true\n")
	section = strings.Replace(section, "      propagation_timeout: -1s\n", "      propagation_timeout: -1s\n      propagation_delay: 2s\n", 1)
	y := tlsConfigYAML(t, map[string]int{"abc": tlsWhoami(t, "abc")}, section) + "client:\n  read_timeout: 1s\n  write_timeout: 1s\n"
	p := startTLSProxy(t, y)

	start := time.Now()
	c, err := dialTLSProxy(p.https, trustSNI(pb.IssuerRootPool(t), "50005-abc.cube.test"))
	if err != nil {
		t.Fatalf("handshake after an order of %v: %v (orders: %d)", time.Since(start).Round(time.Millisecond), err, pb.Orders())
	}
	defer c.close()
	if status, body, err := c.get("50005-abc.cube.test", "/slow-order"); err != nil || status != 200 || !strings.HasPrefix(body, "sandbox=abc ") {
		t.Fatalf("first request: %d %q %v", status, body, err)
	}
}

// On-demand without a DNS provider validates by TLS-ALPN-01, which the CA
// sends to the HTTPS listener itself: through the proxy's own TLS
// listener (its handshake goroutine, the certificate-wait accounting, the
// client.max_conns bookkeeping, fasthttp serving a connection that
// negotiated acme-tls/1), not only certmagic's tls.Config, the challenge
// is answered and the sandbox's name gets its certificate.
func TestTLSACMEOnDemandTLSALPN01ThroughTheProxy(t *testing.T) {
	dnsSrv := testenv.StartDNS(t, "cube.test")
	// pebble's validator dials a fixed port, the proxy's https_addr.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	pb := testenv.StartPebbleWith(t, dnsSrv.Addr, testenv.PebbleOptions{TLSPort: port})
	y := tlsConfigYAML(t, map[string]int{"abc": tlsWhoami(t, "abc")}, fmt.Sprintf(`tls:
  source: acme
  domain: cube.test
  acme:
    ca: %q
    email: ops@cube.test
    trusted_roots_file: %q
    storage_dir: %q
    skip_wildcard: true
    on_demand: true
`, pb.DirectoryURL, pebbleRootsFile(t, pb), t.TempDir()))
	y = strings.Replace(y, `https_addr: "127.0.0.1:0"`, fmt.Sprintf(`https_addr: "127.0.0.1:%d"`, port), 1)
	p := startTLSProxy(t, y+"client:\n  max_conns: 100\n")

	c, err := dialTLSProxy(p.https, trustSNI(pb.IssuerRootPool(t), "50005-abc.cube.test"))
	if err != nil {
		t.Fatalf("on-demand certificate through TLS-ALPN-01 on the proxy's listener: %v", err)
	}
	defer c.close()
	if names := c.leaf().DNSNames; len(names) != 1 || names[0] != "50005-abc.cube.test" {
		t.Fatalf("certificate names %v", names)
	}
	if status, body, err := c.get("50005-abc.cube.test", "/alpn"); err != nil || status != 200 || !strings.HasPrefix(body, "sandbox=abc ") {
		t.Fatalf("request: %d %q %v", status, body, err)
	}
}

// refusalLines counts the log lines that refuse a certificate for sni.
func refusalLines(logs, sni string) int {
	n := 0
	for line := range strings.Lines(logs) {
		if strings.Contains(line, "refused") && strings.Contains(line, `"`+sni+`"`) {
			n++
		}
	}
	return n
}

// redirect_http sends the client to the HTTPS twin of exactly the target it
// asked for: the proxy forwards targets unnormalised, so a redirect that
// rewrote a%2Fb to a/b or dropped a dot segment would make the HTTPS request
// reach another resource, and an absolute-form target must give a URL, not
// its scheme pasted after the port.
func TestTLSRedirectKeepsRequestTarget(t *testing.T) {
	port := tlsBackend(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t.Errorf("plain HTTP reached the sandbox: %s %s", r.Method, r.RequestURI)
	}))
	p := startTLSProxy(t, tlsConfigYAML(t, map[string]int{"abc": port}, "tls:\n  domain: cube.test\n  redirect_http: true\n"))
	base := "https://50005-abc.cube.test:" + p.httpsPort
	tests := []struct {
		name, target, want string
	}{
		{"encoded slash", "/files/a%2Fb", base + "/files/a%2Fb"},
		{"dot segments and double slashes", "/a/../b//c/%2e%2e/d?q=%2F", base + "/a/../b//c/%2e%2e/d?q=%2F"},
		{"absolute-form", "http://50005-abc.cube.test/p?x=1", base + "/p?x=1"},
		{"absolute-form without path", "http://50005-abc.cube.test", base + "/"},
		{"absolute-form with query only", "http://50005-abc.cube.test?x", base + "/?x"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := net.Dial("tcp", p.http)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(5 * time.Second))
			fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: 50005-abc.cube.test\r\n\r\n", tt.target)
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusPermanentRedirect || resp.Header.Get("Location") != tt.want {
				t.Fatalf("GET %s: %d Location %q, want 308 %q", tt.target, resp.StatusCode, resp.Header.Get("Location"), tt.want)
			}
		})
	}
}

// An HTTP/1.0 request without Host names no server to redirect to:
// "https://:8443/" is no URL, so it gets the 400 the proxy answers over
// HTTPS to a request without a host.
func TestTLSRedirectWithoutHost(t *testing.T) {
	p := startTLSProxy(t, tlsConfigYAML(t, nil, "tls:\n  domain: cube.test\n  redirect_http: true\n"))
	c, err := net.Dial("tcp", p.http)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	fmt.Fprint(c, "GET /x HTTP/1.0\r\nX-Cube-Request-Id: no-host\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest || resp.Header.Get("Location") != "" || !strings.Contains(string(body), `"code":"invalid_host"`) {
		t.Fatalf("%d Location %q body %q, want 400 invalid_host and no Location", resp.StatusCode, resp.Header.Get("Location"), body)
	}
	if got := resp.Header.Get("X-Cube-Request-Id"); got != "no-host" {
		t.Errorf("X-Cube-Request-Id %q, want the client's", got)
	}
}

// A shutdown does not wait for an on-demand order: a handshake blocked on
// one (here the CA never answers) kept its connection open, and the drain
// waited for it up to drain_timeout (certmagic gives an order 180 s).
func TestTLSACMEShutdownDuringOnDemandOrder(t *testing.T) {
	ca := testenv.StartSilentServer(t)
	y := tlsConfigYAML(t, map[string]int{"abc": tlsWhoami(t, "abc")}, fmt.Sprintf(`tls:
  source: acme
  domain: cube.test
  acme:
    ca: %q
    email: ops@cube.test
    storage_dir: %q
    skip_wildcard: true
    on_demand: true
`, "http://"+ca.Addr+"/dir", t.TempDir()))
	y = strings.Replace(y, "drain_timeout: 2s", "drain_timeout: 60s", 1)
	path := filepath.Join(t.TempDir(), "cubeproxy.yaml")
	if err := os.WriteFile(path, []byte(y), 0o600); err != nil {
		t.Fatal(err)
	}
	r := runServe(t, []string{"--config", path}, noEnv)

	done := make(chan error, 1)
	go func() {
		c, err := dialTLSProxy(addrOf(r.a.httpsLn), &tls.Config{ServerName: "50005-abc.cube.test", InsecureSkipVerify: true})
		if err == nil {
			c.close()
		}
		done <- err
	}()
	select {
	case <-ca.Reached:
	case err := <-done:
		t.Fatalf("handshake ended before the order reached the CA: %v", err)
	case <-time.After(20 * time.Second):
		t.Fatal("the on-demand order never reached the CA")
	}
	start := time.Now()
	r.stop()
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("shutdown took %v with an order pending (drain_timeout 60s)", took)
	}
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("the handshake got a certificate from a CA that never answered")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the handshake is still waiting after the shutdown")
	}
}

// acme without sync starts listening before the wildcard is obtained, and
// until then every handshake fails: /readyz says 503 certificate_pending
// (a CA that never answers keeps it so), and turns 200 once the
// certificate is there, so a load balancer sends HTTPS only to a node that
// can complete the handshake.
func TestTLSACMEReadyzWaitsForTheWildcard(t *testing.T) {
	dnsSrv := testenv.StartDNS(t, "cube.test")
	pb := testenv.StartPebble(t, dnsSrv.Addr)
	silent := testenv.StartSilentServer(t)
	readyz := func(p *tlsProxy) (int, map[string]any) {
		resp, err := http.Get("http://" + addrOf(p.a.adminLn) + "/readyz")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var got map[string]any
		if err := json.NewDecoder(resp.Body).Decode(&got); err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, got
	}
	t.Run("CA that never answers: pending", func(t *testing.T) {
		section := acmeTLSSection(t, pb, dnsSrv, "")
		section = strings.Replace(section, pb.DirectoryURL, "http://"+silent.Addr+"/dir", 1)
		p := startTLSProxy(t, tlsConfigYAML(t, map[string]int{"abc": tlsWhoami(t, "abc")}, section))
		testenv.Recv(t, silent.Reached, 30*time.Second, "the ACME order at the CA that never answers") // the order is under way, and cannot succeed
		status, got := readyz(p)
		if status != 503 || got["reason"] != "certificate_pending" {
			t.Fatalf("/readyz %d %v, want 503 certificate_pending", status, got)
		}
		// The name is right, the server is not ready: internal_error,
		// not unrecognized_name.
		if c, err := dialTLSProxy(p.https, trustSNI(pb.IssuerRootPool(t), "50005-abc.cube.test")); err == nil {
			c.close()
			t.Fatal("a handshake succeeded before the wildcard was obtained")
		} else if !strings.Contains(err.Error(), "remote error: tls: internal error") {
			t.Fatalf("handshake failed with %v, want the internal_error alert", err)
		}
	})
	t.Run("pebble: ready once the wildcard is in", func(t *testing.T) {
		p := startTLSProxy(t, tlsConfigYAML(t, map[string]int{"abc": tlsWhoami(t, "abc")}, acmeTLSSection(t, pb, dnsSrv, "")))
		testenv.Eventually(t, 30*time.Second, func() error {
			if status, got := readyz(p); status != 200 {
				return fmt.Errorf("/readyz %d %v", status, got)
			}
			return nil
		})
		c, err := dialTLSProxy(p.https, trustSNI(pb.IssuerRootPool(t), "50005-abc.cube.test"))
		if err != nil {
			t.Fatalf("ready, but the handshake fails: %v", err)
		}
		c.close()
	})
}

// A flood of handshakes for names no route serves (scanners, random
// sandbox ids) places no order and spends none of the on-demand budget
// (on_demand_rate 1 here), and the sandbox's own name gets its
// certificate while the flood goes on.
func TestTLSACMEOnDemandRandomNameFlood(t *testing.T) {
	dnsSrv := testenv.StartDNS(t, "cube.test")
	pb := testenv.StartPebble(t, dnsSrv.Addr)
	p := startTLSProxy(t, tlsConfigYAML(t, map[string]int{"abc": tlsWhoami(t, "abc")},
		acmeTLSSection(t, pb, dnsSrv, "    skip_wildcard: true\n    on_demand: true\n    on_demand_rate: 1\n")))
	roots := pb.IssuerRootPool(t)

	var refused, n atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				i := n.Add(1)
				name := fmt.Sprintf("%d-r%x.cube.test", 1+i%65535, i*7919)
				if c, err := dialTLSProxy(p.https, trustSNI(roots, name)); err == nil {
					c.close()
					t.Errorf("random name %s got a certificate", name)
					return
				}
				refused.Add(1)
			}
		})
	}
	testenv.WaitFor(t, 10*time.Second, "the flood to start", func() bool { return refused.Load() >= 50 })
	start := time.Now()
	c, err := dialTLSProxy(p.https, trustSNI(roots, "50005-abc.cube.test"))
	took := time.Since(start)
	close(stop)
	wg.Wait()
	if err != nil {
		t.Fatalf("the sandbox's name during the flood: %v", err)
	}
	c.close()
	t.Logf("sandbox certificate in %v during a flood of %d refused handshakes", took, refused.Load())
	if n := pb.Orders(); n != 1 {
		t.Fatalf("pebble received %d orders, want the sandbox's one", n)
	}
}

// A domain in domains that no certificate names is said at start, and by
// check: its
// sandbox hosts are routed, but over HTTPS they get the default
// certificate of another name (files) or a failed handshake (acme manages
// *.<tls.domain> only), which showed only as clients' TLS errors.
func TestTLSWarnsDomainWithoutCertificate(t *testing.T) {
	ca := testenv.NewCA(t, "cubeproxy test CA")
	dir := t.TempDir()
	pair := func(name string, names ...string) string {
		c, k := filepath.Join(dir, name+".pem"), filepath.Join(dir, name+"-key.pem")
		ca.WritePair(t, c, k, names...)
		return fmt.Sprintf("    - cert_file: %q\n      key_file: %q\n", c, k)
	}
	top, eu := pair("top", "cube.test", "*.cube.test"), pair("eu", "*.eu.cube.test")
	silentCA := testenv.StartSilentServer(t)
	// Not t.TempDir: the ACME source's lock for an order the silent CA
	// never answers is released by certmagic after serve has returned,
	// and t.TempDir's removal then met it ("directory not empty").
	storage, err := os.MkdirTemp("", "cubeproxy-acme-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for range 50 {
			if os.RemoveAll(storage) == nil {
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
	})
	acme := func(extra string) string {
		own, err := os.MkdirTemp(storage, "storage-") // one per case, as before
		if err != nil {
			t.Fatal(err)
		}
		return fmt.Sprintf(`tls:
  source: acme
  domain: cube.test
  acme:
    ca: %q
    email: ops@cube.test
    storage_dir: %q
%s    dns:
      provider: rfc2136
      options:
        server: "127.0.0.1:53"
`, "http://"+silentCA.Addr+"/dir", own, extra)
	}
	const warning = "no certificate names the sandbox hosts of a domain"
	const sharedWarning = "no certificate names a shared host"
	tests := []struct {
		name     string
		domains  string
		tls      string
		wantWarn string // the domain named; "" for no warning
		shared   string // shared_hosts; "" for none
		// wantShared is the shared host named by a warning of its own;
		// "" for none.
		wantShared string
	}{
		{"files: a domain without a pair", `["cube.test", "eu.cube.test"]`, "tls:\n  files:\n" + top, "eu.cube.test", "", ""},
		{"files: every domain covered", `["cube.test", "*.eu.cube.test"]`, "tls:\n  files:\n" + top + eu, "", "", ""},
		{"acme: a domain below tls.domain", `["cube.test", "eu.cube.test"]`, acme(""), "eu.cube.test", "", ""},
		{"acme: on-demand serves it", `["cube.test", "eu.cube.test"]`, acme("    on_demand: true\n"), "", "", ""},
		{"acme: domains empty (any domain)", `[]`, acme(""), "", "", ""},
		// A shared host is one name: a certificate must name it, and
		// on-demand, which names sandbox hosts only, never does.
		{"files: shared hosts", `["cube.test"]`, "tls:\n  files:\n" + top, "", `["gw.cube.test", "gw.example.org", "10.0.0.1"]`, "gw.example.org"},
		{"acme: shared hosts", `["cube.test"]`, acme(""), "", `["gw.cube.test", "GW.Example.Org."]`, "gw.example.org"},
		{"acme on-demand: shared hosts", `["cube.test"]`, acme("    on_demand: true\n"), "", `["cube.test", "gw.example.org"]`, "gw.example.org"},
		{"acme: shared hosts covered", `["cube.test"]`, acme(""), "", `["cube.test", "api.cube.test"]`, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			y := strings.Replace(tlsConfigYAML(t, nil, tt.tls), `domains: ["cube.test"]`, "domains: "+tt.domains, 1)
			if tt.shared != "" {
				y = strings.Replace(y, "domains: ", "shared_hosts: "+tt.shared+"\ndomains: ", 1)
			}
			path := filepath.Join(t.TempDir(), "cubeproxy.yaml")
			if err := os.WriteFile(path, []byte(y), 0o600); err != nil {
				t.Fatal(err)
			}
			checkWarned := func(what, logs string) {
				t.Helper()
				warnedOnceAbout(t, what, logs, warning, "domain", tt.wantWarn)
				warnedOnceAbout(t, what, logs, sharedWarning, "host", tt.wantShared)
			}
			// check, run before a restart, says it too, and passes: a
			// warning, as at start.
			code, _, stderr := runCheck(t, noEnv, "--config", path)
			if code != 0 {
				t.Fatalf("check exited %d:\n%s", code, stderr)
			}
			checkWarned("check", stderr)

			r := runServe(t, []string{"--config", path}, noEnv)
			// The process log is written behind serve: the warning comes
			// before this line.
			testenv.WaitFor(t, 10*time.Second, "the listening line", func() bool {
				return strings.Contains(r.logs.String(), "cubeproxy listening")
			})
			checkWarned("serve", r.logs.String())
		})
	}
}

// A client that opened a connection to the HTTPS listener and sent no
// ClientHello, or only part of one (a scanner, a client that gave up), is
// closed by the drain once it has had fasthttp's grace for a connection
// that sent nothing (5 s from its accept), as on the plain listener: it
// held every SIGTERM to the whole drain_timeout (measured: 20.05 s with
// drain_timeout 20s, against 4.3 s for the same client on the plain
// listener), and was then reported as a client connection the deadline
// cut. fasthttp runs the handshake before it tracks the connection, so its
// own shutdown never saw it. A handshake that completes within the grace
// is still served.
func TestTLSDrainClosesStalledHandshakes(t *testing.T) {
	// Parallel: it waits on fasthttp's 5 s grace for a silent connection;
	// its bound (8 s) leaves a busy machine 3 s. No signals, no
	// process-wide state.
	t.Parallel()
	ca := testenv.NewCA(t, "cubeproxy test CA")
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "c.pem"), filepath.Join(dir, "k.pem")
	ca.WritePair(t, certFile, keyFile, "cube.test", "*.cube.test")
	host := "50005-abc.cube.test"
	p := startTLSProxy(t, strings.Replace(tlsConfigYAML(t, map[string]int{"abc": tlsWhoami(t, "abc")}, fmt.Sprintf(`tls:
  source: files
  domain: cube.test
  files:
    - cert_file: %q
      key_file: %q
`, certFile, keyFile)), "drain_timeout: 2s", "drain_timeout: 20s", 1))
	admin := addrOf(p.a.adminLn)

	// A ClientHello cut in half: what crypto/tls's client writes first.
	hello := clientHello(t, host)
	half := hello[:len(hello)/2]

	var stalled []net.Conn
	for _, first := range [][]byte{nil, half} {
		c, err := net.Dial("tcp", p.https)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		if _, err := c.Write(first); err != nil {
			t.Fatal(err)
		}
		stalled = append(stalled, c)
	}
	// Connected, not yet handshaking: done once the drain has begun.
	late, err := net.Dial("tcp", p.https)
	if err != nil {
		t.Fatal(err)
	}
	defer late.Close()
	testenv.WaitFor(t, 5*time.Second, "the proxy to accept the three connections", func() bool {
		return series(scrapeFamilies(t, admin))["cubeproxy_connections_open{}"] == 3
	})

	stopped := make(chan time.Duration, 1)
	begin := time.Now()
	go func() {
		p.stop()
		stopped <- time.Since(begin)
	}()
	testenv.WaitFor(t, 5*time.Second, "the drain", func() bool { return strings.Contains(p.logs.String(), "shutting down: draining") })

	c := tls.Client(late, trustSNI(ca.Pool(), host))
	if err := c.Handshake(); err != nil {
		t.Fatalf("handshake within the grace, during the drain: %v", err)
	}
	cc := &tlsClientConn{c: c, br: bufio.NewReader(c)}
	if status, body, err := cc.get(host, "/"); err != nil || status != 200 || !strings.HasPrefix(body, "sandbox=abc ") {
		t.Fatalf("request on a handshake completed during the drain: %d %q %v", status, body, err)
	}

	for i, c := range stalled {
		_ = c.SetReadDeadline(time.Now().Add(15 * time.Second))
		if _, err := io.Copy(io.Discard, c); err != nil {
			t.Errorf("stalled handshake %d: %v, want it closed by the drain", i, err)
		}
	}
	select {
	case d := <-stopped:
		if d > 8*time.Second {
			t.Errorf("drain took %v with stalled handshakes open, want about 5 s (their grace), not drain_timeout (20 s)", d)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("serve still draining 15 s after cancel, with only stalled handshakes open")
	}
	if strings.Contains(p.logs.String(), "drain deadline reached") {
		t.Error("stalled handshakes were reported as connections the drain deadline cut")
	}
}

// clientHello returns the first TLS record crypto/tls's client sends for
// serverName: its ClientHello, captured on a socket that then closes.
func clientHello(t *testing.T, serverName string) []byte {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		if c, err := net.Dial("tcp", ln.Addr().String()); err == nil {
			_ = tls.Client(c, &tls.Config{ServerName: serverName}).Handshake() // fails as the capture closes
			c.Close()
		}
	}()
	s, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	_ = s.SetReadDeadline(time.Now().Add(5 * time.Second))
	rec := make([]byte, 5)
	if _, err := io.ReadFull(s, rec); err != nil {
		t.Fatal(err)
	}
	rec = append(rec, make([]byte, int(rec[3])<<8|int(rec[4]))...)
	if _, err := io.ReadFull(s, rec[5:]); err != nil {
		t.Fatal(err)
	}
	return rec
}

// warnedOnceAbout checks that logs (JSON lines) hold warning once, with
// its field key naming want, or, want empty, not at all.
func warnedOnceAbout(t *testing.T, what, logs, warning, key, want string) {
	t.Helper()
	var got []string
	for line := range strings.Lines(logs) {
		if strings.Contains(line, warning) {
			got = append(got, line)
		}
	}
	switch {
	case want == "" && len(got) > 0:
		t.Fatalf("%s warned: %s", what, got)
	case want != "" && (len(got) != 1 || !strings.Contains(got[0], `"`+key+`":"`+want+`"`)):
		t.Fatalf("%s: warnings %q, want one naming %s\n%s", what, got, want, logs)
	}
}

// On the node that runs a sandbox (node_ip) every container port is
// served at SandboxIP, mapped or not, so the name of a port the route does
// not map is allowed only while something listens there: anyone who knows
// one sandbox id could otherwise have 1-<id>, 2-<id>, … each ordered,
// spending the on-demand budget real sandboxes need and the CA's quota
// for the domain. A port no one listens on is refused with
// unrecognized_name and places no order; a listening one, and a mapped
// one, get their certificate.
func TestTLSACMEOnDemandOnNodeUnmappedPortNeedsListener(t *testing.T) {
	dnsSrv := testenv.StartDNS(t, "cube.test")
	pb := testenv.StartPebble(t, dnsSrv.Addr)
	listening := tlsWhoami(t, "local")
	// Held for the test, bound and not listening: a port closed after
	// listening could be taken by another test's listener meanwhile.
	closed1, closed2 := testenv.RefusingPort(t), testenv.RefusingPort(t)
	mapped := tlsWhoami(t, "local")

	routes := filepath.Join(t.TempDir(), "routes.yaml")
	body := fmt.Sprintf("routes:\n  local:\n    HostIP: \"127.0.0.9\"\n    SandboxIP: \"127.0.0.1\"\n    \"%d\": \"1\"\n", mapped)
	if err := os.WriteFile(routes, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	// A budget of two: the refused names must leave both to the ports
	// that serve.
	y := tlsConfigYAML(t, nil, acmeTLSSection(t, pb, dnsSrv, "    skip_wildcard: true\n    on_demand: true\n    on_demand_rate: 2\n"))
	y = regexp.MustCompile(`(?m)^routes: .*$`).ReplaceAllString(y, fmt.Sprintf("routes: %q\nnode_ip: \"127.0.0.9\"", routes))
	p := startTLSProxy(t, y)
	roots := pb.IssuerRootPool(t)

	tests := []struct {
		name   string
		port   int
		wantOK bool
	}{
		{"unmapped port nothing listens on refused", closed1, false},
		{"another such port refused", closed2, false},
		{"unmapped port with a listener", listening, true},
		{"mapped port", mapped, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sni := fmt.Sprintf("%d-local.cube.test", tt.port)
			before := pb.Orders()
			c, err := dialTLSProxy(p.https, trustSNI(roots, sni))
			orders := pb.Orders() - before
			if !tt.wantOK {
				if err == nil {
					c.close()
					t.Fatalf("%s got a certificate for %v", sni, c.leaf().DNSNames)
				}
				if !strings.Contains(err.Error(), "remote error: tls: unrecognized name") {
					t.Fatalf("handshake failed with %v, want the unrecognized_name alert", err)
				}
				if orders != 0 {
					t.Fatalf("pebble saw %d orders for a port nothing listens on", orders)
				}
				return
			}
			if err != nil {
				t.Fatalf("handshake: %v", err)
			}
			defer c.close()
			if orders != 1 {
				t.Fatalf("pebble saw %d new orders, want 1", orders)
			}
			if names := c.leaf().DNSNames; len(names) != 1 || names[0] != sni {
				t.Fatalf("certificate names %v, want exactly [%s]", names, sni)
			}
			if status, body, err := c.get(sni, "/od"); err != nil || status != 200 || !strings.HasPrefix(body, "sandbox=local ") {
				t.Fatalf("request: %d %q %v", status, body, err)
			}
		})
	}
}
