package proxy

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// A client that leaves while its upload waits on a sandbox that reads no
// more (a stuck or busy app) ends the exchange at once, as the platform's
// nginx ends it (it reports "client prematurely closed connection ... while
// sending request to upstream" and logs 499). Before, the proxy's write to
// the sandbox waited for upstream.idle_timeout (7206 s): the departed
// client's socket, the sandbox's connection, a goroutine, the request's
// max_streams_per_sandbox slot and its client.max_conns place were all held
// for two hours (measured: 200 such clients left 400 descriptors and 200
// connections_open until the timeout).
func TestClientLeftUploadToSandboxThatReadsNoMore(t *testing.T) {
	t.Parallel()
	h, logs := logHarness(t, "json", func(o *harnessOpts) {
		o.cfg.MaxStreamsPerSandbox = 1
		o.cfg.StreamLimitWait = -1
	})
	heads := make(chan struct{}, 1)
	release := make(chan struct{}, 1)
	ended := make(chan error, 1)
	ln := testenv.ServeTCP(t, func(c net.Conn) {
		br := bufio.NewReader(c)
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		if req.URL.Path == "/next" {
			_, _ = io.Copy(io.Discard, req.Body)
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
			return
		}
		if req.URL.Path == "/interim" {
			// Bytes that do not tell whether the body is refused: the
			// send looks at them again (writeUntold).
			io.WriteString(c, "HTTP/1.1 103 Early Hints\r\nLink: </a.css>\r\n\r\n")
		}
		heads <- struct{}{}
		// Reads no more of the body until the test has seen the proxy
		// give up.
		select {
		case <-t.Context().Done():
			return
		case <-release:
		}
		// Then whatever the proxy sent, and its close.
		_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
		_, err = io.Copy(io.Discard, br)
		ended <- err
	})
	host := h.route("sbxuploadleft", uint16(ln.Addr().(*net.TCPAddr).Port))

	// The client resets: a close would queue its FIN behind the body bytes
	// the proxy does not read, and no proxy could see it before the
	// client's kernel gives up on them and resets.
	for i, tc := range []struct {
		name, path string
		framing    string // the body's framing header
	}{
		{"Content-Length", "/up", "Content-Length: 100000000"},
		{"chunked", "/up", "Transfer-Encoding: chunked"},
		{"behind an interim answer", "/interim", "Content-Length: 100000000"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id := fmt.Sprintf("upload-left-%d", i)
			c := dialRaw(t, h.addr).(*net.TCPConn)
			fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: %s\r\nX-Cube-Request-Id: %s\r\n%s\r\n\r\n", tc.path, host, id, tc.framing)
			piece := strings.Repeat("u", 64<<10)
			if tc.framing == "Transfer-Encoding: chunked" {
				piece = fmt.Sprintf("%x\r\n%s\r\n", len(piece), piece)
			}
			// The client sends until the sandbox's and the proxy's buffers
			// are full: its write blocks.
			for {
				_ = c.SetWriteDeadline(time.Now().Add(300 * time.Millisecond))
				if _, err := io.WriteString(c, piece); err != nil {
					if !isTimeout(err) {
						t.Fatalf("upload: %v", err)
					}
					break
				}
			}
			select {
			case <-heads:
			case <-time.After(5 * time.Second):
				t.Fatal("the request never reached the sandbox")
			}
			reset(c)

			start := time.Now()
			e := logs.waitJSON(t, id)
			if e["status"] != float64(499) || e["error_code"] != CodeClientClosed {
				t.Errorf("logged %v %q, want 499 %q", e["status"], e["error_code"], CodeClientClosed)
			}
			if d := time.Since(start); d > time.Second {
				t.Errorf("the exchange ended %v after the client left", d)
			}
			// Its slot is free: the sandbox's next request is served.
			resp := h.do(h.req("POST", host, "/next", strings.NewReader("x")))
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 {
				t.Errorf("the next request got %d: the departed client's slot is still held", resp.StatusCode)
			}
			release <- struct{}{}
			if err := <-ended; isTimeout(err) {
				t.Error("the sandbox's connection stayed open after the client left")
			}
		})
	}
}

// The same for a WebSocket whose sandbox reads no more: a client that
// resets while the tunnel's write to the sandbox waits ends the tunnel at
// once, logged as client_closed_request. Before, nobody read the client's
// socket (one copy waited on that write, the other on the sandbox), and
// the tunnel, both sockets and the slot were held until
// upstream.idle_timeout (measured: 100 such clients left websockets_open
// 100 and 200 descriptors). nginx holds them too; the upload's fix costs
// a tunnel nothing while its writes flow.
func TestClientResetTunnelToSandboxThatReadsNoMore(t *testing.T) {
	h, logs := logHarness(t, "json")
	release := make(chan struct{})
	ended := make(chan error, 1)
	ln := testenv.ServeTCP(t, func(c net.Conn) {
		br := bufio.NewReader(c)
		if _, err := http.ReadRequest(br); err != nil {
			return
		}
		io.WriteString(c, ws101)
		// Reads no more until the test has seen the tunnel end.
		select {
		case <-t.Context().Done():
			return
		case <-release:
		}
		_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
		_, err := io.Copy(io.Discard, br)
		ended <- err
	})
	host := h.route("sbxtunnelreset", uint16(ln.Addr().(*net.TCPAddr).Port))
	c := dialRaw(t, h.addr).(*net.TCPConn)
	fmt.Fprintf(c, "GET /ws HTTP/1.1\r\nHost: %s\r\nX-Cube-Request-Id: tunnel-reset\r\n%s\r\n", host, leakUpgrade)
	if resp, err := http.ReadResponse(bufio.NewReader(c), nil); err != nil || resp.StatusCode != 101 {
		t.Fatalf("upgrade: %v %v", resp, err)
	}
	piece := make([]byte, 64<<10)
	for {
		_ = c.SetWriteDeadline(time.Now().Add(300 * time.Millisecond))
		if _, err := c.Write(piece); err != nil {
			if !isTimeout(err) {
				t.Fatalf("send: %v", err)
			}
			break
		}
	}
	reset(c)
	start := time.Now()
	e := logs.waitJSON(t, "tunnel-reset")
	if e["status"] != float64(101) || e["error_code"] != CodeClientClosed {
		t.Errorf("logged %v %q, want 101 %q", e["status"], e["error_code"], CodeClientClosed)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("the tunnel ended %v after the client reset", d)
	}
	// The tunnel stays listed until its line is logged (websocket.go: the
	// drain waits on the list), so it leaves the list just after the line.
	testenv.WaitFor(t, 10*time.Second, "the tunnel off the registry's list", func() bool {
		_, tn := h.proxy.streams.open()
		return tn == 0
	})
	close(release)
	if err := <-ended; isTimeout(err) {
		t.Error("the sandbox's connection stayed open after the client reset")
	}
}
