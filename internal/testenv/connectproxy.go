package testenv

import (
	"bufio"
	"encoding/base64"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"sync"
	"testing"
)

// ConnectProxy is an HTTP forward proxy that takes CONNECT only, as an
// egress proxy does for TLS and gRPC: Basic credentials in
// Proxy-Authorization, and tunnels only to the names it was given, so that
// a name nothing else resolves (collector.invalid) is reached through it
// alone.
type ConnectProxy struct {
	// URL is the proxy's URL with its credentials, as HTTPS_PROXY takes it.
	URL string
	// Addr is the proxy's host:port.
	Addr string
	// Password is the password URL carries.
	Password string

	user   string
	routes map[string]string

	mu       sync.Mutex
	tunnels  int // CONNECTs taken
	refusals int // CONNECTs answered 407
}

// StartConnectProxy starts a CONNECT proxy on a loopback port until the
// test ends. routes maps a CONNECT target (host:port) to the address the
// tunnel goes to; any other target gets a 502. A CONNECT without the
// credentials user and password gets a 407.
func StartConnectProxy(t testing.TB, user, password string, routes map[string]string) *ConnectProxy {
	t.Helper()
	p := &ConnectProxy{Password: password, user: user, routes: routes}
	ln := ServeTCP(t, p.serve)
	p.Addr = ln.Addr().String()
	p.URL = (&url.URL{Scheme: "http", User: url.UserPassword(user, password), Host: p.Addr}).String()
	return p
}

// Tunnels returns how many CONNECTs the proxy took.
func (p *ConnectProxy) Tunnels() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.tunnels
}

// Refusals returns how many CONNECTs the proxy answered 407.
func (p *ConnectProxy) Refusals() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.refusals
}

// serve answers one client connection: a CONNECT, then the tunnel.
func (p *ConnectProxy) serve(c net.Conn) {
	defer c.Close()
	br := bufio.NewReader(c)
	req, err := http.ReadRequest(br)
	if err != nil {
		return
	}
	want := "Basic " + base64.StdEncoding.EncodeToString([]byte(p.user+":"+p.Password))
	switch {
	case req.Method != http.MethodConnect:
		fmt.Fprint(c, "HTTP/1.1 405 Method Not Allowed\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
		return
	case req.Header.Get("Proxy-Authorization") != want:
		p.mu.Lock()
		p.refusals++
		p.mu.Unlock()
		fmt.Fprint(c, "HTTP/1.1 407 Proxy Authentication Required\r\nProxy-Authenticate: Basic realm=\"test\"\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
		return
	}
	to, ok := p.routes[req.Host]
	if !ok {
		fmt.Fprint(c, "HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
		return
	}
	up, err := net.Dial("tcp", to)
	if err != nil {
		fmt.Fprint(c, "HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
		return
	}
	defer up.Close()
	p.mu.Lock()
	p.tunnels++
	p.mu.Unlock()
	if _, err := io.WriteString(c, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
		return
	}
	// Either side closing ends the tunnel: the client's connection is
	// closed by Serve when the test ends, which ends both copies.
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(up, br); _ = up.Close(); done <- struct{}{} }()
	go func() { _, _ = io.Copy(c, up); _ = c.Close(); done <- struct{}{} }()
	<-done
	<-done
}
