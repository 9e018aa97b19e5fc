package proxy

import (
	"bufio"
	"crypto/tls"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// waitingConns is how many client connections the proxy lists as waiting
// for a request: the ones a new client over client.max_conns may take the
// place of.
func waitingConns(p *Proxy) int {
	if p.waiting == nil {
		return 0
	}
	p.waiting.mu.Lock()
	defer p.waiting.mu.Unlock()
	return p.waiting.n
}

// askOn sends a GET for host on c and reads the whole answer.
func askOn(c net.Conn, host string) (*http.Response, string, error) {
	if _, err := io.WriteString(c, "GET / HTTP/1.1\r\nHost: "+host+"\r\n\r\n"); err != nil {
		return nil, "", err
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return nil, "", err
	}
	b, err := io.ReadAll(resp.Body)
	return resp, string(b), err
}

// checkClosedByProxy fails unless the proxy has closed c: its next read
// ends (EOF, a TLS stream cut short, or a reset), rather than time out.
func checkClosedByProxy(t *testing.T, c net.Conn, what string) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	var b [1]byte
	n, err := c.Read(b[:])
	if n == 0 && (errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET)) {
		return
	}
	t.Errorf("%s: read %d bytes, %v; want the connection closed by the proxy", what, n, err)
}

// At client.max_conns, connections that wait for a request (idle after
// one, or open without a byte; plain and HTTPS, where a handshake done
// without a request waits too) no longer keep new clients
// out: as nginx at worker_connections, the proxy closes the ones waiting
// longest and serves the new client, counts and logs it. Before, three
// new clients got 503 proxy_overloaded (HTTPS: a failed handshake) while
// the three held connections stayed open up to client.read_timeout or
// client.idle_timeout: a client without credentials locked the node out.
func TestMaxConnsReclaimsWaitingConnections(t *testing.T) {
	t.Parallel()
	const (
		idle      = iota // after a request
		silent           // connected, not a byte sent
		handshake        // TLS handshake done, no request
	)
	for _, tc := range []struct {
		name string
		tls  bool
		hold int
	}{
		{"plain idle keep-alive", false, idle},
		{"plain silent", false, silent},
		{"https idle keep-alive", true, idle},
		{"https silent", true, silent},
		{"https handshake only", true, handshake},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, logs, metrics := maxConnsHarness(t, 3)
			web := h.route("sbxreclaim", overloadBackend(t))
			tlsAddr, roots := serveTLS(t, h)
			addr := h.addr
			if tc.tls {
				addr = tlsAddr
			}
			dial := func() net.Conn {
				c := dialRaw(t, addr)
				if tc.tls {
					return tls.Client(c, &tls.Config{RootCAs: roots, ServerName: web})
				}
				return c
			}

			var held []net.Conn
			for i := range 3 {
				var c net.Conn
				switch tc.hold {
				case silent:
					c = dialRaw(t, addr)
				case handshake:
					c = dial()
					if err := c.(*tls.Conn).Handshake(); err != nil {
						t.Fatalf("held connection %d: %v", i, err)
					}
				default:
					c = dial()
					if resp, body, err := askOn(c, web); err != nil || resp.StatusCode != 200 {
						t.Fatalf("held connection %d: %v %q %v", i, resp, body, err)
					}
				}
				held = append(held, c)
				// Listed in this order: the next is not opened before.
				testenv.WaitFor(t, 5*time.Second, "the held connection listed as waiting", func() bool { return waitingConns(h.proxy) == i+1 })
			}
			var fresh []net.Conn
			for i := range 3 {
				c := dial()
				resp, body, err := askOn(c, web)
				if err != nil || resp.StatusCode != 200 || body != "ok" {
					code := 0
					if resp != nil {
						code = resp.StatusCode
					}
					t.Fatalf("new client %d with client.max_conns held by waiting connections: %d %q %v, want 200 ok", i, code, body, err)
				}
				fresh = append(fresh, c)
				// The longest waiting made room for it.
				checkClosedByProxy(t, held[i], "held connection "+string(rune('0'+i)))
			}
			samples := scrapeMetrics(t, metrics)
			if v, _ := metricValue(samples, "cubeproxy_connections_reclaimed_total", nil); v != 3 {
				t.Errorf("cubeproxy_connections_reclaimed_total = %v, want 3", v)
			}
			if v, _ := metricValue(samples, "cubeproxy_connections_refused_total", nil); v != 0 {
				t.Errorf("cubeproxy_connections_refused_total = %v, want 0", v)
			}
			if n := strings.Count(logs.String(), "client.max_conns are not enough"); n != 1 {
				t.Errorf("%d warnings for three reclaims within 10 s, want 1:\n%s", n, logs.String())
			}
			// Counted out once each: reclaimed at the accept, not again
			// at fasthttp's close.
			if n := h.proxy.clientConns.Load(); n != 3 {
				t.Errorf("%d connections counted open with the three new ones, want 3", n)
			}
			for _, c := range fresh {
				c.Close()
			}
			testenv.WaitFor(t, 5*time.Second, "every connection counted out", func() bool { return h.proxy.clientConns.Load() == 0 })
		})
	}
}

// Only connections waiting for a request are reclaimed: one in the middle
// of its request head, an SSE stream and a WebSocket tunnel keep their
// place, and a new client takes the place of the idle keep-alive one
// only. With every connection busy, the next one is refused (503
// proxy_overloaded) and the busy ones are served on.
func TestMaxConnsNeverReclaimsBusyConnections(t *testing.T) {
	h := newHarness(t, func(o *harnessOpts) { o.srv.MaxClientConns = 4 })
	web := h.route("sbxreclaimbusy", overloadBackend(t))
	ws := h.route("sbxreclaimws", wsBackend(t, make(chan error, 4)))
	sseHead := "GET /sse HTTP/1.1\r\nHost: " + web + "\r\nAccept: text/event-stream\r\n\r\n"

	partial := dialRaw(t, h.addr)
	if _, err := io.WriteString(partial, "GET / HTTP/1.1\r\nHost: "+web+"\r\n"); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 5*time.Second, "the half-sent head read", func() bool {
		return h.proxy.clientConns.Load() == 1 && waitingConns(h.proxy) == 0
	})
	_, sseBR, resp, _ := rawAsk(t, h.addr, sseHead)
	if resp.StatusCode != 200 {
		t.Fatalf("SSE GET: %d", resp.StatusCode)
	}
	tunnel := dialWS(t, h, ws)
	defer tunnel.CloseNow()
	if err := wsEcho(t, tunnel); err != nil {
		t.Fatal(err)
	}
	idle, _, resp, _ := rawAsk(t, h.addr, "GET / HTTP/1.1\r\nHost: "+web+"\r\n\r\n")
	if resp.StatusCode != 200 {
		t.Fatalf("keep-alive GET: %d", resp.StatusCode)
	}
	testenv.WaitFor(t, 5*time.Second, "the keep-alive connection listed as waiting", func() bool { return waitingConns(h.proxy) == 1 })

	// A new SSE client takes the idle connection's place.
	_, sse2BR, resp, body := rawAsk(t, h.addr, sseHead)
	if resp.StatusCode != 200 {
		t.Fatalf("new SSE client at client.max_conns with one connection idle: %d %q, want 200", resp.StatusCode, body)
	}
	checkClosedByProxy(t, idle, "idle keep-alive connection")

	// Now every connection is busy: refused.
	_, br, resp, body := rawAsk(t, h.addr, "GET / HTTP/1.1\r\nHost: "+web+"\r\n\r\n")
	checkOverloaded(t, br, resp, body)

	// The busy ones were left alone.
	if _, err := io.WriteString(partial, "\r\n"); err != nil {
		t.Fatal(err)
	}
	if resp, err := http.ReadResponse(bufio.NewReader(partial), nil); err != nil || resp.StatusCode != 200 {
		t.Fatalf("the request whose head was half sent: %v %v", resp, err)
	}
	if err := wsEcho(t, tunnel); err != nil {
		t.Fatalf("tunnel: %v", err)
	}
	// Each stream still delivers (its body is chunked: the event comes
	// after a chunk size line).
	for i, br := range []*bufio.Reader{sseBR, sse2BR} {
		for {
			line, err := br.ReadString('\n')
			if err != nil {
				t.Fatalf("SSE stream %d: %v before its event", i, err)
			}
			if line == "data: one\n" {
				break
			}
		}
	}
	if streams, tunnels := h.proxy.streams.open(); streams != 2 || tunnels != 1 {
		t.Errorf("%d streams and %d tunnels open, want 2 and 1", streams, tunnels)
	}
}

// A TLS connection whose handshake has begun is never closed to make
// room, as nginx's, and neither is it listed as waiting before its
// handshake's first byte: a new client over the limit is refused, and
// the connection is served on once it is done.
func TestMaxConnsNeverReclaimsHandshakeUnderWay(t *testing.T) {
	h := newHarness(t, func(o *harnessOpts) { o.srv.MaxClientConns = 1 })
	web := h.route("sbxreclaimhs", overloadBackend(t))
	tlsAddr, roots := serveTLS(t, h)
	raw := dialRaw(t, tlsAddr)
	// The first bytes of a ClientHello: the record header, its
	// handshake type and the first byte of its length.
	if _, err := raw.Write([]byte{0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00}); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 5*time.Second, "the handshake under way", func() bool {
		return h.proxy.clientConns.Load() == 1 && waitingConns(h.proxy) == 0
	})
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", tlsAddr, &tls.Config{RootCAs: roots, ServerName: web})
	if err == nil {
		c.Close()
		t.Fatal("a new TLS client was let in over client.max_conns by closing a handshake under way")
	}
	if n := h.proxy.clientConns.Load(); n != 1 {
		t.Errorf("%d connections counted open, want the one in its handshake", n)
	}
	raw.Close()
	testenv.Eventually(t, 5*time.Second, func() error {
		c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", tlsAddr, &tls.Config{RootCAs: roots, ServerName: web})
		if err != nil {
			return err
		}
		// Done, its handshake leaves it waiting: listed again.
		defer c.Close()
		if resp, body, err := askOn(c, web); err != nil || resp.StatusCode != 200 {
			t.Fatalf("TLS client once room freed up: %v %q %v", resp, body, err)
		}
		return nil
	})
}

// A connection reclaimed in the instant its request began is counted out
// of client.max_conns once: by the reclaim, not again when fasthttp closes
// it, nor when the owner of its hijack (a WebSocket that began in that
// instant) closes it.
func TestReclaimedConnectionCountedOutOnce(t *testing.T) {
	for _, hijacked := range []bool{false, true} {
		h := newHarness(t, func(o *harnessOpts) { o.srv.MaxClientConns = 1 })
		p := h.proxy
		ln := listen(t, "127.0.0.1:0")
		s, _ := acceptPair(t, ln)
		c := p.adopt(s)
		p.clientConns.Add(1) // admitted by the listener
		p.connState(c, fasthttp.StateNew)
		l := newRetryListener(ln, slog.New(slog.NewTextHandler(io.Discard, nil)), nil)
		l.limit(&p.clientConns, 1, p.waiting)
		if !l.reclaim() {
			t.Fatal("a new connection reclaimed nothing with one waiting")
		}
		p.connState(c, fasthttp.StateActive) // its request had begun
		if hijacked {
			p.connState(c, fasthttp.StateHijacked)
			p.clientConnClosed() // the hijack's owner closes it
		} else {
			p.connState(c, fasthttp.StateClosed)
		}
		if n := p.clientConns.Load(); n != 0 {
			t.Errorf("hijacked %v: %d connections counted open after the reclaimed one closed, want 0", hijacked, n)
		}
	}
}

// BenchmarkWaitListRequest is what client.max_conns adds to each request
// on a keep-alive connection: taken off the waiting list as its request
// begins (StateActive), put back once answered (StateIdle), with 1,000
// other connections listed. With the limit off (the default) neither runs.
func BenchmarkWaitListRequest(b *testing.B) {
	var w waitList
	for range 1000 {
		w.push(&clientConn{})
	}
	c := &clientConn{}
	w.push(c)
	b.ReportAllocs()
	for b.Loop() {
		w.remove(c)
		w.push(c)
	}
}
