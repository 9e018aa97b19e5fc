package proxy

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"syscall"
	"testing"
	"time"
)

// A tunnel busy one way only, its bytes taken slowly but steadily by the
// other end (a log tail read over a poor link, an upload to a sandbox that
// reads at its own pace), is not silent: upstream.idle_timeout closes a
// tunnel only when neither side has sent anything for that long (README),
// as nginx's proxy_read_timeout, whose timer is off while its peer's data
// waits for the other side. The proxy's copy writes what it read in pieces
// of up to 64 KiB; a piece that takes longer than the idle timeout to be
// taken is traffic all along, not silence. After the transfer, the side
// that read it answers, and the other side gets that answer: the tunnel is
// still open both ways.
//
// 1 KiB every 100 ms: a 64 KiB piece takes three idle timeouts to go
// through, the first half of the whole about five. A 2 s timeout, not 1:
// a loaded machine's stall of a second ended the tunnel in one full run.
func TestTunnelSlowOneWayOutlivesIdleTimeout(t *testing.T) {
	t.Parallel()
	const (
		idle  = 2 * time.Second
		size  = 192 << 10
		every = 100 * time.Millisecond
	)
	// slowRead reads size bytes from r, the first half 1 KiB every tick,
	// then the rest at once: the proxy's last piece is then still waiting
	// on the reader, not handed whole to its kernel, whose buffers would
	// hold the tail for longer than the idle timeout with the proxy
	// silent, as nginx's would, which closes such a tunnel too.
	slowRead := func(r io.Reader) error {
		tick := time.NewTicker(every)
		defer tick.Stop()
		buf := make([]byte, size)
		start, got := time.Now(), 0
		for got < size {
			want := 1 << 10
			if got >= size/2 {
				want = size - got
			}
			n, err := io.ReadFull(r, buf[:want])
			got += n
			if err != nil {
				return fmt.Errorf("got %d of %d bytes in %v, reading steadily: %v", got, size, time.Since(start).Round(time.Millisecond), err)
			}
			<-tick.C
		}
		return nil
	}
	// push writes the payload to w and then reads the other side's answer.
	push := func(w io.Writer, r io.Reader) error {
		start := time.Now()
		if _, err := w.Write(bytes.Repeat([]byte("x"), size)); err != nil {
			return fmt.Errorf("push, %v after the 101: %v", time.Since(start).Round(time.Millisecond), err)
		}
		ans := make([]byte, 4)
		if _, err := io.ReadFull(r, ans); err != nil || string(ans) != "done" {
			return fmt.Errorf("the answer after the push, %v after the 101: %q, %v", time.Since(start).Round(time.Millisecond), ans, err)
		}
		return nil
	}
	for _, tc := range []struct {
		name     string
		toClient bool // the sandbox pushes, the client reads slowly; else the other way
	}{
		{"sandbox pushes to a slow client", true},
		{"client pushes to a slow sandbox", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, func(o *harnessOpts) {
				o.cfg.IdleStreamTimeout = idle
				o.srv.ClientWriteTimeout = 2 * idle
			})
			ln := listen(t, "127.0.0.1:0")
			if !tc.toClient {
				ln = listenSmallSegments(t)
			}
			sandbox := make(chan error, 1)
			go func() {
				c, br, ok := acceptUpgrade(ln) // takes the client's "g"
				if !ok {
					sandbox <- fmt.Errorf("upgrade failed")
					return
				}
				defer c.Close()
				_ = c.SetDeadline(time.Now().Add(60 * time.Second))
				if tc.toClient {
					sandbox <- push(c, br)
					return
				}
				err := slowRead(br)
				if err == nil {
					_, err = io.WriteString(c, "done")
				}
				sandbox <- err
			}()
			host := h.route("wsslow", uint16(ln.Addr().(*net.TCPAddr).Port))
			var c net.Conn
			if tc.toClient {
				front := listenSmallSendBuffer(t, 4<<10) // 8 KiB: the kernel doubles it
				go h.server.Serve(front)
				c = dialSmallWindow(t, front.Addr().String())
			} else {
				c = dialRaw(t, h.addr)
			}
			_ = c.SetDeadline(time.Now().Add(60 * time.Second))
			fmt.Fprintf(c, "GET /ws HTTP/1.1\r\nHost: %s\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"+
				"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n", host)
			br := bufio.NewReaderSize(c, 1024)
			if resp, err := http.ReadResponse(br, nil); err != nil || resp.StatusCode != 101 {
				t.Fatalf("upgrade: %v %v", resp, err)
			}
			io.WriteString(c, "g") // the sandbox's go-ahead
			var err error
			if tc.toClient {
				if err = slowRead(br); err == nil {
					_, err = io.WriteString(c, "done")
				}
			} else {
				err = push(c, br)
			}
			if err != nil {
				t.Errorf("client: %v", err)
			}
			if err := <-sandbox; err != nil {
				t.Errorf("sandbox: %v", err)
			}
		})
	}
}

// listenSmallSegments is listenSmallWindow with the smallest segments too:
// the kernel sizes the proxy's send buffer to a sandbox by its segments,
// and loopback's 64 KiB ones let it take a slow sandbox's whole upload at
// once, where its write is to wait as it does on a real network.
func listenSmallSegments(t *testing.T) net.Listener {
	t.Helper()
	return listenWithSockopts(t, sockopt{syscall.SOL_SOCKET, syscall.SO_RCVBUF, 2048},
		sockopt{syscall.IPPROTO_TCP, syscall.TCP_MAXSEG, 536})
}

// A client that stops reading a tunnel, and sends nothing, while the
// sandbox keeps pushing, is cut at client.write_timeout even when that is
// longer than upstream.idle_timeout: the write in flight keeps the other
// copy's read from taking the tunnel for idle (tunnel.read), and must not
// keep it for ever once the write fails. Over TLS too, whose write to a
// client goes through the TLS layer.
func TestTunnelClientThatStopsReadingIsCutPastIdle(t *testing.T) {
	t.Parallel()
	const (
		idle         = 300 * time.Millisecond
		writeTimeout = 1500 * time.Millisecond
	)
	for _, overTLS := range []bool{false, true} {
		t.Run(fmt.Sprintf("tls=%v", overTLS), func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, func(o *harnessOpts) {
				o.cfg.IdleStreamTimeout = idle
				o.srv.ClientWriteTimeout = writeTimeout
			})
			ln := listen(t, "127.0.0.1:0")
			// The sandbox pushes from its 101 on, asking the client for no
			// go-ahead: one that reached it only after the idle timeout
			// (the test's goroutine stalled on loaded cores) found the
			// tunnel closed as idle, before what is tested began.
			closed := make(chan time.Time, 1)
			go func() {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				defer c.Close()
				br := bufio.NewReader(c)
				if _, err := http.ReadRequest(br); err != nil {
					return
				}
				io.WriteString(c, ws101)
				go func() {
					chunk := bytes.Repeat([]byte("x"), 64<<10)
					for {
						if _, err := c.Write(chunk); err != nil {
							return
						}
					}
				}()
				io.Copy(io.Discard, br) // until the proxy closes its side
				closed <- time.Now()
			}()
			host := h.route("wsstopped", uint16(ln.Addr().(*net.TCPAddr).Port))
			var c net.Conn
			if overTLS {
				c = dialProxy(t, h, host, true)
			} else {
				c = dialSmallWindow(t, h.addr)
			}
			start := time.Now()
			fmt.Fprintf(c, "GET /ws HTTP/1.1\r\nHost: %s\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"+
				"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n", host)
			resp, err := http.ReadResponse(bufio.NewReaderSize(c, 1024), nil)
			if err != nil || resp.StatusCode != 101 {
				t.Fatalf("upgrade: %v %v", resp, err)
			}
			// From now on the client reads and sends nothing.
			select {
			case at := <-closed:
				took := at.Sub(start)
				t.Logf("tunnel closed %v after the upgrade", took.Round(time.Millisecond))
				// Not at once either: every deadline that may end it (the
				// idle one, the write timeout, both longer) is set after
				// start, and a timer never fires early, so this bound
				// holds however loaded the machine.
				if took < idle {
					t.Errorf("the tunnel closed %v after the request was sent, before the idle timeout (%v) could have passed: cut at once, not for its stalled client", took, idle)
				}
			case <-time.After(10 * writeTimeout):
				t.Fatal("a tunnel whose client stopped reading is still open after 10 write timeouts")
			}
		})
	}
}
