package proxy

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// A refused body is read and dropped after the answer (linger), for up to
// 30 s while the client keeps sending. A client without credentials that
// sent a refused body and then trickled, or sent a burst and paused, held
// the 64 KiB copy buffer in each lingering connection: ≈ 110–116 KiB
// counted against GOMEMLIMIT per connection, twice README's 56 KiB sizing.
// The buffer is now taken only while reads keep filling it.
func TestLingeringConnectionHoldsNoBulkBuffer(t *testing.T) {
	if !inOwnProcess(t) {
		return // it counted there, apart from what earlier tests left (inOwnProcess)
	}
	const conns = 200
	const allowed = 80 << 10 // an idle connection's ≈ 49 KiB, the hijack's goroutine, a 4 KiB buffer
	for _, tc := range []struct {
		name  string
		after string // what the client sends once it has read the refusal
	}{
		{"a trickle", strings.Repeat("y", 100)},
		{"a burst, then a pause", strings.Repeat("y", 16<<10)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			before := limitCounted()
			// An unknown sandbox's 404 with the body unread.
			refused := "POST / HTTP/1.1\r\nHost: 3000-nosuchbox.cube.test\r\nContent-Length: 1048576\r\n\r\n" + strings.Repeat("x", 9000)
			cs := answeredConns(t, h.addr, refused, conns, func(resp *http.Response) {
				if resp.StatusCode != http.StatusNotFound || !resp.Close {
					t.Fatalf("got %d (close %v), want the 404 that ends the connection", resp.StatusCode, resp.Close)
				}
			})
			for _, c := range cs {
				if _, err := io.WriteString(c, tc.after); err != nil {
					t.Fatal(err)
				}
			}
			testenv.WaitFor(t, 10*time.Second, "every connection lingering", func() bool { return h.proxy.held.len() == conns })
			per := (int64(limitCounted()) - int64(before)) / conns
			t.Logf("%.1f KiB counted per lingering connection", float64(per)/1024)
			if per > allowed {
				t.Errorf("a lingering connection holds %.0f KiB against GOMEMLIMIT, want under %d KiB", float64(per)/1024, allowed>>10)
			}
		})
	}
}

// A body found malformed while it streams (a bad chunk) is answered 400,
// and what the client still sends is read and dropped, as after any other
// refusal and as nginx does after "client sent invalid chunked body":
// closed with those bytes unread, the connection was reset, and a client
// still writing its upload could fail on the reset before it read the 400.
func TestMalformedBodyRefusalLingers(t *testing.T) {
	h := newHarness(t)
	port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
	}))
	host := h.route("badbody", port)
	c := dialRaw(t, h.addr)
	// A first chunk larger than the read buffer (the body streams), a bad
	// chunk size, and more the client has sent before it reads anything.
	first := strings.Repeat("x", 16<<10)
	if _, err := io.WriteString(c, "POST /up HTTP/1.1\r\nHost: "+host+"\r\nTransfer-Encoding: chunked\r\n\r\n"+
		fmt.Sprintf("%x\r\n%s\r\nzz\r\n", len(first), first)+strings.Repeat("y", 64<<10)); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	checkProxyError(t, resp, string(b), 400, CodeBadBody)
	if _, err := br.ReadByte(); err != io.EOF {
		t.Fatalf("after the 400: %v, want the connection ended cleanly (io.EOF), not reset", err)
	}
}

// A client that sends a large body before it reads the answer (Python's
// requests and httpx, curl without Expect) reads the proxy's refusal of it
// whatever the body's size, as through nginx, whose lingering close is
// bounded by time (lingering_time 30 s) and not by bytes: with the discard
// cut at 16 MiB, a 24 MiB upload to a sandbox whose port was down got a
// broken pipe in httpx and requests instead of the 502 (nginx: the 502).
func TestRefusalOfALargeBodyIsRead(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	down := h.route("downbig", freePort(t))
	const size = 40 << 20 // far over the 16 MiB the discard used to stop at
	for _, tc := range []struct {
		name, host, code string
		status           int
		chunked          bool
	}{
		{"unknown sandbox", "8080-nobigsandbox.cube.test", CodeNotFound, 404, false},
		{"unknown sandbox, chunked", "8080-nobigsandbox.cube.test", CodeNotFound, 404, true},
		{"port down", down, CodeUpstreamConnect, 502, false},
		{"port down, chunked", down, CodeUpstreamConnect, 502, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := dialRaw(t, h.addr)
			_ = c.SetDeadline(time.Now().Add(60 * time.Second))
			bw := bufio.NewWriterSize(c, 64<<10)
			if tc.chunked {
				fmt.Fprintf(bw, "POST /upload HTTP/1.1\r\nHost: %s\r\nTransfer-Encoding: chunked\r\n\r\n", tc.host)
			} else {
				fmt.Fprintf(bw, "POST /upload HTTP/1.1\r\nHost: %s\r\nContent-Length: %d\r\n\r\n", tc.host, size)
			}
			piece := make([]byte, 64<<10)
			for sent := 0; sent < size; sent += len(piece) {
				if tc.chunked {
					fmt.Fprintf(bw, "%x\r\n", len(piece))
				}
				if _, err := bw.Write(piece); err != nil {
					t.Fatalf("sending the body, %d of %d bytes sent: %v", sent, size, err)
				}
				if tc.chunked {
					bw.WriteString("\r\n")
				}
			}
			if tc.chunked {
				bw.WriteString("0\r\n\r\n")
			}
			if err := bw.Flush(); err != nil {
				t.Fatalf("sending the body's end: %v", err)
			}
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Fatalf("no answer after the body: %v", err)
			}
			b, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != tc.status || !strings.Contains(string(b), tc.code) {
				t.Fatalf("got %d %s, want %d %s", resp.StatusCode, b, tc.status, tc.code)
			}
		})
	}
}
