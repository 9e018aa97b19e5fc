package certs_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/cube-sandbox/cubeproxy/certs"
)

// server is a fasthttp server on loopback whose TLS config comes from a
// Manager, the way the proxy's HTTPS listener uses it. It records the SNI of
// every ClientHello so tests can prove which path a handshake took.
type server struct {
	addr string
	mu   sync.Mutex
	snis []string
}

func serveTLS(t *testing.T, m *certs.Manager) *server {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return serveTLSOn(t, m, ln)
}

// serveTLSOn is serveTLS on a listener opened before the Manager, whose
// address the Manager's Config names (ListenAddr).
func serveTLSOn(t *testing.T, m *certs.Manager, ln net.Listener) *server {
	t.Helper()
	s := &server{}
	cfg := m.TLSConfig()
	get := cfg.GetCertificate
	cfg.GetCertificate = func(h *tls.ClientHelloInfo) (*tls.Certificate, error) {
		s.mu.Lock()
		s.snis = append(s.snis, h.ServerName)
		s.mu.Unlock()
		return get(h)
	}
	s.addr = ln.Addr().String()
	srv := &fasthttp.Server{
		Handler: func(ctx *fasthttp.RequestCtx) {
			fmt.Fprintf(ctx, "host=%s", ctx.Host())
		},
		Logger: quietLogger{},
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(tls.NewListener(ln, cfg))
	}()
	t.Cleanup(func() {
		_ = srv.Shutdown()
		<-done
	})
	return s
}

func (s *server) lastSNI() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.snis) == 0 {
		return "<none>"
	}
	return s.snis[len(s.snis)-1]
}

type quietLogger struct{}

func (quietLogger) Printf(string, ...any) {}

// client is one TLS connection carrying HTTP/1.1 requests.
type client struct {
	conn *tls.Conn
	br   *bufio.Reader
}

// dial performs the TLS handshake with cfg against addr.
func dial(addr string, cfg *tls.Config) (*client, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	d := tls.Dialer{Config: cfg}
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	tc := c.(*tls.Conn)
	return &client{conn: tc, br: bufio.NewReader(tc)}, nil
}

// get sends GET / with the given Host header and returns the body.
func (c *client) get(host string) (string, error) {
	_ = c.conn.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := fmt.Fprintf(c.conn, "GET / HTTP/1.1\r\nHost: %s\r\n\r\n", host); err != nil {
		return "", err
	}
	resp, err := http.ReadResponse(c.br, nil)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("status %d: %s", resp.StatusCode, body)
	}
	return string(body), nil
}

func (c *client) leaf() *x509.Certificate { return c.conn.ConnectionState().PeerCertificates[0] }

func (c *client) close() { _ = c.conn.Close() }

// fetch dials, sends one request for host and returns the leaf served.
func fetch(t *testing.T, addr string, cfg *tls.Config, host string) (*x509.Certificate, error) {
	t.Helper()
	c, err := dial(addr, cfg)
	if err != nil {
		return nil, err
	}
	defer c.close()
	body, err := c.get(host)
	if err != nil {
		return nil, err
	}
	if want := "host=" + host; body != want {
		return nil, fmt.Errorf("body %q, want %q", body, want)
	}
	if p := c.conn.ConnectionState().NegotiatedProtocol; p != "http/1.1" {
		return nil, fmt.Errorf("negotiated ALPN %q, want http/1.1", p)
	}
	return c.leaf(), nil
}

// sniConfig verifies the server against pool for serverName, sent as SNI.
func sniConfig(pool *x509.CertPool, serverName string) *tls.Config {
	return &tls.Config{RootCAs: pool, ServerName: serverName, NextProtos: []string{"http/1.1"}}
}

// noSNIConfig sends no SNI (the client dials an IP) and still verifies the
// chain against pool for name, the Host the request will carry.
func noSNIConfig(pool *x509.CertPool, name string) *tls.Config {
	return &tls.Config{
		NextProtos:         []string{"http/1.1"},
		InsecureSkipVerify: true, // replaced by VerifyConnection below
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

// logRecorder is a slog.Handler that keeps every record, for tests that
// check what an operator is told.
type logRecorder struct {
	mu      sync.Mutex
	records []slog.Record
}

func (r *logRecorder) Enabled(context.Context, slog.Level) bool { return true }

func (r *logRecorder) Handle(_ context.Context, rec slog.Record) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.records = append(r.records, rec.Clone())
	return nil
}

func (r *logRecorder) WithAttrs([]slog.Attr) slog.Handler { return r }

func (r *logRecorder) WithGroup(string) slog.Handler { return r }

// reset forgets what was logged so far.
func (r *logRecorder) reset() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.records = nil
}

// all returns what was logged so far.
func (r *logRecorder) all() []slog.Record {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.records)
}

// firstAt returns when msg was first logged (zero if never).
func (r *logRecorder) firstAt(msg string) time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, rec := range r.records {
		if rec.Message == msg {
			return rec.Time
		}
	}
	return time.Time{}
}

// count returns how many times msg was logged.
func (r *logRecorder) count(msg string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, rec := range r.records {
		if rec.Message == msg {
			n++
		}
	}
	return n
}

// has reports whether a record at level with message msg was logged
// whose attributes include want (compared as printed).
func (r *logRecorder) has(level slog.Level, msg string, want map[string]string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, rec := range r.records {
		if rec.Level != level || rec.Message != msg {
			continue
		}
		found := 0
		rec.Attrs(func(a slog.Attr) bool {
			if v, ok := want[a.Key]; ok && a.Value.String() == v {
				found++
			}
			return true
		})
		if found == len(want) {
			return true
		}
	}
	return false
}

// warnings returns the messages logged at warning level or above.
func (r *logRecorder) warnings() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, rec := range r.records {
		if rec.Level >= slog.LevelWarn {
			out = append(out, rec.Message)
		}
	}
	return out
}
