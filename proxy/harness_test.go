package proxy

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/auth"
	"github.com/cube-sandbox/cubeproxy/internal/testenv"
	"github.com/cube-sandbox/cubeproxy/routing"
)

// Tests that mostly wait on timers (timeouts, drains, idle streams) rather
// than on the CPU call t.Parallel: make test runs them side by side
// (-parallel 16), once the package's other tests are done. Each has a
// harness of its own; none may count the process's goroutines, memory or
// descriptors, nor set its environment or limits.

// harness is a real proxy on loopback sockets with a memory store.
type harness struct {
	t      *testing.T
	store  *routing.MemoryStore
	counts *countingStore
	cache  *routing.Cache
	proxy  *Proxy
	adm    *Admin
	server *Server
	addr   string // sandbox traffic listener
	admin  string // admin listener
	client *http.Client
}

type harnessOpts struct {
	cfg     Config
	srv     ServerConfig
	cache   routing.CacheConfig
	store   routing.Store // default: the memory store (counted)
	token   string
	publish func(id string) error // the admin API's invalidation publisher
	// listen is the host the traffic and admin listeners bind
	// ("" = 127.0.0.1; "[::1]", "[::]" for IPv6).
	listen string
	// noAdminRoutes gives the admin API no route store, as when routes
	// live in Redis and the platform writes them (here h.store stands in
	// for Redis, written by the test).
	noAdminRoutes bool
	// ready is the admin API's readiness check (GET /readyz); nil = ready.
	ready func() error
	// metrics is the admin API's /metrics; nil = none.
	metrics http.Handler
	// pprof serves the runtime profiles on the admin listener (admin_pprof).
	pprof bool
}

// countingStore counts lookups of a real store.
type countingStore struct {
	routing.Store
	n atomic.Int64
}

func (c *countingStore) Lookup(ctx context.Context, id string) (*routing.Route, error) {
	c.n.Add(1)
	return c.Store.Lookup(ctx, id)
}

func newHarness(t *testing.T, mod ...func(*harnessOpts)) *harness {
	t.Helper()
	o := harnessOpts{}
	for _, m := range mod {
		m(&o)
	}
	h := &harness{t: t, store: routing.NewMemoryStore()}
	var store routing.Store = h.store
	if o.store != nil {
		store = o.store
	}
	h.counts = &countingStore{Store: store}
	var err error
	h.cache, err = routing.NewCache(h.counts, o.cache)
	if err != nil {
		t.Fatal(err)
	}
	// Its loaders end at once, not loaderIdle after the test, so that they
	// are not among what a later test counts (goroutines, memory).
	t.Cleanup(h.cache.Close)
	if o.cfg.Logger == nil {
		o.cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if o.cfg.ConnectTimeout == 0 {
		// A loopback connect completes in the kernel at once, but under
		// -race on two loaded cores the dialing goroutine can wait seconds
		// to run again, and the 3 s default then timed the scheduler:
		// TestSSEManyConcurrentStreams (200 streams at once) got 504
		// upstream_connect_timeout for a few. Tests of the connect
		// timeout set their own.
		o.cfg.ConnectTimeout = 30 * time.Second
	}
	h.proxy, err = New(o.cfg, h.cache)
	if err != nil {
		t.Fatal(err)
	}
	ac := AdminConfig{Token: o.token, Routes: h.store, Publish: o.publish, Ready: o.ready, Metrics: o.metrics, Pprof: o.pprof}
	if o.noAdminRoutes {
		ac.Routes = nil
	}
	h.adm = NewAdmin(ac, h.proxy)
	h.server = NewServer(o.srv, h.proxy, h.adm)
	host := o.listen
	if host == "" {
		host = "127.0.0.1"
	}
	ln := listen(t, host+":0")
	aln := listen(t, host+":0")
	h.addr, h.admin = ln.Addr().String(), aln.Addr().String()
	go h.server.Serve(ln)
	go h.server.ServeAdmin(aln)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = h.server.Shutdown(ctx)
	})
	h.client = &http.Client{
		Transport: &http.Transport{MaxIdleConnsPerHost: 100, DisableCompression: true},
		Timeout:   30 * time.Second,
	}
	t.Cleanup(h.client.CloseIdleConnections)
	return h
}

func listen(t testing.TB, addr string) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

// backend starts a net/http server on ip:0 and returns its port.
//
// Its requests' contexts end with the test: Close closes the connections,
// but net/http cancels a request's context on its connection's close only
// once the handler has read the request's body to its end, so a handler
// that waited on r.Context() with the body unread waited for the rest of
// the process: TestHalfClosedClientReadsNamed499's,
// TestLastActiveDatesLongRequestsByTheirEnd's and
// TestKillEndsTheSandboxsOpenExchanges's were still there when the memory
// tests counted.
func backend(t testing.TB, ip string, h http.Handler) uint16 {
	t.Helper()
	ln := listen(t, ip+":0")
	ctx, cancel := context.WithCancel(context.Background())
	srv := &http.Server{Handler: h, BaseContext: func(net.Listener) context.Context { return ctx }}
	go srv.Serve(ln)
	t.Cleanup(func() {
		cancel()
		srv.Close()
	})
	return uint16(ln.Addr().(*net.TCPAddr).Port)
}

// put stores a route for id whose container port maps to a backend port on 127.0.0.1.
func (h *harness) put(id string, fields map[string]string) {
	h.t.Helper()
	r, err := routing.ParseRouteStrict(id, fields)
	if err != nil {
		h.t.Fatal(err)
	}
	if err := h.store.Put(r); err != nil {
		h.t.Fatal(err)
	}
	h.cache.Invalidate(id)
}

// route registers id with container port == host port == port on 127.0.0.1.
func (h *harness) route(id string, port uint16) string {
	h.put(id, map[string]string{
		"HostIP": "127.0.0.1", "SandboxIP": "127.0.0.1", "CreatedAt": "1",
		strconv.Itoa(int(port)): strconv.Itoa(int(port)),
	})
	return fmt.Sprintf("%d-%s.cube.test", port, id)
}

// req builds a request to the proxy for host.
func (h *harness) req(method, host, path string, body io.Reader) *http.Request {
	h.t.Helper()
	r, err := http.NewRequest(method, "http://"+h.addr+path, body)
	if err != nil {
		h.t.Fatal(err)
	}
	r.Host = host
	return r
}

func (h *harness) do(r *http.Request) *http.Response {
	h.t.Helper()
	resp, err := h.client.Do(r)
	if err != nil {
		h.t.Fatal(err)
	}
	return resp
}

// get performs a GET and returns status and body.
func (h *harness) get(host, path string) (int, string, http.Header) {
	h.t.Helper()
	resp := h.do(h.req("GET", host, path, nil))
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), resp.Header
}

// adminDo calls the admin API.
func (h *harness) adminDo(method, path, body, token string) (int, string) {
	h.t.Helper()
	r, _ := http.NewRequest(method, "http://"+h.admin+path, strings.NewReader(body))
	if token != "" {
		r.Header.Set("X-Cube-Admin-Token", token)
	}
	resp, err := http.DefaultClient.Do(r)
	if err != nil {
		h.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

var _ = netip.Addr{}

func itoa(p uint16) string { return strconv.Itoa(int(p)) }

// waitListenerClosed waits (up to d) until the traffic listener refuses
// connections: the drain has begun.
func (h *harness) waitListenerClosed(d time.Duration) {
	h.t.Helper()
	testenv.WaitFor(h.t, d, "listener closed", func() bool {
		c, err := net.DialTimeout("tcp", h.addr, 100*time.Millisecond)
		if err == nil {
			c.Close()
		}
		return err != nil
	})
}

// waitClientConnsClosed waits until every client connection counted
// against client.max_conns has been given back.
func (h *harness) waitClientConnsClosed(t *testing.T) {
	t.Helper()
	testenv.WaitFor(t, 10*time.Second, "client connections counted back to 0", func() bool {
		return h.proxy.clientConns.Load() == 0
	})
}

// dialRaw connects to addr for a raw exchange that must end within 10 s;
// the connection is closed when the test ends.
func dialRaw(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	return c
}

// keptRequest writes the request raw on c, reads its answer through br and
// fails unless the answer keeps the connection open for the next one.
func keptRequest(t *testing.T, c net.Conn, br *bufio.Reader, raw string) {
	t.Helper()
	if _, err := io.WriteString(c, raw); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("first request: %v", err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.Close {
		t.Fatalf("first request's answer %d closes the connection", resp.StatusCode)
	}
}

// dialProxy dials h as a client of host: in plain HTTP, or over TLS on a
// TLS listener of its own (serveTLS) when overTLS.
func dialProxy(t *testing.T, h *harness, host string, overTLS bool) net.Conn {
	t.Helper()
	if !overTLS {
		return dialRaw(t, h.addr)
	}
	addr, roots := serveTLS(t, h)
	return tls.Client(dialRaw(t, addr), &tls.Config{RootCAs: roots, ServerName: host})
}

// serveTLS serves h's proxy on a TLS listener with a certificate for
// *.cube.test from a test CA, and returns its address and the CA's roots.
func serveTLS(t *testing.T, h *harness) (addr string, roots *x509.CertPool) {
	t.Helper()
	addr, ca := serveTLSFor(t, h, "*.cube.test")
	return addr, ca.Pool()
}

// serveTLSFor serves h's proxy on a TLS listener with a certificate for
// name from a new test CA, and returns its address and the CA.
func serveTLSFor(t *testing.T, h *harness, name string) (addr string, ca *testenv.CA) {
	t.Helper()
	ca = testenv.NewCA(t, "proxy test CA")
	cert := ca.Certificate(t, name)
	ln := listen(t, "127.0.0.1:0")
	go h.server.ServeTLS(ln, &tls.Config{Certificates: []tls.Certificate{cert}})
	return ln.Addr().String(), ca
}

// testSigner is the signer of the tests' signed URLs and cookies: one
// fixed 32-byte key, so that a token made in a test verifies in its proxy.
func testSigner(t testing.TB) *auth.Signer {
	t.Helper()
	signer, err := auth.NewSigner([]string{strings.Repeat("k", 32)})
	if err != nil {
		t.Fatal(err)
	}
	return signer
}

// goStatus sends req on the harness's client from a goroutine of its own
// and gives its answer's status (0 when it failed) on the channel it
// returns, once the body is read: for a test that holds the request at
// the sandbox while it acts.
func (h *harness) goStatus(req *http.Request) <-chan int {
	status := make(chan int, 1)
	go func() {
		resp, err := h.client.Do(req)
		if err != nil {
			status <- 0
			return
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		status <- resp.StatusCode
	}()
	return status
}

// goRawStatus is goStatus for a head written as is on a connection of its
// own (an upgrade's, say, which the client would not send as written).
func (h *harness) goRawStatus(t *testing.T, head string) <-chan int {
	c := dialRaw(t, h.addr)
	_ = c.SetDeadline(time.Now().Add(20 * time.Second))
	io.WriteString(c, head)
	status := make(chan int, 1)
	go func() {
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			status <- 0
			return
		}
		status <- resp.StatusCode
	}()
	return status
}
