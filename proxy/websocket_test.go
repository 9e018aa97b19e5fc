package proxy

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/cube-sandbox/cubeproxy/accesslog"
	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// wsBackend echoes messages; a message "close" makes it close the
// connection with status 4000. Its exit is reported on ended.
func wsBackend(t *testing.T, ended chan<- error) uint16 {
	return backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, &websocket.AcceptOptions{Subprotocols: []string{"echo.v1"}})
		if err != nil {
			ended <- err
			return
		}
		defer c.CloseNow() // as any server: its socket closes with the handler
		c.SetReadLimit(1 << 20)
		ctx := r.Context()
		for {
			typ, msg, err := c.Read(ctx)
			if err != nil {
				ended <- err
				return
			}
			if string(msg) == "close" {
				ended <- c.Close(4000, "backend says bye")
				return
			}
			if err := c.Write(ctx, typ, msg); err != nil {
				ended <- err
				return
			}
		}
	}))
}

// wsEcho sends "ping" through tunnel to an echoing sandbox and reads it
// back, within 10 s; a tunnel cut (or its place at client.max_conns taken)
// is the error.
func wsEcho(t *testing.T, tunnel *websocket.Conn) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := tunnel.Write(ctx, websocket.MessageText, []byte("ping")); err != nil {
		return err
	}
	_, msg, err := tunnel.Read(ctx)
	if err == nil && string(msg) != "ping" {
		t.Errorf("echo %q", msg)
	}
	return err
}

func dialWS(t *testing.T, h *harness, host string) *websocket.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, resp, err := websocket.Dial(ctx, "ws://"+h.addr+"/ws", &websocket.DialOptions{
		Host: host, Subprotocols: []string{"echo.v1"},
	})
	if err != nil {
		t.Fatalf("dial through proxy: %v", err)
	}
	if resp.Header.Get("X-Cube-Request-Id") == "" {
		t.Error("101 lacks X-Cube-Request-Id")
	}
	if c.Subprotocol() != "echo.v1" {
		t.Errorf("subprotocol %q: negotiation must stay end to end", c.Subprotocol())
	}
	c.SetReadLimit(1 << 20)
	return c
}

func TestWebSocketEcho(t *testing.T) {
	h := newHarness(t)
	ended := make(chan error, 1)
	host := h.route("ws", wsBackend(t, ended))
	c := dialWS(t, h, host)
	defer c.CloseNow()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, msg := range []string{"hello", "", string(make([]byte, 200<<10))} {
		if err := c.Write(ctx, websocket.MessageBinary, []byte(msg)); err != nil {
			t.Fatal(err)
		}
		_, got, err := c.Read(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != msg {
			t.Fatalf("echo of %d bytes came back as %d bytes", len(msg), len(got))
		}
	}
}

func TestWebSocketClosePropagates(t *testing.T) {
	t.Run("client closes", func(t *testing.T) {
		h := newHarness(t)
		ended := make(chan error, 1)
		host := h.route("wsc", wsBackend(t, ended))
		c := dialWS(t, h, host)
		if err := c.Close(websocket.StatusNormalClosure, "client done"); err != nil {
			t.Fatalf("close handshake through the proxy: %v", err)
		}
		select {
		case err := <-ended:
			if websocket.CloseStatus(err) != websocket.StatusNormalClosure {
				t.Fatalf("backend saw %v, want normal closure", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("backend never saw the close")
		}
		testenv.WaitFor(t, 10*time.Second, "tunnel released", func() bool { _, n := h.proxy.streams.open(); return n == 0 })
	})
	t.Run("backend closes", func(t *testing.T) {
		h := newHarness(t)
		ended := make(chan error, 1)
		host := h.route("wsb", wsBackend(t, ended))
		c := dialWS(t, h, host)
		defer c.CloseNow()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := c.Write(ctx, websocket.MessageText, []byte("close")); err != nil {
			t.Fatal(err)
		}
		_, _, err := c.Read(ctx)
		if websocket.CloseStatus(err) != 4000 {
			t.Fatalf("client saw %v, want close 4000 from the backend", err)
		}
		testenv.WaitFor(t, 10*time.Second, "tunnel released", func() bool { _, n := h.proxy.streams.open(); return n == 0 })
	})
	t.Run("backend refuses upgrade", func(t *testing.T) {
		h := newHarness(t)
		port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			http.Error(w, "no websockets here", http.StatusForbidden)
		}))
		host := h.route("wsr", port)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, resp, err := websocket.Dial(ctx, "ws://"+h.addr+"/ws", &websocket.DialOptions{Host: host})
		if err == nil || resp == nil || resp.StatusCode != http.StatusForbidden {
			t.Fatalf("want the backend's 403, got resp=%v err=%v", resp, err)
		}
		if errors.Is(err, context.DeadlineExceeded) {
			t.Fatal("refusal hung")
		}
	})
}

// idleEchoTunnel opens a WebSocket to an echo backend through a proxy
// whose idle timeout is idle. ended reports the backend side's end; ctx
// bounds the test's reads and writes.
func idleEchoTunnel(t *testing.T, idle time.Duration, id string) (c *websocket.Conn, ended chan error, ctx context.Context) {
	t.Helper()
	h := newHarness(t, func(o *harnessOpts) { o.cfg.IdleStreamTimeout = idle })
	ended = make(chan error, 1)
	c = dialWS(t, h, h.route(id, wsBackend(t, ended)))
	t.Cleanup(func() { c.CloseNow() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return c, ended, ctx
}

// The idle timeout closes a silent tunnel, never a busy one: the
// deadlines armed for the upgrade exchange must not outlive it.
//
// Traffic every tenth of the idle timeout, for two of them: a stall of a
// few hundred milliseconds (-race on two loaded cores) is still traffic
// well within it, as it was not at a quarter of 300 ms.
func TestBusyTunnelOutlivesIdleTimeout(t *testing.T) {
	t.Parallel()
	const idle = time.Second
	c, _, ctx := idleEchoTunnel(t, idle, "wsbusy")
	start := time.Now()
	for i := 0; time.Since(start) < 2*idle; i++ {
		msg := fmt.Sprint("m", i)
		if err := c.Write(ctx, websocket.MessageText, []byte(msg)); err != nil {
			t.Fatalf("write %d, %v after the upgrade: %v", i, time.Since(start), err)
		}
		if _, got, err := c.Read(ctx); err != nil || string(got) != msg {
			t.Fatalf("echo %d, %v after the upgrade: %q, %v", i, time.Since(start), got, err)
		}
		time.Sleep(idle / 10) // traffic well within the idle timeout
	}
}

// An Upgrade header on a request with a body (curl sends "Upgrade: h2c"
// with a POST) is not a tunnel: the request is forwarded, body included,
// without the hop-by-hop upgrade headers.
func TestUpgradeWithBodyIsForwarded(t *testing.T) {
	h := newHarness(t)
	port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		fmt.Fprintf(w, "%s %q upgrade=%q settings=%q", r.Method, b, r.Header.Get("Upgrade"), r.Header.Get("Http2-Settings"))
	}))
	host := h.route("h2c", port)
	c := dialRaw(t, h.addr)
	fmt.Fprintf(c, "POST /upload HTTP/1.1\r\nHost: %s\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\n"+
		"HTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\nContent-Length: 5\r\n\r\nhello", host)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	if want := `POST "hello" upgrade="" settings=""`; resp.StatusCode != 200 || string(b) != want {
		t.Fatalf("%d %q, want 200 %q", resp.StatusCode, b, want)
	}
}

// Traffic either way keeps a tunnel open: a client that only listens
// (server push, a terminal's output) is not silent for the idle timeout.
// Pushes every tenth of it, as in TestBusyTunnelOutlivesIdleTimeout.
func TestOneWayTunnelOutlivesIdleTimeout(t *testing.T) {
	t.Parallel()
	const idle, n = time.Second, 20 // 20 pushes, idle/10 apart: 2 idle timeouts
	h := newHarness(t, func(o *harnessOpts) { o.cfg.IdleStreamTimeout = idle })
	port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, &websocket.AcceptOptions{Subprotocols: []string{"echo.v1"}})
		if err != nil {
			return
		}
		for i := range n {
			if c.Write(r.Context(), websocket.MessageText, []byte(fmt.Sprint("push ", i))) != nil {
				return
			}
			time.Sleep(idle / 10)
		}
		c.Close(websocket.StatusNormalClosure, "done")
	}))
	c := dialWS(t, h, h.route("wspush", port))
	defer c.CloseNow()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i := range n {
		if _, got, err := c.Read(ctx); err != nil || string(got) != fmt.Sprint("push ", i) {
			t.Fatalf("push %d: %q, %v", i, got, err)
		}
	}
	if _, _, err := c.Read(ctx); websocket.CloseStatus(err) != websocket.StatusNormalClosure {
		t.Fatalf("after the pushes: %v, want the backend's normal close", err)
	}
}

// A tunnel silent both ways for the idle timeout is closed.
func TestSilentTunnelClosesAfterIdleTimeout(t *testing.T) {
	const idle = 200 * time.Millisecond
	// Our clock starts before the upgrade, so before the proxy's: started
	// after it, a test goroutine run late measured less than the idle time
	// the proxy waited. A deadline may fire up to slack(idle) early
	// (setDeadline).
	start := time.Now()
	c, ended, ctx := idleEchoTunnel(t, idle, "wssilent")
	if _, _, err := c.Read(ctx); err == nil {
		t.Fatal("read a message from a silent tunnel")
	}
	if d := time.Since(start); d < idle-slack(idle) || d > 5*time.Second {
		t.Errorf("silent tunnel closed after %v, idle timeout %v", d, idle)
	}
	select {
	case <-ended:
	case <-ctx.Done():
		t.Fatal("the backend side stayed open")
	}
}

// A tunnel's backend connection counts against upstream.max_conns: with
// one allowed, a second WebSocket (or request) to the same port is 503
// until the first closes, and a refused upgrade gives its slot back.
func TestTunnelCountsAgainstMaxConns(t *testing.T) {
	h := newHarness(t, func(o *harnessOpts) { o.cfg.MaxConnsPerUpstream = 1 })
	ended := make(chan error, 4)
	port := wsBackend(t, ended)
	host := h.route("wsmax", port)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	first := dialWS(t, h, host)
	_, resp, err := websocket.Dial(ctx, "ws://"+h.addr+"/ws", &websocket.DialOptions{Host: host})
	if err == nil || resp == nil || resp.StatusCode != 503 {
		t.Fatalf("second WebSocket with max_conns 1: %v %v, want 503", resp, err)
	}
	if code, body, _ := h.get(host, "/plain"); code != 503 || !strings.Contains(body, CodeUpstreamBusy) {
		t.Fatalf("plain request with the tunnel open: %d %s", code, body)
	}
	first.Close(websocket.StatusNormalClosure, "")
	testenv.Recv(t, ended, 10*time.Second, "the tunnel's end at the backend")
	// The slot comes back when the tunnel ends (the proxy's side unwinds
	// just after the backend's).
	testenv.WaitFor(t, 5*time.Second, "the tunnel's slot to be released", func() bool {
		_, conns, _ := h.proxy.pools.stats()
		return conns == 0
	})
	// A refused upgrade (a version the backend does not speak) is relayed
	// and frees the slot at once.
	req := h.req("GET", host, "/ws", nil)
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", "websocket")
	req.Header.Set("Sec-WebSocket-Version", "99")
	req.Header.Set("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ==")
	refused := h.do(req)
	refused.Body.Close()
	if refused.StatusCode < 400 || refused.StatusCode == 503 {
		t.Fatalf("upgrade with version 99: %d, want the backend's refusal", refused.StatusCode)
	}
	second := dialWS(t, h, host)
	second.Close(websocket.StatusNormalClosure, "")
}

// A backend that declines an upgrade answers like any other request, and
// its answer reaches the client like any other: interim 1xx skipped, a
// large body whole, a slow one streamed as it comes, HTTP/1.1 framing.
func TestRefusedUpgradeRelayedLikeAnyAnswer(t *testing.T) {
	h := newHarness(t)
	ack := make(chan struct{})
	big := strings.Repeat("z", 2<<20)
	b := newScriptBackend(t, func(c net.Conn, req *http.Request, _ int) bool {
		switch req.URL.Path {
		case "/continue":
			rawWrite(c, "HTTP/1.1 100 Continue\r\n\r\n"+okResponse("after 100"))
		case "/big":
			rawWrite(c, fmt.Sprintf("HTTP/1.1 403 Forbidden\r\nContent-Length: %d\r\n\r\n%s", len(big), big))
		case "/slow":
			// Chunked, the second half only once the client has the first.
			rawWrite(c, "HTTP/1.1 401 Unauthorized\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nfirst\r\n")
			select {
			case <-ack:
			case <-time.After(10 * time.Second):
				return false
			}
			rawWrite(c, "6\r\nsecond\r\n0\r\n\r\n")
		case "/old":
			rawWrite(c, "HTTP/1.0 404 Not Found\r\n\r\nold style")
		}
		return false
	})
	host := h.route("wsno", b.port)
	upgrade := func(path string) (*http.Response, *bufio.Reader) {
		t.Helper()
		c, err := net.Dial("tcp", h.addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: %s\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"+
			"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n", path, host)
		br := bufio.NewReader(c)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		return resp, br
	}
	for _, tc := range []struct {
		path, body string
		status     int
	}{
		{"/continue", "after 100", 200},
		{"/big", big, 403},
		{"/old", "old style", 404},
	} {
		resp, _ := upgrade(tc.path)
		body, err := io.ReadAll(resp.Body)
		if resp.StatusCode != tc.status || string(body) != tc.body || err != nil || resp.ProtoMinor != 1 {
			t.Errorf("%s: %s %d, %d body bytes, %v; want HTTP/1.1 %d with %d bytes", tc.path, resp.Proto, resp.StatusCode, len(body), err, tc.status, len(tc.body))
		}
	}
	resp, _ := upgrade("/slow")
	first := make([]byte, 5)
	if _, err := io.ReadFull(resp.Body, first); err != nil || string(first) != "first" || resp.StatusCode != 401 {
		t.Fatalf("slow refusal: %d %q %v", resp.StatusCode, first, err)
	}
	testenv.Send(t, ack, struct{}{}, 10*time.Second, "the sandbox to take the ack of the refusal's first half")
	if rest, err := io.ReadAll(resp.Body); err != nil || string(rest) != "second" {
		t.Fatalf("slow refusal, rest: %q %v", rest, err)
	}
	// Every declined upgrade's connection was closed, none is left open.
	testenv.WaitFor(t, 5*time.Second, "declined upgrades' connections closed", func() bool { return poolConns(h) == 0 })
}

// A client that leaves before the backend's 101 arrives takes nothing with
// it: the connection slot, the sandbox's request count and the backend
// socket all come back.
func TestTunnelClientGoneBefore101(t *testing.T) {
	h := newHarness(t, func(o *harnessOpts) { o.cfg.MaxConnsPerUpstream = 1 })
	clientGone := make(chan struct{})
	backendClosed := make(chan struct{}, 1)
	b := newScriptBackend(t, func(c net.Conn, req *http.Request, _ int) bool {
		if req.URL.Path != "/ws" {
			return rawWrite(c, okResponse("fine"))
		}
		<-clientGone
		rawWrite(c, ws101)
		var one [1]byte
		c.Read(one[:]) // until the proxy closes its side
		backendClosed <- struct{}{}
		return false
	})
	host := h.route("wsgone", b.port)
	c, err := net.Dial("tcp", h.addr)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(c, "GET /ws HTTP/1.1\r\nHost: %s\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"+
		"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n", host)
	testenv.WaitFor(t, 5*time.Second, "the upgrade to reach the backend", func() bool { return b.count("GET /ws") == 1 })
	_ = c.(*net.TCPConn).SetLinger(0)
	c.Close() // a reset: writing the 101 to it fails
	close(clientGone)
	select {
	case <-backendClosed:
	case <-time.After(10 * time.Second):
		t.Fatal("the backend connection of the abandoned upgrade is still open")
	}
	testenv.WaitFor(t, 5*time.Second, "the slot and the request count to come back", func() bool {
		return poolConns(h) == 0 && h.proxy.sandboxes.peek("wsgone").inFlight() == 0
	})
	if code, body, _ := h.get(host, "/plain"); code != 200 || body != "fine" {
		t.Fatalf("next request: %d %s", code, body)
	}
}

// A client that reads nothing after its upgrade still lets the tunnel
// end: writing the 101 (and the bytes that came with it) has a deadline.
func TestTunnelToClientThatReadsNothingEnds(t *testing.T) {
	t.Parallel()
	h := newHarness(t, func(o *harnessOpts) {
		o.cfg.IdleStreamTimeout = time.Second
		o.srv.ClientWriteTimeout = time.Second
		o.cfg.UpstreamReadBufferSize = 16 << 20 // so that much comes with the 101
	})
	ln := listen(t, "127.0.0.1:0")
	closed := make(chan struct{}, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		go io.WriteString(c, ws101+strings.Repeat("x", 4<<20))
		io.Copy(io.Discard, c) // until the proxy closes its side
		closed <- struct{}{}
	}()
	host := h.route("wsstall", uint16(ln.Addr().(*net.TCPAddr).Port))
	c := dialSmallWindow(t, h.addr)
	fmt.Fprintf(c, "GET /ws HTTP/1.1\r\nHost: %s\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"+
		"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n", host)
	select { // never reading
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("the tunnel to a client that reads nothing is still open after 10 timeouts")
	}
}

// A client that stops reading an open tunnel is cut after the client write
// timeout, not the idle timeout: the sandbox keeps sending, so the tunnel
// is never idle, and its blocked write would hold it (and the sandbox
// connection) for hours.
func TestTunnelClientThatStopsReadingIsCut(t *testing.T) {
	h := newHarness(t, func(o *harnessOpts) {
		o.cfg.IdleStreamTimeout = time.Hour
		o.srv.ClientWriteTimeout = time.Second
	})
	ln := listen(t, "127.0.0.1:0")
	closed := make(chan struct{}, 1)
	go func() {
		c, br, ok := acceptUpgrade(ln)
		if !ok {
			return
		}
		defer c.Close()
		go func() {
			chunk := []byte(strings.Repeat("x", 64<<10))
			for {
				if _, err := c.Write(chunk); err != nil {
					return
				}
			}
		}()
		io.Copy(io.Discard, br) // until the proxy closes its side
		closed <- struct{}{}
	}()
	host := h.route("wsslow", uint16(ln.Addr().(*net.TCPAddr).Port))
	c := dialSmallWindow(t, h.addr)
	fmt.Fprintf(c, "GET /ws HTTP/1.1\r\nHost: %s\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"+
		"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n", host)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil || resp.StatusCode != 101 {
		t.Fatalf("upgrade: %v %v", resp, err)
	}
	io.WriteString(c, "g") // go ahead; from now on the client reads nothing
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("a tunnel whose client stopped reading is still open after 10 write timeouts")
	}
}

// A tunnel's client that reads steadily but slowly is not cut: the client
// write timeout runs from the last byte it took (clientConn), not from the
// start of each piece the sandbox sent (up to 64 KiB), as nginx's
// send_timeout. Only one that takes nothing for the timeout is cut
// (TestTunnelClientThatStopsReadingIsCut).
//
// The client reads 1 KiB every 100 ms, so a 64 KiB piece takes 6.4 s, 3.2
// timeouts, to drain. The proxy sees the client's progress only when its
// socket has room for a few KiB more: every 300-500 ms at this rate,
// leaving 1.5 s for a stall of the client's goroutine or the proxy's.
// With a 300 ms timeout and 32 KB/s it saw progress every 90-256 ms, 44 ms
// to spare, and a full -race run of the package on a loaded 2-core machine
// cut the tunnel now and then; with a 1 s timeout (500 ms to spare) a run
// at a load of 15 still did, after 92 of 160 KiB.
func TestTunnelSlowSteadyClientIsNotCut(t *testing.T) {
	t.Parallel()
	const (
		size    = 160 << 10
		timeout = 2 * time.Second
	)
	h := newHarness(t, func(o *harnessOpts) {
		o.cfg.IdleStreamTimeout = time.Hour
		o.srv.ClientWriteTimeout = timeout
	})
	ln := listen(t, "127.0.0.1:0")
	go func() {
		c, br, ok := acceptUpgrade(ln)
		if !ok {
			return
		}
		defer c.Close()
		_, _ = c.Write(bytes.Repeat([]byte("x"), size)) // read by the proxy in 64 KiB pieces
		io.Copy(io.Discard, br)                         // until the proxy closes its side
	}()
	host := h.route("wssteady", uint16(ln.Addr().(*net.TCPAddr).Port))
	front := listenSmallSendBuffer(t, 4<<10) // 8 KiB: the kernel doubles it
	go h.server.Serve(front)
	c := dialSmallWindow(t, front.Addr().String())
	_ = c.SetDeadline(time.Now().Add(60 * time.Second))
	fmt.Fprintf(c, "GET /ws HTTP/1.1\r\nHost: %s\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"+
		"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n", host)
	br := bufio.NewReaderSize(c, 1024)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != 101 {
		t.Fatalf("upgrade: %v %v", resp, err)
	}
	io.WriteString(c, "g") // the sandbox's go-ahead
	// 10 KiB/s: 1 KiB every 100 ms, a 64 KiB piece in 6.4 s.
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	buf := make([]byte, 1<<10)
	got, start := 0, time.Now()
	for got < size {
		n, err := io.ReadFull(br, buf[:min(len(buf), size-got)])
		got += n
		if err != nil {
			t.Fatalf("a client reading steadily got %d of %d bytes in %v: %v; want all of it", got, size, time.Since(start).Round(time.Millisecond), err)
		}
		<-tick.C
	}
}

// A sandbox that stops reading while it still sends (its reader stuck, its
// pings or output still flowing) is cut after the idle timeout, as nginx's
// proxy_send_timeout cuts one: the client pushing into it meets TCP
// backpressure (the proxy reads no more than it can write, buffering
// nothing), and the proxy's blocked write to the sandbox does not hold the
// tunnel, its sandbox connection and its max_streams_per_sandbox slot for
// ever. The read side's idle timeout never fires here: the sandbox keeps
// sending. Logged 101 upstream_timeout, as a silent tunnel.
func TestTunnelSandboxThatStopsReadingIsCut(t *testing.T) {
	t.Parallel()
	const idle = time.Second
	h, logs := logHarness(t, accesslog.FormatJSON, func(o *harnessOpts) {
		o.cfg.IdleStreamTimeout = idle
		o.cfg.MaxStreamsPerSandbox = 1
	})
	ln := listenSmallWindow(t)
	sandboxEnd := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			sandboxEnd <- err
			return
		}
		defer c.Close()
		if _, err := http.ReadRequest(bufio.NewReader(c)); err != nil {
			sandboxEnd <- err
			return
		}
		io.WriteString(c, ws101)
		// From here on it reads nothing and pings, as a server whose
		// reader is stuck, until the proxy closes its connection.
		tick := time.NewTicker(idle / 20)
		defer tick.Stop()
		for {
			select {
			case <-t.Context().Done():
				sandboxEnd <- t.Context().Err()
				return
			case <-tick.C:
			}
			if _, err := io.WriteString(c, "p"); err != nil {
				sandboxEnd <- nil
				return
			}
		}
	}()
	host := h.route("wsdeaf", uint16(ln.Addr().(*net.TCPAddr).Port))
	c := dialRaw(t, h.addr)
	fmt.Fprintf(c, "GET /ws HTTP/1.1\r\nHost: %s\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"+
		"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nX-Cube-Request-Id: wsdeaf\r\n\r\n", host)
	br := bufio.NewReader(c)
	if resp, err := http.ReadResponse(br, nil); err != nil || resp.StatusCode != 101 {
		t.Fatalf("upgrade: %v %v", resp, err)
	}
	opened := time.Now()
	pings := make(chan int, 1)
	go func() {
		n, _ := io.Copy(io.Discard, br) // the sandbox's pings, until the cut
		pings <- int(n)
	}()
	// The client pushes until the proxy stops taking its bytes, and then
	// until the tunnel is cut (its write fails) or 5 idle timeouts pass.
	_ = c.SetWriteDeadline(time.Now().Add(5 * idle))
	chunk := make([]byte, 64<<10)
	var err error
	for err == nil {
		_, err = c.Write(chunk)
	}
	if isTimeout(err) {
		t.Fatalf("the client was still pushing into a sandbox that stopped reading %v after its 101: the tunnel was never cut", time.Since(opened))
	}
	if d := time.Since(opened); d < idle-slack(idle) {
		t.Errorf("the tunnel was cut %v after its 101, before the idle timeout (%v)", d, idle)
	}
	if n := <-pings; n == 0 {
		t.Error("the sandbox's pings did not reach the client before the cut")
	}
	if err := testenv.Recv(t, sandboxEnd, 10*time.Second, "the sandbox's connection closed by the cut"); err != nil {
		t.Fatalf("the sandbox's connection was not closed: %v", err)
	}
	e := logs.waitJSON(t, "wsdeaf")
	if e["status"] != float64(101) || e["error_code"] != CodeUpstreamTimeout {
		t.Errorf("logged status %v error_code %q, want 101 %q", e["status"], e["error_code"], CodeUpstreamTimeout)
	}
	testenv.WaitFor(t, 5*time.Second, "the tunnel, its connection and its slot to be given back", func() bool {
		_, n := h.proxy.streams.open()
		return n == 0 && poolConns(h) == 0 && h.proxy.sandboxes.peek("wsdeaf").inFlight() == 0
	})
}

// dialSmallWindow connects to addr with the smallest receive buffer and
// segments the kernel allows, so that a client that reads nothing stops
// the proxy's writes after a few KiB.
func dialSmallWindow(t *testing.T, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		return rc.Control(func(fd uintptr) {
			_ = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 2048)
			_ = syscall.SetsockoptInt(int(fd), syscall.IPPROTO_TCP, syscall.TCP_MAXSEG, 536)
		})
	}}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// When the sandbox ends a tunnel, everything it sent before its close
// reaches the client, even when the client sends something (a ping, a
// keystroke) while the last bytes are still on their way: closing the
// client's socket at once would reset it on that byte, and the kernel
// would drop what the client had not yet received (the sandbox's close
// frame among it). The exchange (its log line, its connection slot) ends
// with the sandbox's close; the client's socket stays until it closes it.
func TestTunnelSandboxEndReachesClientThatSends(t *testing.T) {
	h := newHarness(t)
	ln := listen(t, "127.0.0.1:0")
	// More than the client's small receive window takes: the rest waits in
	// the proxy's send buffer when the sandbox has already closed.
	tail := strings.Repeat("t", 12<<10)
	backendDone := make(chan struct{})
	go func() {
		c, br, ok := acceptUpgrade(ln)
		if !ok {
			return
		}
		defer c.Close()
		io.WriteString(c, tail)
		_ = c.(*net.TCPConn).CloseWrite() // a clean end of the sandbox's side
		io.Copy(io.Discard, br)           // until the proxy is done with it
		close(backendDone)
	}()
	host := h.route("wstail", uint16(ln.Addr().(*net.TCPAddr).Port))
	c := dialSmallWindow(t, h.addr)
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintf(c, "GET /ws HTTP/1.1\r\nHost: %s\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"+
		"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n", host)
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != 101 {
		t.Fatalf("upgrade: %v %v", resp, err)
	}
	io.WriteString(c, "g")
	select {
	case <-backendDone:
	case <-time.After(10 * time.Second):
		t.Fatal("the proxy never let go of the sandbox connection")
	}
	if _, err := io.WriteString(c, "ping"); err != nil {
		t.Fatalf("client write after the sandbox's end: %v", err)
	}
	got, err := io.ReadAll(br)
	if err != nil || len(got) != len(tail) {
		t.Fatalf("client got %d of the sandbox's last %d bytes, then %v; want all, then EOF", len(got), len(tail), err)
	}
	testenv.WaitFor(t, 5*time.Second, "the tunnel to end with its sandbox", func() bool {
		_, n := h.proxy.streams.open()
		return n == 0 && poolConns(h) == 0
	})
}

// An upgrade whose request line has an absolute-form target reaches the
// sandbox as a plain request would: the path and query as the client wrote
// them, and the Host the proxy sends (the client's, or the route's mask),
// not the target's spelling of the host, which a sandbox's server would
// take over its Host header (userinfo there is refused before the proxy:
// TestMalformedRequestsAnswered). (A target naming
// another sandbox is refused: TestAbsoluteFormTargetNamesHostsSandbox.)
func TestUpgradeAbsoluteFormSentAsOriginForm(t *testing.T) {
	h := newHarness(t)
	type seen struct{ uri, host, auth string }
	got := make(chan seen, 1)
	b := newScriptBackend(t, func(c net.Conn, req *http.Request, _ int) bool {
		got <- seen{req.RequestURI, req.Host, req.Header.Get("Authorization")}
		rawWrite(c, ws101)
		return false
	})
	host := h.route("wsabs", b.port)
	upper := strings.ToUpper(host)
	for _, tc := range []struct{ target, want string }{
		{"http://" + upper + "/ws?a=1", "/ws?a=1"},
		{"HTTP://" + upper + ".:8080/a/../ws%2F?x=%20", "/a/../ws%2F?x=%20"},
		{"http://" + upper, "/"},
		{"/plain?q", "/plain?q"},
	} {
		c, err := net.Dial("tcp", h.addr)
		if err != nil {
			t.Fatal(err)
		}
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: %s\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"+
			"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n", tc.target, host)
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		c.Close()
		if err != nil || resp.StatusCode != 101 {
			t.Fatalf("%s: %v %v", tc.target, resp, err)
		}
		if s := <-got; s.uri != tc.want || s.host != host || s.auth != "" {
			t.Errorf("%s: sandbox saw target %q, Host %q, Authorization %q; want %q, %q, none", tc.target, s.uri, s.host, s.auth, tc.want, host)
		}
	}
}

// ws101 is a sandbox's answer to a WebSocket upgrade.
const ws101 = "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n"

// acceptUpgrade plays a sandbox: it accepts one connection on ln, reads the
// upgrade request, answers 101 and waits for the client's first tunnel
// byte, so that what it sends next is tunnel traffic, not bytes that came
// with the 101. ok is false if any step failed (the connection is closed).
func acceptUpgrade(ln net.Listener) (c net.Conn, br *bufio.Reader, ok bool) {
	c, err := ln.Accept()
	if err != nil {
		return nil, nil, false
	}
	br = bufio.NewReader(c)
	if _, err := http.ReadRequest(br); err != nil {
		c.Close()
		return nil, nil, false
	}
	io.WriteString(c, ws101)
	if _, err := br.ReadByte(); err != nil {
		c.Close()
		return nil, nil, false
	}
	return c, br, true
}

// When the client ends a tunnel, the sandbox gets every byte the client
// sent before its end (its last frames, its close frame), then a FIN, even
// while the sandbox is still sending: closing the sandbox's socket with its
// output unread would reset it, and the kernel would drop the client's
// bytes still queued for a sandbox that reads slower than it writes. A
// client that only half-closed still gets the sandbox's answer after it.
func TestTunnelClientEndReachesSandboxThatSends(t *testing.T) {
	for _, tc := range []struct {
		name      string
		halfClose bool // the client half-closes and reads on, else it closes
		sendFirst bool // the sandbox sends its output before reading, else after the client's end
	}{
		{"client closes while the sandbox sends", false, true},
		{"client half-closes, sandbox answers after its end", true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			ln := listenSmallWindow(t)
			last := strings.Repeat("c", 64<<10) + "bye" // more than the sandbox's receive window
			output := []byte(strings.Repeat("s", 64<<10))
			const outputs = 16
			type result struct {
				got int
				err error
			}
			sandbox := make(chan result, 1)
			go func() {
				c, br, ok := acceptUpgrade(ln)
				if !ok {
					sandbox <- result{err: errors.New("upgrade failed")}
					return
				}
				defer c.Close()
				send := func() {
					for range outputs {
						if _, err := c.Write(output); err != nil {
							return
						}
					}
				}
				if tc.sendFirst {
					send() // reading nothing meanwhile
				}
				b, err := io.ReadAll(br)
				if err == nil && !strings.HasSuffix(string(b), "bye") {
					err = fmt.Errorf("the last bytes are %q", b[max(0, len(b)-8):])
				}
				sandbox <- result{len(b), err}
				if !tc.sendFirst {
					send()
				}
			}()
			host := h.route("wsend", uint16(ln.Addr().(*net.TCPAddr).Port))
			c := dialRaw(t, h.addr)
			fmt.Fprintf(c, "GET /ws HTTP/1.1\r\nHost: %s\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"+
				"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n", host)
			br := bufio.NewReader(c)
			if resp, err := http.ReadResponse(br, nil); err != nil || resp.StatusCode != 101 {
				t.Fatalf("upgrade: %v %v", resp, err)
			}
			if _, err := io.WriteString(c, "g"+last); err != nil {
				t.Fatal(err)
			}
			if tc.halfClose {
				_ = c.(*net.TCPConn).CloseWrite()
				got, err := io.ReadAll(br)
				if len(got) != outputs*len(output) || err != nil {
					t.Errorf("client got %d of the sandbox's %d bytes after its half-close, then %v; want all, then EOF", len(got), outputs*len(output), err)
				}
			} else {
				c.Close()
			}
			select {
			case r := <-sandbox:
				if r.got != len(last) || r.err != nil {
					t.Fatalf("sandbox got %d of the client's last %d bytes, then %v; want all, then EOF", r.got, len(last), r.err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("the sandbox never got the client's end")
			}
			testenv.WaitFor(t, 5*time.Second, "the tunnel to end", func() bool {
				_, n := h.proxy.streams.open()
				return n == 0 && poolConns(h) == 0
			})
		})
	}
}

// A sandbox that takes the client's end (its last bytes, the FIN) and then
// neither answers nor closes its side (a server that returns without
// closing its socket) does not hold the tunnel, its connection slot and
// the sandbox's request count for long: silent for lingerTimeout, its
// socket is closed, as nginx's lingering close gives up on a silent peer.
func TestTunnelSandboxSilentAfterClientEnd(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ln := listen(t, "127.0.0.1:0")
	gotEnd := make(chan error, 1)
	go func() {
		c, br, ok := acceptUpgrade(ln)
		if !ok {
			gotEnd <- errors.New("upgrade failed")
			return
		}
		defer c.Close()
		_, err := io.ReadAll(br) // the client's bytes, then its end
		gotEnd <- err
		<-t.Context().Done() // then silent, its socket open
	}()
	host := h.route("wssilentend", uint16(ln.Addr().(*net.TCPAddr).Port))
	c := dialRaw(t, h.addr)
	fmt.Fprintf(c, "GET /ws HTTP/1.1\r\nHost: %s\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"+
		"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n", host)
	if resp, err := http.ReadResponse(bufio.NewReader(c), nil); err != nil || resp.StatusCode != 101 {
		t.Fatalf("upgrade: %v %v", resp, err)
	}
	io.WriteString(c, "g bye")
	c.Close()
	if err := testenv.Recv(t, gotEnd, 10*time.Second, "the client's end at the sandbox"); err != nil {
		t.Fatalf("sandbox: %v", err)
	}
	start := time.Now()
	testenv.WaitFor(t, lingerTimeout+5*time.Second, "the tunnel to a silent sandbox to end", func() bool {
		_, n := h.proxy.streams.open()
		return n == 0 && poolConns(h) == 0 && h.proxy.sandboxes.peek("wssilentend").inFlight() == 0
	})
	if d := time.Since(start); d < lingerTimeout-time.Second {
		t.Errorf("the tunnel ended %v after the client's end: the sandbox was to get lingerTimeout (%v)", d, lingerTimeout)
	}
}

// listenSmallWindow listens on loopback with the smallest receive buffer
// the kernel allows, so that a sandbox that reads nothing leaves what the
// proxy sends it in the proxy's send buffer after a few KiB.
func listenSmallWindow(t *testing.T) net.Listener {
	t.Helper()
	return listenWithBuffer(t, syscall.SO_RCVBUF, 2048)
}

// listenWithBuffer listens on loopback with the socket buffer opt
// (SO_RCVBUF, SO_SNDBUF) set to size, which accepted connections inherit.
func listenWithBuffer(t *testing.T, opt, size int) net.Listener {
	t.Helper()
	return listenWithSockopts(t, sockopt{syscall.SOL_SOCKET, opt, size})
}

// sockopt is one integer socket option: level, name and value.
type sockopt struct{ level, opt, value int }

// listenWithSockopts listens on loopback with opts set on the listening
// socket, which accepted connections inherit.
func listenWithSockopts(t *testing.T, opts ...sockopt) net.Listener {
	t.Helper()
	lc := net.ListenConfig{Control: func(_, _ string, rc syscall.RawConn) error {
		return rc.Control(func(fd uintptr) {
			for _, o := range opts {
				_ = syscall.SetsockoptInt(int(fd), o.level, o.opt, o.value)
			}
		})
	}}
	ln, err := lc.Listen(t.Context(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}

// A sandbox's 101 must name the protocol it switches to, one the client
// offered (RFC 9110 §7.8, §15.2.2): anything else is the sandbox's error,
// a 502, not a tunnel in a protocol the client cannot speak, which would
// hold the sandbox connection until the idle timeout and be logged as a
// successful upgrade.
func TestTunnelSwitchMustBeAsAsked(t *testing.T) {
	h := newHarness(t)
	answers, host := answerOnce(t, h, "wsswitch")
	for _, tc := range []struct {
		name, offer, answer string
		status              int
	}{
		{"no Upgrade", "websocket", "", 502},
		{"empty Upgrade", "websocket", "Upgrade: \r\n", 502},
		{"another protocol", "websocket", "Upgrade: h2c\r\n", 502},
		{"one offered, one not", "websocket", "Upgrade: websocket, h2c\r\n", 502},
		// h2c is refused on its own (switchable): every protocol named
		// must have been offered.
		{"one offered, another not", "websocket", "Upgrade: websocket, foo/1\r\n", 502},
		{"one not offered, then one", "websocket", "Upgrade: foo/1, websocket\r\n", 502},
		{"the offered one", "websocket", "Upgrade: websocket\r\n", 101},
		{"in another case", "websocket", "Upgrade: WebSocket\r\n", 101},
		{"one of several offered", "foo/2, websocket", "Upgrade: websocket\r\n", 101},
		// Each protocol a 101 names is looked up among the offers: a
		// sandbox naming thousands, to a client offering thousands, cost
		// the proxy 350 ms of CPU per handshake. A stack of protocols
		// is a few; more than maxSwitchProtocols is refused.
		{"as many as a 101 may name", protocols(8), "Upgrade: " + protocols(8) + "\r\n", 101},
		{"more than a 101 may name", protocols(9), "Upgrade: " + protocols(9) + "\r\n", 502},
		{"the same one too many times", "websocket", "Upgrade: " + strings.Repeat("websocket, ", 8) + "websocket\r\n", 502},
		{"the last of many offered", strings.Repeat("x, ", 4000) + "websocket", "Upgrade: websocket\r\n", 101},
	} {
		answers <- "HTTP/1.1 101 Switching Protocols\r\n" + tc.answer + "Connection: Upgrade\r\n\r\n"
		c, err := net.Dial("tcp", h.addr)
		if err != nil {
			t.Fatal(err)
		}
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		fmt.Fprintf(c, "GET /ws HTTP/1.1\r\nHost: %s\r\nConnection: Upgrade\r\nUpgrade: %s\r\n"+
			"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n", host, tc.offer)
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if tc.status == 101 {
			if resp.StatusCode != 101 {
				t.Errorf("%s: %d, want the sandbox's 101", tc.name, resp.StatusCode)
			}
		} else {
			body, _ := io.ReadAll(resp.Body)
			checkProxyError(t, resp, string(body), tc.status, CodeUpstreamBadHeader)
		}
		c.Close()
		testenv.WaitFor(t, 5*time.Second, tc.name+": the sandbox connection and its slots to be released", func() bool {
			_, n := h.proxy.streams.open()
			return n == 0 && poolConns(h) == 0 && h.proxy.sandboxes.peek("wsswitch").inFlight() == 0
		})
	}
}

// protocols lists n protocol names: "p0, p1, ...".
func protocols(n int) string {
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("p%d", i)
	}
	return strings.Join(names, ", ")
}

// Only an HTTP/1.1 upgrade to a protocol other than h2c is tunnelled. An
// HTTP/1.0 one must be ignored (RFC 9110 §7.8; its 101 went out with
// "Connection: keep-alive" and failed the handshake), and h2c's lost its
// HTTP2-Settings as a hop-by-hop header: a sandbox that switched anyway
// got a tunnel of HTTP/2 requests the proxy never saw. Both go on as
// plain requests, Upgrade removed; a 101 to h2c offered beside websocket
// is refused. The sandbox here switches to whatever it is offered last.
func TestUpgradeOnlyHTTP11AndNeverH2C(t *testing.T) {
	h := newHarness(t)
	seen := make(chan string, 1)
	b := newScriptBackend(t, func(c net.Conn, req *http.Request, _ int) bool {
		seen <- req.Header.Get("Upgrade") + "|" + req.Header.Get("HTTP2-Settings")
		offers := strings.Split(req.Header.Get("Upgrade"), ",")
		if last := strings.TrimSpace(offers[len(offers)-1]); last != "" {
			rawWrite(c, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: "+last+"\r\nConnection: Upgrade\r\n\r\n")
			var one [1]byte
			c.Read(one[:]) // until the proxy closes its side
			return false
		}
		return rawWrite(c, okResponse("plain"))
	})
	host := h.route("wsh2c", b.port)
	for _, tc := range []struct {
		name, head string
		status     int
		sandbox    string // the Upgrade and HTTP2-Settings it got
	}{
		{"h2c", "GET /h2c HTTP/1.1\r\nHost: %s\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\n" +
			"HTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n\r\n", 200, "|"},
		{"h2c in another case", "GET /h2c HTTP/1.1\r\nHost: %s\r\nConnection: upgrade\r\nUpgrade: H2C\r\n\r\n", 200, "|"},
		{"HTTP/1.0", "GET /ws HTTP/1.0\r\nHost: %s\r\nConnection: keep-alive, Upgrade\r\nUpgrade: websocket\r\n\r\n", 200, "|"},
		{"h2c chosen over websocket", "GET /ws HTTP/1.1\r\nHost: %s\r\nConnection: Upgrade\r\nUpgrade: websocket, h2c\r\n\r\n", 502, "websocket, h2c|"},
	} {
		c := dialRaw(t, h.addr)
		fmt.Fprintf(c, tc.head, host)
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		body, _ := io.ReadAll(resp.Body)
		if got := <-seen; resp.StatusCode != tc.status || got != tc.sandbox {
			t.Errorf("%s: %d %q, the sandbox got Upgrade|HTTP2-Settings %q; want %d, %q", tc.name, resp.StatusCode, body, got, tc.status, tc.sandbox)
		}
		if tc.status == 502 {
			checkProxyError(t, resp, string(body), 502, CodeUpstreamBadHeader)
		}
		c.Close()
		// A plain request's connection stays in the pool, idle.
		testenv.WaitFor(t, 5*time.Second, tc.name+": no tunnel left, the request done", func() bool {
			_, n := h.proxy.streams.open()
			return n == 0 && h.proxy.sandboxes.peek("wsh2c").inFlight() == 0
		})
	}
}

// Connection may come on several lines (RFC 9110 §5.3: the same as one
// line, joined), as a client or an intermediary that adds its own line
// sends it: the upgrade is found on any of them, and every header any of
// them names stays behind, as the other lines do; the sandbox gets one
// Connection: Upgrade.
func TestUpgradeConnectionOnSeveralLines(t *testing.T) {
	h := newHarness(t)
	// It declines every upgrade: its answer shows what was sent. (Not a
	// net/http server: it hides Connection and Upgrade from its handlers.)
	b := newScriptBackend(t, func(c net.Conn, req *http.Request, _ int) bool {
		body, _ := json.Marshal(echoed{Headers: req.Header})
		return rawWrite(c, okResponse(string(body)))
	})
	host := h.route("wslines", b.port)
	for _, tc := range []struct {
		name               string
		lines              []string
		connection, upType string // as the sandbox saw them
	}{
		{"one line", []string{"Connection: keep-alive, Upgrade"}, "Upgrade", "websocket"},
		{"Upgrade on the second line", []string{"Connection: keep-alive", "Connection: Upgrade"}, "Upgrade", "websocket"},
		{"Upgrade on the first line", []string{"Connection: Upgrade", "Connection: keep-alive"}, "Upgrade", "websocket"},
		{"a hop named on the second line", []string{"Connection: keep-alive", "Connection: upgrade, X-Hop", "X-Hop: 1"}, "Upgrade", "websocket"},
		{"no upgrade, a hop named on the second line", []string{"Connection: keep-alive", "Connection: X-Hop", "X-Hop: 1"}, "", ""},
		// close beside the upgrade token: the client wants no keep-alive
		// if the upgrade is declined. nginx, Go's ReverseProxy and Node
		// still upgrade; the sandbox gets the upgrade, without close.
		{"close beside Upgrade", []string{"Connection: close, Upgrade"}, "Upgrade", "websocket"},
		{"close on its own line", []string{"Connection: close", "Connection: Upgrade"}, "Upgrade", "websocket"},
		{"Upgrade before close", []string{"Connection: Upgrade", "Connection: close"}, "Upgrade", "websocket"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lines := []string{"GET /ws HTTP/1.1", "Host: " + host, "Sec-WebSocket-Version: 13", "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ=="}
			if tc.upType != "" {
				lines = append(lines, "Upgrade: websocket")
			}
			c := dialRaw(t, h.addr)
			// Not authRawRequest: its Connection: close would end each
			// connection (see the close cases).
			io.WriteString(c, strings.Join(append(lines, tc.lines...), "\r\n")+"\r\n\r\n")
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Fatal(err)
			}
			var e echoed
			if err := json.NewDecoder(resp.Body).Decode(&e); err != nil {
				t.Fatal(err)
			}
			if got := e.get("Connection"); got != tc.connection {
				t.Errorf("Connection reached the sandbox as %q, want %q", got, tc.connection)
			}
			if got := e.get("Upgrade"); got != tc.upType {
				t.Errorf("Upgrade reached the sandbox as %q, want %q (an upgrade goes through the tunnel)", got, tc.upType)
			}
			if got := e.get("X-Hop"); got != "" {
				t.Errorf("X-Hop, named in Connection, reached the sandbox as %q", got)
			}
			// The declined upgrade's answer keeps the client's connection
			// unless the client asked for close.
			if wantClose := strings.Contains(strings.Join(tc.lines, ","), "close"); resp.Close != wantClose {
				t.Errorf("answer's Connection: close is %v, want %v", resp.Close, wantClose)
			}
		})
	}
}

// A client that lists close beside Upgrade (no keep-alive should the
// upgrade be declined) gets its WebSocket, as through nginx: the sandbox's
// WebSocket server sees a valid handshake, and the 101 says Upgrade alone
// (a Connection that lists close fails Go's clients' handshake).
func TestUpgradeWithConnectionCloseOpens(t *testing.T) {
	h := newHarness(t)
	ended := make(chan error, 4)
	host := h.route("wsclose", wsBackend(t, ended))
	for _, conn := range [][]string{{"close, Upgrade"}, {"close", "Upgrade"}} {
		t.Run(strings.Join(conn, "|"), func(t *testing.T) {
			c := dialRaw(t, h.addr)
			head := "GET /ws HTTP/1.1\r\nHost: " + host + "\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\n" +
				"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Protocol: echo.v1\r\n"
			for _, v := range conn {
				head += "Connection: " + v + "\r\n"
			}
			io.WriteString(c, head+"\r\n")
			br := bufio.NewReader(c)
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != 101 || strings.Join(resp.Header.Values("Connection"), ",") != "Upgrade" {
				t.Fatalf("answer %d, Connection %q: want 101 with Connection: Upgrade", resp.StatusCode, resp.Header.Values("Connection"))
			}
			// A masked text frame "hi" (mask 0), echoed unmasked.
			c.Write([]byte{0x81, 0x82, 0, 0, 0, 0, 'h', 'i'})
			got := make([]byte, 4)
			if _, err := io.ReadFull(br, got); err != nil || string(got) != "\x81\x02hi" {
				t.Fatalf("echo %q (%v), want the frame back", got, err)
			}
		})
	}
}

// An idle WebSocket holds no copy buffer of 32 KiB or more: most tunnels
// (a terminal, a notebook kernel) sit idle for hours between small
// messages, and two io.Copy buffers per tunnel were most of its memory.
// So too after a message of a few KiB each way: its copies borrowed the
// 64 KiB bulk buffer, and kept it while they waited for the next byte
// (≈ 140 KiB of heap per quiet tunnel). Measured in the heap of this
// process, where the clients and the sandbox hold only the message per
// connection.
func TestIdleWebSocketHoldsNoCopyBuffer(t *testing.T) {
	for _, tc := range []struct {
		name string
		size int // bytes each way before the tunnel goes quiet
	}{
		{"one byte", 1},
		{"a 10 KB message", 10_000},
	} {
		t.Run(tc.name, func(t *testing.T) { idleTunnelHeap(t, tc.size) })
	}
}

// idleTunnelHeap opens tunnels that carry size bytes each way and then
// sit idle, and checks the heap each one holds.
func idleTunnelHeap(t *testing.T, size int) {
	h := newHarness(t)
	// The sandbox answers each upgrade with a 101, echoes size bytes, and
	// then holds the connection.
	ln := testenv.ServeTCP(t, func(c net.Conn) {
		br := bufio.NewReaderSize(c, 16)
		if _, err := http.ReadRequest(br); err != nil {
			return
		}
		io.WriteString(c, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
		b := make([]byte, size)
		if _, err := io.ReadFull(br, b); err == nil {
			c.Write(b)
		}
	})
	host := h.route("wsidle", uint16(ln.Addr().(*net.TCPAddr).Port))
	msg := bytes.Repeat([]byte{'x'}, size)
	open := func() net.Conn {
		c, err := net.Dial("tcp", h.addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		fmt.Fprintf(c, "GET /ws HTTP/1.1\r\nHost: %s\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n", host)
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		head := make([]byte, 0, 512)
		var b [1]byte
		for !strings.HasSuffix(string(head), "\r\n\r\n") {
			if _, err := c.Read(b[:]); err != nil {
				t.Fatalf("reading the 101: %v (so far %q)", err, head)
			}
			head = append(head, b[0])
		}
		if !strings.HasPrefix(string(head), "HTTP/1.1 101") {
			t.Fatalf("answer %q, want a 101", head)
		}
		// The message each way: both copies have read.
		if _, err := c.Write(msg); err != nil {
			t.Fatal(err)
		}
		got := make([]byte, size)
		if _, err := io.ReadFull(c, got); err != nil || !bytes.Equal(got, msg) {
			t.Fatalf("echo of %d bytes: %v", size, err)
		}
		return c
	}
	open() // warm pools and the route cache
	const n = 100
	// Twice: a pooled buffer given back survives one collection.
	heap := func() int64 {
		runtime.GC()
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return int64(m.HeapAlloc)
	}
	before := heap()
	for range n {
		open()
	}
	if _, open := h.proxy.streams.open(); open < n+1 {
		t.Fatalf("%d tunnels open, want %d", open, n+1)
	}
	// Two io.Copy buffers alone were 64 KiB; fasthttp's 16 KiB reader
	// under the hijacked connection and the request's context were held
	// too, until the tunnel read the connection itself on a goroutine of
	// its own (≈ 27 KiB). What stays is the two 2 KiB buffers and the
	// tunnel's bookkeeping (≈ 7.5 KiB), the bulk buffers once a copy has
	// waited bulkHold for its next byte.
	var per int64
	testenv.Eventually(t, bulkHold+5*time.Second, func() error {
		if per = (heap() - before) / n; per >= 16<<10 {
			return fmt.Errorf("an idle WebSocket holds %d bytes of heap after %d bytes each way, want under 16 KiB", per, size)
		}
		return nil
	})
	t.Logf("heap per idle WebSocket after %d bytes each way: %d bytes", size, per)
}

// Bytes a client sends right behind its upgrade request, before the 101
// (a client that does not wait for the handshake, or a first frame in the
// same segment), sit in fasthttp's reader when the tunnel starts: they
// reach the sandbox first, in order, over plain TCP and TLS alike.
func TestWebSocketClientBytesBeforeThe101(t *testing.T) {
	h := newHarness(t)
	ln := testenv.ServeTCP(t, func(c net.Conn) {
		defer c.Close()
		br := bufio.NewReader(c)
		if _, err := http.ReadRequest(br); err != nil {
			return
		}
		io.WriteString(c, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
		// Echo until the client's end, prefixed: what the sandbox
		// read, in the order it read it.
		b, _ := io.ReadAll(br)
		io.WriteString(c, "got:"+string(b))
	})
	host := h.route("wsearly", uint16(ln.Addr().(*net.TCPAddr).Port))
	tlsAddr, roots := serveTLS(t, h)
	for _, tc := range []struct {
		name string
		dial func() net.Conn
	}{
		{"plain", func() net.Conn { return dialRaw(t, h.addr) }},
		{"TLS", func() net.Conn {
			c, err := tls.Dial("tcp", tlsAddr, &tls.Config{RootCAs: roots, ServerName: host})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { c.Close() })
			_ = c.SetDeadline(time.Now().Add(10 * time.Second))
			return c
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := tc.dial()
			// One write: the early bytes arrive with the head.
			fmt.Fprintf(c, "GET /ws HTTP/1.1\r\nHost: %s\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\nearly-", host)
			br := bufio.NewReader(c)
			resp, err := http.ReadResponse(br, nil)
			if err != nil || resp.StatusCode != 101 {
				t.Fatalf("upgrade: %v %v", resp, err)
			}
			io.WriteString(c, "late")
			// End the client's side so the sandbox's ReadAll returns.
			switch cw := c.(type) {
			case *net.TCPConn:
				cw.CloseWrite()
			case *tls.Conn:
				cw.CloseWrite()
			}
			got, err := io.ReadAll(br)
			if string(got) != "got:early-late" {
				t.Fatalf("the sandbox got %q (%v), want %q", got, err, "got:early-late")
			}
		})
	}
}

// A WebSocket whose 101 comes while the proxy drains (a kernel channel
// that answers once its kernel is up; a deploy's SIGTERM meanwhile) opens
// and works until the drain deadline. fasthttp marks every answer given
// during its shutdown "Connection: close", and a 101 carrying that beside
// its "Connection: Upgrade" failed the handshake of Go's clients: net/http
// drops a Connection header that lists close, Upgrade token and all.
func TestWebSocketSwitchedDuringDrainOpens(t *testing.T) {
	h := newHarness(t, func(o *harnessOpts) { o.srv.DrainTimeout = 10 * time.Second })
	arrived, release := make(chan struct{}, 1), make(chan struct{})
	port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		arrived <- struct{}{}
		select {
		case <-release:
		case <-time.After(10 * time.Second):
			return
		}
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer c.CloseNow()
		if typ, msg, err := c.Read(r.Context()); err == nil {
			c.Write(r.Context(), typ, msg)
		}
	}))
	host := h.route("wsdrain", port)
	type dialed struct {
		c   *websocket.Conn
		err error
	}
	res := make(chan dialed, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	go func() {
		c, _, err := websocket.Dial(ctx, "ws://"+h.addr+"/ws", &websocket.DialOptions{Host: host})
		res <- dialed{c, err}
	}()
	testenv.Recv(t, arrived, 10*time.Second, "the upgrade at the sandbox")
	shut := make(chan error, 1)
	go func() { shut <- h.server.Shutdown(context.Background()) }()
	h.waitListenerClosed(5 * time.Second)
	close(release)
	d := <-res
	if d.err != nil {
		t.Fatalf("upgrade answered during the drain: %v", d.err)
	}
	defer d.c.CloseNow()
	if err := d.c.Write(ctx, websocket.MessageText, []byte("still here")); err != nil {
		t.Fatal(err)
	}
	if _, msg, err := d.c.Read(ctx); err != nil || string(msg) != "still here" {
		t.Fatalf("echo during the drain: %q %v", msg, err)
	}
	d.c.Close(websocket.StatusNormalClosure, "")
	drainEnds(t, shut, 20*time.Second, "the drain outlived its deadline (10 s) after the tunnel closed")
}

// A WebSocket whose sandbox reset its connection (a crashed terminal
// server, a VM gone) was logged as a clean 101, like one the sandbox
// closed: an HTTP stream cut that way is marked upstream_reset, so that it
// cannot pass for a complete one, and now a tunnel is too.
func TestTunnelResetBySandboxIsMarked(t *testing.T) {
	h, logs := logHarness(t, accesslog.FormatJSON)
	const switched = "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n" +
		"Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n\r\nxx"
	for _, tc := range []struct {
		name  string
		reset bool
		want  string
	}{
		{"reset", true, CodeUpstreamReset},
		{"closed", false, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := make(chan struct{})
			b := newScriptBackend(t, func(c net.Conn, r *http.Request, _ int) bool {
				rawWrite(c, switched)
				<-got // the client has the sandbox's bytes: the tunnel is up
				if tc.reset {
					_ = c.(*net.TCPConn).SetLinger(0)
				}
				return false
			})
			id := "tunnel-" + tc.name
			c, err := net.Dial("tcp", h.addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(10 * time.Second))
			_, _ = io.WriteString(c, "GET / HTTP/1.1\r\nHost: "+h.route("tunnel"+tc.name, b.port)+"\r\nConnection: Upgrade\r\n"+
				"Upgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"+
				"X-Cube-Request-Id: "+id+"\r\n\r\n")
			br := bufio.NewReader(c)
			resp, err := http.ReadResponse(br, nil)
			if err != nil || resp.StatusCode != 101 {
				t.Fatalf("upgrade: %v %v", resp, err)
			}
			var first [2]byte
			_, err = io.ReadFull(br, first[:])
			close(got)
			if err != nil || string(first[:]) != "xx" {
				t.Fatalf("client got %q, %v after the 101, want %q", first, err, "xx")
			}
			if _, err := io.ReadAll(br); isTimeout(err) { // until the proxy closes the client's side
				t.Fatal("the proxy kept the client's side of the tunnel open after the sandbox's end")
			}
			e := logs.waitJSON(t, id)
			if e["status"] != float64(101) || e["error_code"] != tc.want {
				t.Errorf("logged status %v error_code %q, want 101 %q", e["status"], e["error_code"], tc.want)
			}
		})
	}
}

// answerOnce routes sandbox id to a backend that answers each request
// with the raw text sent on answers, then holds the connection until the
// proxy closes it; it returns the channel and the sandbox's host.
func answerOnce(t *testing.T, h *harness, id string) (chan<- string, string) {
	answers := make(chan string, 1)
	b := newScriptBackend(t, func(c net.Conn, req *http.Request, _ int) bool {
		rawWrite(c, <-answers)
		var one [1]byte
		c.Read(one[:]) // until the proxy closes its side
		return false
	})
	return answers, h.route(id, b.port)
}

// The traffic token is checked when a request arrives, as nginx checks
// it: a rotated token refuses the next request at once, on a kept-alive
// connection too, but a WebSocket opened before the rotation goes on
// relaying until it ends, as through nginx (README, Proxy auth). A kill
// (/admin/meta/delete) is what ends it.
func TestTokenRotationLeavesOpenTunnel(t *testing.T) {
	h := newHarness(t)
	ended := make(chan error, 1)
	wsPort := wsBackend(t, ended)
	plainPort := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "ok")
	}))
	old, rotated := strings.Repeat("0a", 32), strings.Repeat("0b", 32)
	put := func(token string) {
		h.put("rotws", map[string]string{"HostIP": "127.0.0.1", "SandboxIP": "127.0.0.1", "CreatedAt": "1",
			"AllowPublicTraffic": "false", "TrafficAccessToken": token, "80": itoa(wsPort), "81": itoa(plainPort)})
	}
	put(old)

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	tunnel, _, err := websocket.Dial(ctx, "ws://"+h.addr+"/ws", &websocket.DialOptions{
		Host: "80-rotws.cube.test", Subprotocols: []string{"echo.v1"},
		HTTPHeader: http.Header{"E2b-Traffic-Access-Token": {old}},
	})
	if err != nil {
		t.Fatalf("dial with the token: %v", err)
	}
	defer tunnel.CloseNow()
	if err := wsEcho(t, tunnel); err != nil {
		t.Fatalf("echo before the rotation: %v", err)
	}
	c := dialRaw(t, h.addr)
	br := bufio.NewReader(c)
	get := "GET / HTTP/1.1\r\nHost: 81-rotws.cube.test\r\nE2b-Traffic-Access-Token: " + old + "\r\n\r\n"
	keptRequest(t, c, br, get)

	put(rotated)
	if _, err := io.WriteString(c, get); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 403 || !strings.Contains(string(body), "traffic_token_invalid") {
		t.Fatalf("the old token on the kept-alive connection after the rotation: %d %s, want 403 traffic_token_invalid", resp.StatusCode, body)
	}
	if err := wsEcho(t, tunnel); err != nil {
		t.Fatalf("the WebSocket opened before the rotation was cut: %v", err)
	}

	if code, out := h.adminDo("POST", "/admin/meta/delete", `{"sandbox_id":"rotws"}`, ""); code != 200 {
		t.Fatalf("meta/delete: %d %s", code, out)
	}
	if err := wsEcho(t, tunnel); err == nil {
		t.Fatal("the WebSocket relayed after a kill")
	}
}
