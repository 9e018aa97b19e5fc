package proxy

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// Every way an exchange ends gives its sandbox connection back under
// upstream.max_conns: closed, or idle in the pool, never counted busy
// once the exchange is over. After a storm of endings (timeouts of either
// side, resets, early answers, cut uploads, declined and closed
// WebSockets) the pool holds only idle connections, and the limit still
// admits exactly max_conns streams at once.
func TestUpstreamMaxConnsGivenBackEveryWay(t *testing.T) {
	t.Parallel()
	const maxConns = 2
	const timeout = 300 * time.Millisecond
	h := newHarness(t, func(o *harnessOpts) {
		o.cfg.MaxConnsPerUpstream = maxConns
		o.cfg.ResponseHeaderTimeout = timeout
		o.srv.ClientWriteTimeout = timeout
		o.srv.ClientBodyTimeout = timeout
	})
	big := strings.Repeat("x", 8<<20)
	port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/slowhead":
			select {
			case <-r.Context().Done():
			case <-time.After(5 * time.Second):
			}
		case "/cutbody":
			w.Header().Set("Content-Length", "1000")
			io.WriteString(w, "short")
			w.(http.Flusher).Flush()
			c, _, _ := w.(http.Hijacker).Hijack()
			c.Close()
		case "/reset":
			c, _, _ := w.(http.Hijacker).Hijack()
			c.(*net.TCPConn).SetLinger(0)
			c.Close()
		case "/extra":
			c, bw, _ := w.(http.Hijacker).Hijack()
			bw.WriteString("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokEXTRA")
			bw.Flush()
			time.Sleep(50 * time.Millisecond)
			c.Close()
		case "/early":
			w.WriteHeader(403)
			io.WriteString(w, "no")
		case "/big":
			io.WriteString(w, big)
		case "/sse":
			f := sseHeaders(w)
			io.WriteString(w, "data: one\n\n")
			f.Flush()
			<-r.Context().Done()
		default:
			io.Copy(io.Discard, r.Body)
			io.WriteString(w, "ok")
		}
	}))
	host := h.route("sbxupstorm", port)
	ask := func(t *testing.T, head string) (net.Conn, *http.Response) {
		t.Helper()
		c := dialRaw(t, h.addr)
		io.WriteString(c, head)
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatalf("%q: %v", head, err)
		}
		return c, resp
	}
	get := func(path string) string { return "GET " + path + " HTTP/1.1\r\nHost: " + host + "\r\n\r\n" }
	steps := []struct {
		name string
		do   func(t *testing.T)
	}{
		{"response header timeout", func(t *testing.T) {
			if _, resp := ask(t, get("/slowhead")); resp.StatusCode != 504 {
				t.Fatalf("%d, want 504", resp.StatusCode)
			}
		}},
		{"client leaves before the head", func(t *testing.T) {
			c := dialRaw(t, h.addr)
			io.WriteString(c, get("/slowhead"))
			time.Sleep(50 * time.Millisecond)
			reset(c.(*net.TCPConn))
		}},
		{"body cut by the sandbox", func(t *testing.T) {
			if _, resp := ask(t, get("/cutbody")); resp.StatusCode != 502 {
				t.Fatalf("%d, want 502", resp.StatusCode)
			}
		}},
		{"sandbox resets", func(t *testing.T) {
			if _, resp := ask(t, get("/reset")); resp.StatusCode != 502 {
				t.Fatalf("%d, want 502", resp.StatusCode)
			}
		}},
		{"sandbox sends more than its answer", func(t *testing.T) { ask(t, get("/extra")) }},
		{"early answer to an upload", func(t *testing.T) {
			c := dialRaw(t, h.addr)
			io.WriteString(c, "POST /early HTTP/1.1\r\nHost: "+host+"\r\nContent-Length: 10000000\r\n\r\n"+strings.Repeat("u", 100000))
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil || resp.StatusCode != 403 {
				t.Fatalf("%v %v, want 403", resp, err)
			}
			c.Close()
		}},
		{"upload stalled by its client", func(t *testing.T) {
			c := dialRaw(t, h.addr)
			io.WriteString(c, "POST / HTTP/1.1\r\nHost: "+host+"\r\nContent-Length: 10000000\r\n\r\n"+strings.Repeat("u", 100000))
			io.Copy(io.Discard, c)
		}},
		{"upload reset by its client", func(t *testing.T) {
			c := dialRaw(t, h.addr)
			io.WriteString(c, "POST / HTTP/1.1\r\nHost: "+host+"\r\nTransfer-Encoding: chunked\r\n\r\n10000\r\n"+strings.Repeat("u", 0x10000)+"\r\n")
			time.Sleep(50 * time.Millisecond)
			reset(c.(*net.TCPConn))
		}},
		{"download never read", func(t *testing.T) {
			c := dialRaw(t, h.addr)
			io.WriteString(c, get("/big"))
			time.Sleep(3 * timeout)
			io.Copy(io.Discard, c)
		}},
		{"download left midway", func(t *testing.T) {
			c, resp := ask(t, get("/big"))
			io.ReadFull(resp.Body, make([]byte, 100000))
			reset(c.(*net.TCPConn))
		}},
		{"stream left", func(t *testing.T) {
			c, _ := ask(t, "GET /sse HTTP/1.1\r\nHost: "+host+"\r\nAccept: text/event-stream\r\n\r\n")
			c.Close()
		}},
		{"WebSocket declined", func(t *testing.T) {
			_, resp := ask(t, "GET /ws HTTP/1.1\r\nHost: "+host+"\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"+
				"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n")
			if resp.StatusCode != 200 {
				t.Fatalf("%d, want the sandbox's 200", resp.StatusCode)
			}
		}},
	}
	for _, s := range steps {
		t.Run(s.name, func(t *testing.T) {
			s.do(t)
			testenv.WaitFor(t, 10*time.Second, "only idle sandbox connections left", func() bool {
				_, idle := h.proxy.pools.gauges()
				_, conns, pending := h.proxy.pools.stats()
				sb := h.proxy.sandboxes.peek("sbxupstorm")
				return conns == idle && conns <= maxConns && pending == 0 && (sb == nil || sb.inFlight() == 0)
			})
		})
	}
	var held []net.Conn
	for i := range maxConns {
		c, resp := ask(t, "GET /sse HTTP/1.1\r\nHost: "+host+"\r\nAccept: text/event-stream\r\n\r\n")
		if resp.StatusCode != 200 {
			t.Fatalf("stream %d: %d", i, resp.StatusCode)
		}
		held = append(held, c)
	}
	if _, resp := ask(t, get("/")); resp.StatusCode != 503 {
		t.Fatalf("over upstream.max_conns: %d, want 503", resp.StatusCode)
	}
	for _, c := range held {
		c.Close()
	}
	testenv.WaitFor(t, 10*time.Second, "the streams' connections back", func() bool {
		_, idle := h.proxy.pools.gauges()
		return poolConns(h) == idle
	})
	if _, resp := ask(t, get("/")); resp.StatusCode != 200 {
		t.Fatalf("after the streams: %d", resp.StatusCode)
	}
}
