package proxy

import (
	"bufio"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// client.read_timeout bounds a TLS connection's handshake and its first
// request head together, from the accept, as nginx 1.22's
// client_header_timeout does (one timer, set at the accept, runs through the
// handshake and the first head). The head's deadline was set anew once the
// handshake ended: a client that sent its ClientHello 59 s after connecting
// and then part of a head held the connection 119 s, where nginx closes it
// at 60 s (measured on the binary and nginx 1.22.1: ClientHello 30 s after
// the connect, then nothing: nginx closed at 60.0 s, the proxy at 90.3 s).
// Connections held twice as long are twice the connections, memory and
// descriptors a slow client without credentials keeps at a given rate.
//
// The client starts its handshake 0.7 read timeouts after the connect:
// the handshake has 0.6 s left (at 0.8 of a 1 s timeout, 0.2 s was too
// little for a handshake under -race on loaded cores, which the proxy
// then cut: "connection reset by peer"), and a head deadline set anew
// after it would still end the connection past the 1.4 timeouts allowed.
func TestTLSHandshakeAndFirstHeadShareTheReadTimeout(t *testing.T) {
	t.Parallel()
	const readTimeout = 2 * time.Second
	h := newHarness(t, func(o *harnessOpts) {
		o.srv.ClientReadTimeout = readTimeout
	})
	host := h.route("tlshead", backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, _ := io.Copy(io.Discard, r.Body)
		w.Header().Set("X-Body", strconv.FormatInt(n, 10))
	})))
	addr, roots := serveTLS(t, h)
	cfg := &tls.Config{RootCAs: roots, ServerName: host}

	// lateHandshake connects, waits most of the read timeout, and only
	// then runs its handshake; it returns when it connected.
	lateHandshake := func(t *testing.T) (*tls.Conn, time.Time) {
		raw := dialRaw(t, addr)
		start := time.Now()
		time.Sleep(readTimeout * 7 / 10)
		c := tls.Client(raw, cfg)
		if err := c.Handshake(); err != nil {
			t.Fatalf("handshake: %v", err)
		}
		return c, start
	}

	// The connection ends (a 408, or a close) at the accept plus the read
	// timeout; before, at the handshake's end plus the read timeout.
	for _, tc := range []struct{ name, sent string }{
		{"nothing after the handshake", ""},
		{"part of a head after the handshake", "GET / HTTP/1.1\r\nHost: " + host + "\r\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, start := lateHandshake(t)
			if _, err := io.WriteString(c, tc.sent); err != nil {
				t.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, c)
			if took := time.Since(start); took > readTimeout*14/10 {
				t.Fatalf("connection ended %v after the connect, want about %v (the read timeout from the accept)", took.Round(time.Millisecond), readTimeout)
			}
		})
	}

	// A head begun within the time keeps the timeouts that follow it: its
	// body's (client.body_timeout), and the keep-alive wait after it.
	t.Run("later deadlines unchanged", func(t *testing.T) {
		c, start := lateHandshake(t)
		br := bufio.NewReader(c)
		if _, err := io.WriteString(c, "POST / HTTP/1.1\r\nHost: "+host+"\r\nContent-Length: 5\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Until(start.Add(readTimeout * 15 / 10)))
		if _, err := io.WriteString(c, "hello"); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("a body sent after the read timeout (within the body timeout): %v", err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 || resp.Header.Get("X-Body") != "5" {
			t.Fatalf("got %d, body of %q bytes, want 200 and 5", resp.StatusCode, resp.Header.Get("X-Body"))
		}
		keptRequest(t, c, br, "GET / HTTP/1.1\r\nHost: "+host+"\r\n\r\n")
	})
}

// A TLS handshake grows the stack of the goroutine it runs on to 32 KiB,
// and the runtime halves a stack only while less than a quarter of it is
// in use. Run on the connection's goroutine, the handshake left that
// stack to the first request, which, waiting on its sandbox, used too
// much of it to be shrunk: an HTTPS connection waiting on a slow sandbox
// held ≈ 22 KiB of stack, a plain one ≈ 14 (300 connections each). The
// handshake now runs on a goroutine of its own.
func TestTLSHandshakeStackIsNotTheConnections(t *testing.T) {
	if raceDetectorOn {
		t.Skip("the race detector's instrumentation grows every stack")
	}
	const conns = 200
	stackPerConn := func(t *testing.T, useTLS bool) float64 {
		t.Helper()
		done := make(chan struct{})
		var reached atomic.Int64
		h := newHarness(t)
		host := h.route("stack", backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			reached.Add(1)
			<-done
		})))
		defer close(done)
		addr := h.addr
		if useTLS {
			addr, _ = serveTLS(t, h)
		}
		warmUp(t, addr, useTLS)
		before := stackInUse()
		for range conns {
			var c net.Conn = dialRaw(t, addr)
			if useTLS {
				c = tls.Client(c, &tls.Config{InsecureSkipVerify: true})
			}
			defer c.Close()
			if _, err := io.WriteString(c, "GET /slow HTTP/1.1\r\nHost: "+host+"\r\n\r\n"); err != nil {
				t.Fatal(err)
			}
		}
		testenv.WaitFor(t, 10*time.Second, "every request at the sandbox", func() bool { return reached.Load() == conns })
		return float64(stackInUse()-before) / conns / 1024
	}
	plain := stackPerConn(t, false)
	overTLS := stackPerConn(t, true)
	t.Logf("stack per connection waiting on a slow sandbox: HTTP %.1f KiB, HTTPS %.1f KiB", plain, overTLS)
	if overTLS > plain+2 {
		t.Errorf("an HTTPS connection waiting on a slow sandbox holds %.1f KiB of stack, a plain one %.1f: the handshake's stack stayed the connection's", overTLS, plain)
	}
}

// stackInUse is the goroutine stacks' memory after a collection, which
// shrinks the stacks that can be.
func stackInUse() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.StackInuse
}

// client.read_timeout alone bounds a TLS handshake, from the accept, as
// nginx's client_header_timeout does (send_timeout plays no part there).
// fasthttp sets client.write_timeout as the write deadline before the
// handshake, while nothing has been read: a client that sent its
// ClientHello later than that got no server flight, an EOF in its
// handshake, whatever client.read_timeout allowed, so a write timeout
// lowered to cut slow readers sooner failed handshakes nginx completes
// (measured on the binary with write 2 s and read 10 s: a ClientHello 3 s
// after the connect failed). A ClientHello at once is served as before,
// and one after the read timeout is still cut
// (TestTLSHandshakeAndFirstHeadShareTheReadTimeout).
func TestTLSHandshakeNotBoundedByWriteTimeout(t *testing.T) {
	t.Parallel()
	const writeTimeout = 300 * time.Millisecond
	h := newHarness(t, func(o *harnessOpts) {
		o.srv.ClientReadTimeout = 10 * time.Second
		o.srv.ClientWriteTimeout = writeTimeout
	})
	host := h.route("tlswrite", backend(t, "127.0.0.1", http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})))
	addr, roots := serveTLS(t, h)
	for _, tc := range []struct {
		name  string
		after time.Duration // from the connect to the ClientHello
	}{
		{"ClientHello at once", 0},
		// Five write timeouts: past the write deadline fasthttp set when
		// it began to serve the connection, even on a loaded machine
		// that began it late; well within the read timeout.
		{"ClientHello after five write timeouts", 5 * writeTimeout},
	} {
		t.Run(tc.name, func(t *testing.T) {
			raw := dialRaw(t, addr)
			time.Sleep(tc.after)
			c := tls.Client(raw, &tls.Config{RootCAs: roots, ServerName: host})
			_ = c.SetDeadline(time.Now().Add(5 * time.Second))
			if err := c.Handshake(); err != nil {
				t.Fatalf("handshake %v after the connect: %v, want it served (client.read_timeout is 10 s)", tc.after, err)
			}
			// The first answer still goes out: fasthttp sets the write
			// timeout again before it writes one.
			keptRequest(t, c, bufio.NewReader(c), "GET / HTTP/1.1\r\nHost: "+host+"\r\n\r\n")
		})
	}
}

// The proxy's own wait for a certificate (an on-demand ACME order, run
// inside the handshake: seconds, more with DNS-01 propagation) is not the
// client's slowness, so client.read_timeout and write_timeout do not count
// it. They did: the deadlines set at the accept passed while the order
// ran, and the client that waited for it got the connection closed (EOF)
// once the certificate was there: every new sandbox name's first
// handshake failed when its order took longer than the timeouts (60 s by
// default; a hardened 10 s read timeout against a DNS-01 order of 15 s).
// After the wait the client still has its timeouts: one that then sends
// nothing is closed as before.
func TestTLSCertificateWaitNotCountedAgainstTheClient(t *testing.T) {
	t.Parallel()
	const timeout = time.Second
	const wait = 2 * timeout // the order
	h := newHarness(t, func(o *harnessOpts) {
		o.srv.ClientReadTimeout = timeout
		o.srv.ClientWriteTimeout = timeout
	})
	host := h.route("certwait", backend(t, "127.0.0.1", http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})))
	ca := testenv.NewCA(t, "proxy test CA")
	cert := ca.Certificate(t, "*.cube.test")
	ln := listen(t, "127.0.0.1:0")
	go h.server.ServeTLS(ln, &tls.Config{GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
		time.Sleep(wait)
		return &cert, nil
	}})
	handshake := func(t *testing.T) (*tls.Conn, time.Time) {
		raw := dialRaw(t, ln.Addr().String())
		start := time.Now()
		c := tls.Client(raw, &tls.Config{RootCAs: ca.Pool(), ServerName: host})
		if err := c.Handshake(); err != nil {
			t.Fatalf("handshake that waited %v for its certificate: %v", wait, err)
		}
		return c, start
	}

	t.Run("handshake and first request", func(t *testing.T) {
		c, _ := handshake(t)
		keptRequest(t, c, bufio.NewReader(c), "GET / HTTP/1.1\r\nHost: "+host+"\r\n\r\n")
	})
	t.Run("a silent client is still cut", func(t *testing.T) {
		c, start := handshake(t)
		_, _ = io.Copy(io.Discard, c)
		if took := time.Since(start); took > wait+timeout*3 {
			t.Fatalf("connection ended %v after the connect, want about %v (the wait, then the read timeout)", took.Round(time.Millisecond), wait+timeout)
		}
	})
}
