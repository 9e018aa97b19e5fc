package proxy

import (
	"bufio"
	"context"
	"crypto/tls"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// Every way a client connection ends gives its place under
// client.max_conns back: a keep-alive connection fasthttp closes, a TLS
// handshake that fails, a
// detached SSE stream the drain ends, a WebSocket the drain deadline cuts,
// and a redirect connection. Once Shutdown returned, nothing is counted.
func TestMaxConnsCountedOutOnEveryClose(t *testing.T) {
	h := newHarness(t, func(o *harnessOpts) {
		o.srv.MaxClientConns = 100
		o.srv.DrainTimeout = 300 * time.Millisecond
	})
	web := h.route("sbxcount", overloadBackend(t))
	ws := h.route("sbxcountws", wsBackend(t, make(chan error, 4)))
	tlsAddr, _ := serveTLS(t, h)
	rln := listen(t, "127.0.0.1:0")
	go h.server.ServeRedirect(rln, "443")

	open := func() int64 { return h.proxy.clientConns.Load() }
	steps := []struct {
		name string
		do   func(t *testing.T)
	}{
		{"keep-alive GET, client closes", func(t *testing.T) {
			c, _, resp, _ := rawAsk(t, h.addr, "GET / HTTP/1.1\r\nHost: "+web+"\r\n\r\n")
			if resp.StatusCode != 200 {
				t.Fatalf("GET: %d", resp.StatusCode)
			}
			c.Close()
		}},
		{"TLS handshake fails", func(t *testing.T) {
			c := dialRaw(t, tlsAddr)
			_, _ = io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n") // not a ClientHello
			_, _ = io.Copy(io.Discard, c)
			c.Close()
		}},
		{"redirect", func(t *testing.T) {
			c, _, resp, _ := rawAsk(t, rln.Addr().String(), "GET / HTTP/1.1\r\nHost: "+web+"\r\n\r\n")
			if resp.StatusCode/100 != 3 {
				t.Fatalf("redirect: %d", resp.StatusCode)
			}
			c.Close()
		}},
	}
	for _, s := range steps {
		s.do(t)
		testenv.WaitFor(t, 5*time.Second, "the connection counted out after: "+s.name, func() bool { return open() == 0 })
	}

	// Held through the drain: a detached SSE stream, a WebSocket, an idle
	// connection over TLS.
	sse, _, resp, _ := rawAsk(t, h.addr, "GET /sse HTTP/1.1\r\nHost: "+web+"\r\nAccept: text/event-stream\r\n\r\n")
	if resp.StatusCode != 200 {
		t.Fatalf("SSE: %d", resp.StatusCode)
	}
	defer sse.Close()
	tunnel := dialWS(t, h, ws)
	defer tunnel.CloseNow()
	tc, err := tls.Dial("tcp", tlsAddr, &tls.Config{InsecureSkipVerify: true})
	if err != nil {
		t.Fatal(err)
	}
	defer tc.Close()
	// An idle keep-alive connection over TLS (one that never sent a
	// request is fasthttp's until its read timeout, drain or not).
	if _, err := io.WriteString(tc, "GET / HTTP/1.1\r\nHost: "+web+"\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	if resp, err := http.ReadResponse(bufio.NewReader(tc), nil); err != nil || resp.StatusCode != 200 {
		t.Fatalf("GET over TLS: %v %v", resp, err)
	}
	if n := open(); n != 3 {
		t.Fatalf("%d connections counted, want 3", n)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := h.server.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 5*time.Second, "every connection counted out after the drain", func() bool {
		return open() == 0
	})
}
