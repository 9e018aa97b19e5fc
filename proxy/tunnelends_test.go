package proxy

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/accesslog"
	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// A WebSocket counts against max_streams_per_sandbox for as long as its
// tunnel is open (another request to the sandbox meanwhile is a 429), and
// gives its slot back however it ends: a close, a reset mid-frame or a
// half-close on either side, the idle timeout. A sandbox that ended its
// side or a client that vanished must never leave the sandbox refusing
// its next connection.
func TestTunnelHoldsItsSandboxSlotUntilItEnds(t *testing.T) {
	t.Parallel()
	// The tunnel is silent from its 101 through the second upgrade's 429
	// and the first steps of its end: with 500 ms, a stall of some 440 ms
	// there (slack(idle) early) on loaded cores let the idle timeout end
	// the tunnel first, and a half-closed side never got the other's last
	// bytes. Only the last case waits it out.
	const idle = 2 * time.Second
	h := newHarness(t, func(o *harnessOpts) {
		o.cfg.MaxStreamsPerSandbox = 1
		o.cfg.IdleStreamTimeout = idle
	})
	ln := listen(t, "127.0.0.1:0")
	accepted := serveWS101(t, ln)
	host := h.route("wscap", uint16(ln.Addr().(*net.TCPAddr).Port))
	upgrade := func(t *testing.T) (*net.TCPConn, *bufio.Reader, *http.Response) {
		t.Helper()
		c := dialRaw(t, h.addr)
		fmt.Fprintf(c, "GET /ws HTTP/1.1\r\nHost: %s\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"+
			"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n", host)
		br := bufio.NewReader(c)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		return c.(*net.TCPConn), br, resp
	}
	// halfFrame is the first bytes of a masked 125-byte text frame: the
	// reset lands mid-frame.
	halfFrame := "\x81\xfd\x01\x02\x03\x04abc"
	for _, tc := range []struct {
		name string
		end  func(t *testing.T, c *net.TCPConn, br *bufio.Reader, sc *net.TCPConn)
	}{
		{"client closes", func(t *testing.T, c *net.TCPConn, _ *bufio.Reader, sc *net.TCPConn) {
			c.Close()
			readEOF(t, sc)
		}},
		{"client resets mid-frame", func(t *testing.T, c *net.TCPConn, _ *bufio.Reader, sc *net.TCPConn) {
			io.WriteString(c, halfFrame)
			reset(c)
			readEOF(t, sc)
		}},
		{"client half-closes, then the sandbox closes", func(t *testing.T, c *net.TCPConn, br *bufio.Reader, sc *net.TCPConn) {
			c.CloseWrite()
			readEOF(t, sc)
			io.WriteString(sc, "last")
			sc.Close()
			if b, err := io.ReadAll(br); string(b) != "last" || err != nil {
				t.Errorf("half-closed client got %q, %v; want the sandbox's last bytes, then EOF", b, err)
			}
		}},
		{"sandbox closes", func(t *testing.T, c *net.TCPConn, br *bufio.Reader, sc *net.TCPConn) {
			sc.Close()
			readEOF(t, c)
		}},
		{"sandbox resets mid-frame", func(t *testing.T, c *net.TCPConn, br *bufio.Reader, sc *net.TCPConn) {
			io.WriteString(sc, "\x81\x7dabc")
			reset(sc)
			readEOF(t, c)
		}},
		{"sandbox half-closes while the client sends", func(t *testing.T, c *net.TCPConn, br *bufio.Reader, sc *net.TCPConn) {
			io.WriteString(sc, "bye")
			sc.CloseWrite()
			io.WriteString(c, halfFrame)
			if b, err := io.ReadAll(br); string(b) != "bye" || err != nil {
				t.Errorf("client got %q, %v; want the sandbox's last bytes, then EOF", b, err)
			}
			c.Close()
			sc.Close()
		}},
		{"both silent for the idle timeout", func(t *testing.T, c *net.TCPConn, _ *bufio.Reader, sc *net.TCPConn) {
			readEOF(t, c)
			readEOF(t, sc)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, br, resp := upgrade(t)
			if resp.StatusCode != 101 {
				t.Fatalf("upgrade: %d, want 101: the slot of an earlier tunnel is still taken", resp.StatusCode)
			}
			var sc *net.TCPConn
			select {
			case conn := <-accepted:
				sc = conn.(*net.TCPConn)
			case <-time.After(5 * time.Second):
				t.Fatal("the sandbox never got the upgrade")
			}
			t.Cleanup(func() { sc.Close() })
			// While the tunnel is open, the sandbox is at its cap.
			c2, _, resp2 := upgrade(t)
			var body struct{ Code string }
			_ = json.NewDecoder(resp2.Body).Decode(&body)
			if resp2.StatusCode != http.StatusTooManyRequests || body.Code != CodeTooManyStreams || resp2.Header.Get("Retry-After") == "" {
				t.Errorf("second upgrade while the tunnel is open: %d %q, want 429 %s with Retry-After", resp2.StatusCode, body.Code, CodeTooManyStreams)
			}
			c2.Close()
			tc.end(t, c, br, sc)
			testenv.WaitFor(t, 5*time.Second, "the tunnel's slot to come back", func() bool {
				_, n := h.proxy.streams.open()
				return n == 0 && poolConns(h) == 0 && h.proxy.sandboxes.peek("wscap").inFlight() == 0
			})
		})
	}
}

// The drain deadline cuts every open tunnel whatever it is waiting on, and
// Shutdown returns with none left: an idle one, one whose client stopped
// reading while its sandbox sends, one whose sandbox stopped reading while
// its client sends, one whose client half-closed while its sandbox still
// sends. The tunnel is byte-level, so the cut is a TCP close without a
// close frame (a browser reports 1006), as through nginx: the client gets
// nothing from the proxy's own, only the end. Each is logged
// drain_timeout with its 101.
func TestDrainCutsTunnelsInEveryState(t *testing.T) {
	const drain = 300 * time.Millisecond
	h, logs := logHarness(t, accesslog.FormatJSON, func(o *harnessOpts) {
		o.srv.DrainTimeout = drain
		o.srv.ClientWriteTimeout = time.Hour
	})
	ln := listenSmallWindow(t)
	accepted := serveWS101(t, ln)
	host := h.route("wsdrain", uint16(ln.Addr().(*net.TCPAddr).Port))
	open := func(id string, small bool) (net.Conn, *bufio.Reader, net.Conn) {
		t.Helper()
		var c net.Conn
		if small {
			c = dialSmallWindow(t, h.addr)
		} else {
			c = dialRaw(t, h.addr)
		}
		fmt.Fprintf(c, "GET /ws HTTP/1.1\r\nHost: %s\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"+
			"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nX-Cube-Request-Id: %s\r\n\r\n", host, id)
		br := bufio.NewReader(c)
		if resp, err := http.ReadResponse(br, nil); err != nil || resp.StatusCode != 101 {
			t.Fatalf("%s: upgrade: %v %v", id, resp, err)
		}
		return c, br, <-accepted
	}
	push := func(c net.Conn) {
		chunk := make([]byte, 64<<10)
		for {
			if _, err := c.Write(chunk); err != nil {
				return
			}
		}
	}
	idle, idleBr, idleSb := open("drain-idle", false)
	_, _, deafSb := open("drain-client-deaf", true)
	go push(deafSb) // its client reads nothing
	pusher, pusherBr, _ := open("drain-sandbox-deaf", false)
	go io.Copy(io.Discard, pusherBr)
	go push(pusher) // its sandbox reads nothing
	half, halfBr, halfSb := open("drain-half-closed", false)
	_ = half.(*net.TCPConn).CloseWrite()
	readEOF(t, halfSb) // the client's FIN reached the sandbox
	io.WriteString(halfSb, "still")
	readUntil(t, halfBr, "still") // it still gets what its sandbox sends

	start := time.Now()
	if err := h.server.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > drain+2*time.Second {
		t.Errorf("Shutdown took %v with tunnels open, drain_timeout %v", d, drain)
	}
	if _, n := h.proxy.streams.open(); n != 0 {
		t.Errorf("%d tunnels still open after Shutdown", n)
	}
	for _, tc := range []struct {
		name string
		br   *bufio.Reader
		c    net.Conn
		want string
	}{
		{"idle", idleBr, idle, ""},
		{"half-closed", halfBr, half, ""},
	} {
		_ = tc.c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if b, err := io.ReadAll(tc.br); string(b) != tc.want || err != nil {
			t.Errorf("%s tunnel's client got %q, %v after the drain; want %q, then EOF", tc.name, b, err, tc.want)
		}
	}
	readEOF(t, idleSb)
	for _, id := range []string{"drain-idle", "drain-client-deaf", "drain-sandbox-deaf", "drain-half-closed"} {
		if e := logs.waitJSON(t, id); e["status"] != float64(101) || e["error_code"] != CodeDrainTimeout {
			t.Errorf("%s: logged status %v error_code %q, want 101 %q", id, e["status"], e["error_code"], CodeDrainTimeout)
		}
	}
}

// A sandbox that declines an upgrade with an ordinary answer (a page, a
// 400, a redirect, a close-delimited body, a 426 naming the protocol it
// wants) is relayed as one, its hop-by-hop Connection line removed, and
// the client's connection stays open for its next request,
// while the sandbox's is closed (it was asked to switch: what it does
// with the rest of the connection is unknown). A body the sandbox frames
// by its close reaches the client chunked, so its connection survives too.
func TestDeclinedUpgradeKeepsTheClientConnection(t *testing.T) {
	h := newHarness(t)
	for _, tc := range []struct {
		name, answer string
		status       int
		body         string
	}{
		{"200 page", okResponse("plain"), 200, "plain"},
		{"400", "HTTP/1.1 400 Bad Request\r\nContent-Length: 3\r\n\r\nbad", 400, "bad"},
		{"302", "HTTP/1.1 302 Found\r\nLocation: /login\r\nContent-Length: 0\r\n\r\n", 302, ""},
		{"close-delimited", "HTTP/1.1 403 Forbidden\r\n\r\nuntil close", 403, "until close"},
		{"426", "HTTP/1.1 426 Upgrade Required\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nContent-Length: 2\r\n\r\nno", 426, "no"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newScriptBackend(t, func(c net.Conn, req *http.Request, _ int) bool {
				if req.URL.Path == "/ws" {
					rawWrite(c, tc.answer)
					return false // closed: ends a close-delimited body
				}
				return rawWrite(c, okResponse("next"))
			})
			host := h.route("wsdeclined", b.port)
			c := dialRaw(t, h.addr)
			fmt.Fprintf(c, "GET /ws HTTP/1.1\r\nHost: %s\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"+
				"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n", host)
			br := bufio.NewReader(c)
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatal(err)
			}
			body, err := io.ReadAll(resp.Body)
			if resp.StatusCode != tc.status || string(body) != tc.body || err != nil {
				t.Errorf("declined upgrade: %d %q %v, want %d %q", resp.StatusCode, body, err, tc.status, tc.body)
			}
			if resp.Close || resp.Header.Get("Connection") != "" {
				t.Errorf("declined upgrade's answer: close %v, Connection %q; want the connection kept, no Connection line",
					resp.Close, resp.Header.Get("Connection"))
			}
			fmt.Fprintf(c, "GET /next HTTP/1.1\r\nHost: %s\r\n\r\n", host)
			resp, err = http.ReadResponse(br, nil)
			if err != nil {
				t.Fatalf("the next request on the client's connection: %v", err)
			}
			if body, _ := io.ReadAll(resp.Body); resp.StatusCode != 200 || string(body) != "next" {
				t.Errorf("the next request: %d %q, want 200 %q", resp.StatusCode, body, "next")
			}
			b.wantAccepted(t, 2, "(the declined upgrade's connection is not reused)")
		})
	}
}

// A sandbox's 426 must name the protocols it wants in Upgrade (RFC 9110
// §15.5.22), so that field reaches the client, as through nginx, which
// relays it with its own Connection line; the Connection the sandbox sent
// is still its own. Any other answer's Upgrade (Apache's "h2,h2c" offer
// on a 200) describes the sandbox's connection and is removed, as before.
func TestUpgradeRequiredKeepsUpgrade(t *testing.T) {
	h := newHarness(t)
	for _, tc := range []struct {
		name, answer string
		upgradeAsked bool
		status       int
		wantUpgrade  string
	}{
		{"426 to a WebSocket", "HTTP/1.1 426 Upgrade Required\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nContent-Length: 2\r\n\r\nno", true, 426, "websocket"},
		{"426 to a plain GET", "HTTP/1.1 426 Upgrade Required\r\nUpgrade: websocket\r\nConnection: Upgrade, X-Hop\r\nX-Hop: 1\r\nContent-Length: 2\r\n\r\nno", false, 426, "websocket"},
		{"426 with Upgrade alone", "HTTP/1.1 426 Upgrade Required\r\nUpgrade: TLS/1.2, HTTP/1.1\r\nContent-Length: 2\r\n\r\nno", false, 426, "TLS/1.2, HTTP/1.1"},
		{"426 without Upgrade", "HTTP/1.1 426 Upgrade Required\r\nContent-Length: 2\r\n\r\nno", true, 426, ""},
		{"200 offering h2c", "HTTP/1.1 200 OK\r\nUpgrade: h2,h2c\r\nConnection: Upgrade\r\nContent-Length: 2\r\n\r\nno", false, 200, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newScriptBackend(t, func(c net.Conn, req *http.Request, _ int) bool {
				if req.URL.Path == "/x" {
					return rawWrite(c, tc.answer) && !tc.upgradeAsked
				}
				return rawWrite(c, okResponse("next"))
			})
			host := h.route("upgraderequired", b.port)
			c := dialRaw(t, h.addr)
			upgrade := ""
			if tc.upgradeAsked {
				upgrade = "Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
			}
			fmt.Fprintf(c, "GET /x HTTP/1.1\r\nHost: %s\r\n%s\r\n", host, upgrade)
			br := bufio.NewReader(c)
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatal(err)
			}
			body, err := io.ReadAll(resp.Body)
			if resp.StatusCode != tc.status || string(body) != "no" || err != nil {
				t.Fatalf("answer: %d %q %v, want %d %q", resp.StatusCode, body, err, tc.status, "no")
			}
			if got := strings.Join(resp.Header.Values("Upgrade"), ", "); got != tc.wantUpgrade {
				t.Errorf("Upgrade %q, want %q", got, tc.wantUpgrade)
			}
			if resp.Close || resp.Header.Get("Connection") != "" || resp.Header.Get("X-Hop") != "" {
				t.Errorf("close %v, Connection %q, X-Hop %q; want the connection kept and the sandbox's Connection and what it names removed",
					resp.Close, resp.Header.Get("Connection"), resp.Header.Get("X-Hop"))
			}
			fmt.Fprintf(c, "GET /next HTTP/1.1\r\nHost: %s\r\n\r\n", host)
			resp, err = http.ReadResponse(br, nil)
			if err != nil {
				t.Fatalf("the next request on the client's connection: %v", err)
			}
			if body, _ := io.ReadAll(resp.Body); resp.StatusCode != 200 || string(body) != "next" {
				t.Errorf("the next request: %d %q, want 200 %q", resp.StatusCode, body, "next")
			}
		})
	}
}

// A tunnel whose sandbox ended it during a drain lingers on its client's
// side as at any other time (the sandbox's last bytes, then a FIN, and
// what the client still sends read and dropped until it closes), and the
// drain waits for that as for a refusal's lingering close, until its
// deadline. It did not: the tunnel had left the registry, so the drain
// found nothing open and ended at once, and its end closed the socket
// over the client's next bytes (its reply to the sandbox's close frame),
// a reset, which loses what of the sandbox's tail the kernel had not
// delivered yet.
func TestDrainWaitsForATunnelsLinger(t *testing.T) {
	h := newHarness(t, func(o *harnessOpts) { o.srv.DrainTimeout = 10 * time.Second })
	ln := listen(t, "127.0.0.1:0")
	accepted := serveWS101(t, ln)
	host := h.route("wsdrainlinger", uint16(ln.Addr().(*net.TCPAddr).Port))
	c := dialRaw(t, h.addr)
	fmt.Fprintf(c, "GET /ws HTTP/1.1\r\nHost: %s\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n", host)
	br := bufio.NewReader(c)
	if resp, err := http.ReadResponse(br, nil); err != nil || resp.StatusCode != 101 {
		t.Fatalf("upgrade: %v %v", resp, err)
	}
	var sc net.Conn
	select {
	case sc = <-accepted:
	case <-time.After(5 * time.Second):
		t.Fatal("the sandbox never got the upgrade")
	}
	shut := make(chan error, 1)
	go func() { shut <- h.server.Shutdown(context.Background()) }()
	h.waitListenerClosed(5 * time.Second)
	io.WriteString(sc, "bye")
	sc.Close()
	if b, err := io.ReadAll(br); string(b) != "bye" || err != nil {
		t.Fatalf("client got %q, %v; want the sandbox's last bytes, then EOF", b, err)
	}
	select {
	case err := <-shut:
		t.Fatalf("the drain ended (%v) while the client's side still lingered", err)
	case <-time.After(500 * time.Millisecond):
	}
	// The client's reply to the close is read and dropped: the socket is
	// not closed over it (which would answer the next write with a reset).
	for i := 0; i < 2; i++ {
		if _, err := io.WriteString(c, "reply"); err != nil {
			t.Fatalf("client's write %d after the sandbox's end: %v", i+1, err)
		}
	}
	c.Close()
	drainEnds(t, shut, 5*time.Second, "the drain did not end once the client closed")
}

// A WebSocket whose 101 comes during the drain counts open from its
// handler on: fasthttp counts the connection out as the handler returns,
// before the hijack handler lists the tunnel, and a drain that found
// nothing open in between ended, its Shutdown returned, and the tunnel
// then ran on unwaited for, to be cut by the process's exit unlogged.
func TestDrainWaitsForATunnelAboutToOpen(t *testing.T) {
	h := newHarness(t, func(o *harnessOpts) { o.srv.DrainTimeout = 10 * time.Second })
	hooked, proceed := make(chan struct{}), make(chan struct{})
	h.proxy.beforeTunnelListed = func() {
		close(hooked)
		<-proceed
	}
	arrived, release := make(chan struct{}, 1), make(chan struct{})
	ln := testenv.ServeTCP(t, func(c net.Conn) {
		defer c.Close()
		br := bufio.NewReader(c)
		if _, err := http.ReadRequest(br); err != nil {
			return
		}
		arrived <- struct{}{}
		<-release
		io.WriteString(c, ws101)
		b := make([]byte, 64)
		n, _ := br.Read(b)
		io.WriteString(c, "echo:"+string(b[:n]))
		io.Copy(io.Discard, br)
	})
	host := h.route("wsdrainopen", uint16(ln.Addr().(*net.TCPAddr).Port))
	c := dialRaw(t, h.addr)
	fmt.Fprintf(c, "GET /ws HTTP/1.1\r\nHost: %s\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n", host)
	testenv.Recv(t, arrived, 10*time.Second, "the upgrade at the sandbox")
	shut := make(chan error, 1)
	go func() { shut <- h.server.Shutdown(context.Background()) }()
	h.waitListenerClosed(5 * time.Second)
	close(release)
	select {
	case <-hooked:
	case <-time.After(5 * time.Second):
		t.Fatal("the tunnel's hijack handler never ran")
	}
	// fasthttp's own wait looks every 100 ms.
	select {
	case err := <-shut:
		close(proceed)
		t.Fatalf("the drain ended (%v) with a tunnel about to open", err)
	case <-time.After(500 * time.Millisecond):
	}
	close(proceed)
	br := bufio.NewReader(c)
	if resp, err := http.ReadResponse(br, nil); err != nil || resp.StatusCode != 101 {
		t.Fatalf("upgrade: %v %v", resp, err)
	}
	io.WriteString(c, "hi")
	b := make([]byte, 7)
	if _, err := io.ReadFull(br, b); err != nil || string(b) != "echo:hi" {
		t.Fatalf("echo during the drain: %q %v", b, err)
	}
	c.Close()
	drainEnds(t, shut, 5*time.Second, "the drain did not end once the tunnel closed")
}

// serveWS101 serves on ln a sandbox that answers every upgrade it reads
// with a 101 and hands the connection, now a tunnel's, to the test on the
// channel it returns.
func serveWS101(t *testing.T, ln net.Listener) <-chan net.Conn {
	accepted := make(chan net.Conn, 4)
	testenv.Serve(t, ln, func(c net.Conn) {
		if _, err := http.ReadRequest(bufio.NewReader(c)); err != nil {
			c.Close()
			return
		}
		io.WriteString(c, ws101)
		accepted <- c
	})
	return accepted
}
