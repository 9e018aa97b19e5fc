package proxy

import (
	"context"
	"crypto/tls"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
	"github.com/cube-sandbox/cubeproxy/routing"
)

// A listener whose Serve begins only after Shutdown has begun is closed,
// and its Serve returns at once, as net/http's does after Shutdown. The
// program starts each Serve in a goroutine of its own and drains as soon
// as a signal has come: a SIGTERM as the proxy started found the drain
// running before those goroutines did (measured in-process: the drain
// began first in most of 20 starts cancelled at "listening"). fasthttp's
// shutdown sees only the listeners already served, so a late one was
// never closed: it accepted and served clients through the drain, its
// connections untracked, until the program closed the socket on its way
// out and exited over whatever those clients had in flight (in-process,
// its keep-alive connections outlived serve).
func TestServeAfterShutdownBeganClosesItsListener(t *testing.T) {
	t.Parallel()
	ca := testenv.NewCA(t, "late serve CA")
	cert := ca.Certificate(t, "localhost")
	cases := []struct {
		name   string
		shared bool // reuse_port: the admin listeners close at the drain's start
		serve  func(s *Server, ln net.Listener) error
	}{
		{"http", false, (*Server).Serve},
		{"https", false, func(s *Server, ln net.Listener) error {
			return s.ServeTLS(ln, &tls.Config{Certificates: []tls.Certificate{cert}})
		}},
		{"redirect", false, func(s *Server, ln net.Listener) error { return s.ServeRedirect(ln, "443") }},
		{"admin", false, (*Server).ServeAdmin},
		{"metrics", false, (*Server).ServeMetrics},
		{"admin with shared ports", true, (*Server).ServeAdmin},
		{"metrics with shared ports", true, (*Server).ServeMetrics},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			logger := slog.New(slog.DiscardHandler)
			store := routing.NewMemoryStore()
			cache, err := routing.NewCache(store, routing.CacheConfig{})
			if err != nil {
				t.Fatal(err)
			}
			p, err := New(Config{Logger: logger}, cache)
			if err != nil {
				t.Fatal(err)
			}
			s := NewServer(ServerConfig{DrainTimeout: 5 * time.Second, SharedPorts: tc.shared}, p, NewAdmin(AdminConfig{}, p))
			ln := listen(t, "127.0.0.1:0")
			defer ln.Close()
			s.Claim(ln)

			shutdown := make(chan error, 1)
			go func() { shutdown <- s.Shutdown(context.Background()) }()
			if err := testenv.Recv(t, shutdown, 15*time.Second, "Shutdown of a server with nothing served"); err != nil {
				t.Fatalf("Shutdown: %v", err)
			}

			served := make(chan error, 1)
			go func() { served <- tc.serve(s, ln) }()
			if err := testenv.Recv(t, served, 5*time.Second, "a Serve begun after Shutdown to return"); err != nil {
				t.Errorf("Serve after Shutdown: %v, want nil", err)
			}
			if c, err := net.DialTimeout("tcp", ln.Addr().String(), 2*time.Second); err == nil {
				c.Close()
				t.Errorf("a client connected to a listener served after Shutdown")
			}
		})
	}
}
