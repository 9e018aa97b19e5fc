package proxy

import (
	"bufio"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// stormBackend answers "/" with "ok", "/sse" with an event stream held
// until its client leaves, "/flood" with events written as fast as the
// client takes them, "/big" with 8 MiB, and reads any body it is sent.
// floods gets a value as each "/flood" ends (the proxy closed its side).
func stormBackend(t *testing.T) (port uint16, floods <-chan struct{}) {
	big := strings.Repeat("x", 8<<20)
	ended := make(chan struct{}, 16)
	return backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		switch r.URL.Path {
		case "/sse":
			f := sseHeaders(w)
			_, _ = io.WriteString(w, "data: one\n\n")
			f.Flush()
			<-r.Context().Done()
		case "/flood":
			defer func() {
				select {
				case ended <- struct{}{}:
				default:
				}
			}()
			f := sseHeaders(w)
			ev := "data: " + strings.Repeat("e", 4<<10) + "\n\n"
			for r.Context().Err() == nil {
				if _, err := io.WriteString(w, ev); err != nil {
					return
				}
				f.Flush()
			}
		case "/big":
			_, _ = io.WriteString(w, big)
		default:
			_, _ = io.WriteString(w, "ok")
		}
	})), ended
}

// endsWithin reads c until it fails and fails the test unless that comes
// within d (a close, a reset, not the test's own deadline).
func endsWithin(t *testing.T, c net.Conn, d time.Duration) {
	t.Helper()
	start := time.Now()
	_ = c.SetReadDeadline(start.Add(d + 5*time.Second))
	_, err := io.Copy(io.Discard, c)
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Fatalf("connection still open %v after it should have ended", time.Since(start))
	}
	if took := time.Since(start); took > d {
		t.Fatalf("connection ended after %v, want within %v", took, d)
	}
}

// Every way a client connection ends under client.max_conns, by the
// client's doing or by a timeout, gives back everything it held: its place
// under the limit (and cubeproxy_connections_open), its sandbox's stream
// slot, the held-body budget, and the sandbox connection's. After the
// storm the limit still admits exactly max_conns busy connections.
func TestLimitStormGivesEverythingBack(t *testing.T) {
	t.Parallel()
	const maxConns = 4
	const timeout = 400 * time.Millisecond
	tel := obsTelemetry(t, nil)
	h := newHarness(t, func(o *harnessOpts) {
		o.cfg.Telemetry = tel
		o.cfg.MaxStreamsPerSandbox = 1
		o.cfg.StreamLimitWait = 5 * time.Second
		o.cfg.MaxRequestBodySize = 256 << 10
		o.srv.MaxClientConns = maxConns
		o.srv.ClientReadTimeout = timeout
		o.srv.ClientIdleTimeout = timeout
		o.srv.ClientWriteTimeout = timeout
		o.srv.ClientBodyTimeout = timeout
	})
	admin := obsMetricsAdmin(t, h, tel)
	port, floods := stormBackend(t)
	a := h.route("sbxstorma", port)
	b := h.route("sbxstormb", port)
	ws := h.route("sbxstormws", wsBackend(t, make(chan error, 16)))
	tlsAddr, roots := serveTLS(t, h)
	const ends = 3 * timeout  // how long a client waits for a timeout to pass
	const late = 10 * timeout // a timeout's end, with room for a loaded machine
	// openSSE sends head, an event stream's request, and returns its
	// connection once the stream is open.
	openSSE := func(t *testing.T, head string) net.Conn {
		t.Helper()
		c, _, resp, _ := rawAsk(t, h.addr, head)
		if resp.StatusCode != 200 {
			t.Fatalf("SSE: %d", resp.StatusCode)
		}
		return c
	}
	// floodCut waits, never reading c, for the write timeout to end its
	// flood (the sandbox sees its connection closed), then for c to end.
	// Read after a fixed wait instead, a stream that filled the buffers
	// slower than that (TLS under -race on loaded cores) flowed again and
	// never ended.
	floodCut := func(t *testing.T, c net.Conn) {
		t.Helper()
		testenv.Recv(t, floods, late, "the flood's end at the sandbox, its client never reading")
		endsWithin(t, c, late)
	}
	sseHead := "GET /sse HTTP/1.1\r\nHost: " + a + "\r\nAccept: text/event-stream\r\n\r\n"

	steps := []struct {
		name string
		do   func(t *testing.T)
	}{
		{"slowloris head", func(t *testing.T) {
			c := dialRaw(t, h.addr)
			_, _ = io.WriteString(c, "GET / HTTP/1.1\r\nHost: "+b+"\r\nX-Slow: ")
			stop := make(chan struct{})
			go func() {
				tk := time.NewTicker(50 * time.Millisecond)
				defer tk.Stop()
				for {
					select {
					case <-stop:
						return
					case <-tk.C:
						if _, err := c.Write([]byte("a")); err != nil {
							return
						}
					}
				}
			}()
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			close(stop)
			if err != nil || resp.StatusCode != 408 {
				t.Fatalf("slowloris: %v %v, want 408", resp, err)
			}
			c.Close()
		}},
		{"silent connection", func(t *testing.T) { endsWithin(t, dialRaw(t, h.addr), late) }},
		{"idle keep-alive", func(t *testing.T) {
			c, _, resp, _ := rawAsk(t, h.addr, "GET / HTTP/1.1\r\nHost: "+b+"\r\n\r\n")
			if resp.StatusCode != 200 {
				t.Fatalf("GET: %d", resp.StatusCode)
			}
			endsWithin(t, c, late)
		}},
		{"slow body", func(t *testing.T) {
			c := dialRaw(t, h.addr)
			_, _ = io.WriteString(c, "POST / HTTP/1.1\r\nHost: "+b+"\r\nContent-Length: 100000\r\n\r\n"+strings.Repeat("b", 20000))
			endsWithin(t, c, late)
		}},
		{"slow body at the stream limit (held)", func(t *testing.T) {
			c := dialRaw(t, h.addr)
			_, _ = io.WriteString(c, "POST /mcp HTTP/1.1\r\nHost: "+a+"\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: 100000\r\n\r\n"+strings.Repeat(" ", 20000))
			endsWithin(t, c, late)
		}},
		{"download never read", func(t *testing.T) {
			c := dialRaw(t, h.addr)
			_, _ = io.WriteString(c, "GET /big HTTP/1.1\r\nHost: "+a+"\r\n\r\n")
			time.Sleep(ends) // never reads: the write timeout must end it
			endsWithin(t, c, late)
		}},
		{"event stream never read", func(t *testing.T) {
			c := dialRaw(t, h.addr)
			_, _ = io.WriteString(c, "GET /flood HTTP/1.1\r\nHost: "+a+"\r\nAccept: text/event-stream\r\n\r\n")
			floodCut(t, c)
		}},
		{"event stream reset", func(t *testing.T) {
			c := openSSE(t, sseHead)
			reset(c.(*net.TCPConn))
		}},
		{"event stream asked with Connection: close", func(t *testing.T) {
			c := openSSE(t, "GET /sse HTTP/1.1\r\nHost: "+a+"\r\nConnection: close\r\nAccept: text/event-stream\r\n\r\n")
			c.Close()
		}},
		{"event stream over HTTP/1.0", func(t *testing.T) {
			c := openSSE(t, "GET /sse HTTP/1.0\r\nHost: "+a+"\r\nAccept: text/event-stream\r\n\r\n")
			c.Close()
		}},
		{"client leaves while waiting for a stream slot", func(t *testing.T) {
			holder := openSSE(t, sseHead)
			waiter := dialRaw(t, h.addr)
			_, _ = io.WriteString(waiter, sseHead)
			time.Sleep(100 * time.Millisecond)
			reset(waiter.(*net.TCPConn))
			holder.Close()
		}},
		{"body over max_request_body", func(t *testing.T) {
			c := dialRaw(t, h.addr)
			_, _ = io.WriteString(c, "POST / HTTP/1.1\r\nHost: "+b+"\r\nContent-Length: 1000000\r\n\r\n"+strings.Repeat("x", 9<<10))
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil || resp.StatusCode != 413 {
				t.Fatalf("%v %v, want 413", resp, err)
			}
			c.Close()
		}},
		{"pipelined behind Connection: close", func(t *testing.T) {
			c := dialRaw(t, h.addr)
			_, _ = io.WriteString(c, "GET / HTTP/1.1\r\nHost: "+b+"\r\nConnection: close\r\n\r\nGET / HTTP/1.1\r\nHost: "+b+"\r\n\r\n")
			endsWithin(t, c, 10*time.Second)
		}},
		{"WebSocket closed", func(t *testing.T) {
			c := dialWS(t, h, ws)
			if err := wsEcho(t, c); err != nil {
				t.Fatal(err)
			}
			c.Close(websocket.StatusNormalClosure, "")
		}},
		{"WebSocket reset", func(t *testing.T) {
			c := rawProxyConn(t, h, "GET /ws HTTP/1.1\r\nHost: "+ws+"\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"+
				"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Protocol: echo.v1\r\n\r\n")
			if resp, err := http.ReadResponse(bufio.NewReader(c), nil); err != nil || resp.StatusCode != 101 {
				t.Fatalf("upgrade: %v %v", resp, err)
			}
			reset(c)
		}},
		{"WebSocket asked with Connection: close", func(t *testing.T) {
			c := rawProxyConn(t, h, "GET /ws HTTP/1.1\r\nHost: "+ws+"\r\nConnection: Upgrade, close\r\nUpgrade: websocket\r\n"+
				"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Protocol: echo.v1\r\n\r\n")
			_, _ = http.ReadResponse(bufio.NewReader(c), nil)
			c.Close()
		}},
		{"TLS handshake garbage", func(t *testing.T) {
			c := dialRaw(t, tlsAddr)
			_, _ = io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
			endsWithin(t, c, 10*time.Second)
			c.Close()
		}},
		{"TLS handshake never sent", func(t *testing.T) { endsWithin(t, dialRaw(t, tlsAddr), late) }},
		{"TLS handshake reset midway", func(t *testing.T) {
			c := dialRaw(t, tlsAddr)
			_, _ = c.Write([]byte{0x16, 0x03, 0x01, 0x02, 0x00, 0x01})
			time.Sleep(50 * time.Millisecond)
			reset(c.(*net.TCPConn))
		}},
		{"TLS idle keep-alive", func(t *testing.T) {
			c := tls.Client(dialRaw(t, tlsAddr), &tls.Config{RootCAs: roots, ServerName: b})
			_, _ = io.WriteString(c, "GET / HTTP/1.1\r\nHost: "+b+"\r\n\r\n")
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil || resp.StatusCode != 200 {
				t.Fatalf("GET over TLS: %v %v", resp, err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			endsWithin(t, c, late)
		}},
		{"TLS event stream never read", func(t *testing.T) {
			c := tls.Client(dialRaw(t, tlsAddr), &tls.Config{RootCAs: roots, ServerName: a})
			_, _ = io.WriteString(c, "GET /flood HTTP/1.1\r\nHost: "+a+"\r\nAccept: text/event-stream\r\n\r\n")
			floodCut(t, c)
		}},
		{"TLS event stream closed", func(t *testing.T) {
			c := tls.Client(dialRaw(t, tlsAddr), &tls.Config{RootCAs: roots, ServerName: a})
			_, _ = io.WriteString(c, sseHead)
			if resp, err := http.ReadResponse(bufio.NewReader(c), nil); err != nil || resp.StatusCode != 200 {
				t.Fatalf("SSE over TLS: %v %v", resp, err)
			}
			c.Close()
		}},
		{"TLS client leaves while waiting for a stream slot", func(t *testing.T) {
			holder := openSSE(t, sseHead)
			c := tls.Client(dialRaw(t, tlsAddr), &tls.Config{RootCAs: roots, ServerName: a})
			_, _ = io.WriteString(c, sseHead)
			testenv.WaitFor(t, 5*time.Second, "the wait", func() bool { return h.proxy.limitWaiting.Load() == 1 })
			c.Close()
			testenv.WaitFor(t, 5*time.Second, "the wait's end", func() bool { return h.proxy.limitWaiting.Load() == 0 })
			holder.Close()
		}},
		{"held body judged a request at the limit", func(t *testing.T) {
			holder := openSSE(t, sseHead)
			body := `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"x":"` + strings.Repeat("p", 20000) + `"}}`
			_, _, resp, _ := rawAsk(t, h.addr, "POST /mcp HTTP/1.1\r\nHost: "+a+"\r\nContent-Type: application/json\r\nContent-Length: "+itoa(uint16(len(body)))+"\r\n\r\n"+body)
			if resp.StatusCode != 429 {
				t.Fatalf("a request's body at the limit: %d, want 429", resp.StatusCode)
			}
			holder.Close()
		}},
		{"held body cut by its client", func(t *testing.T) {
			holder := openSSE(t, sseHead)
			c := dialRaw(t, h.addr)
			_, _ = io.WriteString(c, "POST /mcp HTTP/1.1\r\nHost: "+a+"\r\nContent-Type: application/json\r\nContent-Length: 40000\r\n\r\n"+strings.Repeat(" ", 20000))
			testenv.WaitFor(t, 5*time.Second, "the body held", func() bool { return heldBytes(h.proxy) == 40000 })
			reset(c.(*net.TCPConn))
			holder.Close()
		}},
		{"Expect head at the limit, client leaves", func(t *testing.T) {
			holder := openSSE(t, sseHead)
			c := dialRaw(t, h.addr)
			_, _ = io.WriteString(c, "POST /mcp HTTP/1.1\r\nHost: "+a+"\r\nContent-Type: application/json\r\nExpect: 100-continue\r\nContent-Length: 40000\r\n\r\n")
			line, err := bufio.NewReader(c).ReadString('\n')
			if err != nil || !strings.HasPrefix(line, "HTTP/1.1 100") {
				t.Fatalf("Expect head at the limit: %q %v, want 100 Continue", line, err)
			}
			reset(c.(*net.TCPConn))
			holder.Close()
		}},
		{"TLS WebSocket closed", func(t *testing.T) {
			c := tls.Client(dialRaw(t, tlsAddr), &tls.Config{RootCAs: roots, ServerName: ws})
			_, _ = io.WriteString(c, "GET /ws HTTP/1.1\r\nHost: "+ws+"\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"+
				"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Protocol: echo.v1\r\n\r\n")
			if resp, err := http.ReadResponse(bufio.NewReader(c), nil); err != nil || resp.StatusCode != 101 {
				t.Fatalf("upgrade: %v %v", resp, err)
			}
			c.Close()
		}},
	}
	settled := func(t *testing.T, what string) {
		t.Helper()
		testenv.WaitFor(t, 10*time.Second, "everything given back after: "+what, func() bool {
			v, _ := metricValue(scrapeMetrics(t, admin), "cubeproxy_connections_open", nil)
			sa, sb := h.proxy.sandboxes.peek("sbxstorma"), h.proxy.sandboxes.peek("sbxstormb")
			_, _, pending := h.proxy.pools.stats()
			return h.proxy.clientConns.Load() == 0 && v == 0 && heldBytes(h.proxy) == 0 && pending == 0 &&
				(sa == nil || sa.inFlight() == 0) && (sb == nil || sb.inFlight() == 0)
		})
	}
	for _, s := range steps {
		t.Run(s.name, func(t *testing.T) {
			s.do(t)
			settled(t, s.name)
		})
	}

	// The limit still admits exactly maxConns busy connections.
	var held []net.Conn
	for i := range maxConns {
		host := h.route("sbxstormx"+itoa(uint16(i)), port)
		c, _, resp, _ := rawAsk(t, h.addr, "GET /sse HTTP/1.1\r\nHost: "+host+"\r\nAccept: text/event-stream\r\n\r\n")
		if resp.StatusCode != 200 {
			t.Fatalf("stream %d: %d", i, resp.StatusCode)
		}
		held = append(held, c)
	}
	_, br, resp, body := rawAsk(t, h.addr, "GET / HTTP/1.1\r\nHost: "+b+"\r\n\r\n")
	checkOverloaded(t, br, resp, body)
	held[0].Close()
	testenv.WaitFor(t, 5*time.Second, "a place freed", func() bool { return h.proxy.clientConns.Load() < maxConns })
	if _, _, resp, _ := rawAsk(t, h.addr, "GET / HTTP/1.1\r\nHost: "+b+"\r\n\r\n"); resp.StatusCode != 200 {
		t.Fatalf("after a stream closed: %d", resp.StatusCode)
	}
	for _, c := range held[1:] {
		c.Close()
	}
	settled(t, "the streams closed")
}
