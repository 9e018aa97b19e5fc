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

// rawHead sends req on a new connection to addr and returns the head of
// the first answer (interim ones included, as the client reads them).
func rawHead(t *testing.T, addr, req string) string {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, req); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(c)
	var b strings.Builder
	for {
		l, err := br.ReadString('\n')
		b.WriteString(l)
		if err != nil || l == "\r\n" {
			return b.String()
		}
	}
}

// Every kind of answer carries one Date, the proxy's, whichever way it is
// written: fasthttp's own (the proxy's JSON errors, a 431, the sandbox's
// answers relayed, a download through WriteTo), the head the proxy writes
// itself on a hijacked connection (a detached event stream, an HTTP/1.0
// client's stream, a WebSocket's 101, each replacing the sandbox's Date),
// and the redirect and admin listeners'. TestAnswersCarryTheProxysDate
// covers the sandbox's plain answers; this one the other paths, where a
// Date could be lost or written twice.
func TestEveryKindOfAnswerDatedOnce(t *testing.T) {
	h := newHarness(t)
	d := "Date: Tue, 01 Jan 2030 00:00:00 GMT\r\n"
	nm := h.route("nm", rawBackend(t, "HTTP/1.1 304 Not Modified\r\n"+d+"ETag: \"x\"\r\n\r\n"))
	hd := h.route("hd", rawBackend(t, "HTTP/1.1 200 OK\r\n"+d+"Content-Length: 5\r\n\r\nhello"))
	lower := h.route("lower", rawBackend(t, "HTTP/1.1 200 OK\r\ndate: Tue, 01 Jan 2030 00:00:00 GMT\r\nDATE: x\r\nContent-Length: 2\r\n\r\nok"))
	big := strings.Repeat("x", 8<<20)
	dl := h.route("dl", rawBackend(t, "HTTP/1.1 200 OK\r\n"+d+"Content-Length: "+fmt.Sprint(len(big))+"\r\n\r\n"+big))
	sse := h.route("sse", rawBackend(t, "HTTP/1.1 200 OK\r\n"+d+"Content-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n5\r\ndata:\r\n0\r\n\r\n"))
	ws := testenv.ServeTCP(t, func(c net.Conn) {
		defer c.Close()
		if _, err := http.ReadRequest(bufio.NewReader(c)); err != nil {
			return
		}
		io.WriteString(c, "HTTP/1.1 101 Switching Protocols\r\n"+d+"Upgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
		io.Copy(io.Discard, c)
	})
	wsh := h.route("wsd", uint16(ws.Addr().(*net.TCPAddr).Port))
	rl := listen(t, "127.0.0.1:0")
	go h.server.ServeRedirect(rl, "8443")
	for _, tc := range []struct{ name, addr, req, status string }{
		{"proxy's 404", h.addr, "GET / HTTP/1.1\r\nHost: 8080-nosuch.cube.test\r\n\r\n", "404"},
		{"above the root", h.addr, "GET /../x HTTP/1.1\r\nHost: " + hd + "\r\n\r\n", "400"},
		{"malformed head", h.addr, "GET / HTTP/1.1\r\nHost: " + hd + "\r\nBad Header\r\n\r\n", "400"},
		{"head too large", h.addr, "GET / HTTP/1.1\r\nHost: " + hd + "\r\nX: " + strings.Repeat("a", 200000) + "\r\n\r\n", "431"},
		{"304", h.addr, "GET / HTTP/1.1\r\nHost: " + nm + "\r\n\r\n", "304"},
		{"HEAD", h.addr, "HEAD / HTTP/1.1\r\nHost: " + hd + "\r\n\r\n", "200"},
		{"sandbox's date in any case", h.addr, "GET / HTTP/1.1\r\nHost: " + lower + "\r\n\r\n", "200"},
		{"download", h.addr, "GET / HTTP/1.1\r\nHost: " + dl + "\r\n\r\n", "200"},
		{"detached event stream", h.addr, "GET / HTTP/1.1\r\nHost: " + sse + "\r\n\r\n", "200"},
		{"event stream to a POST", h.addr, "POST / HTTP/1.1\r\nHost: " + sse + "\r\nContent-Length: 0\r\n\r\n", "200"},
		{"HTTP/1.0 stream", h.addr, "GET / HTTP/1.0\r\nHost: " + sse + "\r\n\r\n", "200"},
		{"WebSocket 101", h.addr, "GET /ws HTTP/1.1\r\nHost: " + wsh + "\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n" +
			"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n", "101"},
		{"redirect listener", rl.Addr().String(), "GET / HTTP/1.1\r\nHost: " + hd + "\r\n\r\n", "308"},
		{"admin listener", h.admin, "GET /admin/routes HTTP/1.1\r\nHost: x\r\n\r\n", "403"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := time.Now().Add(-time.Second).Truncate(time.Second)
			head := rawHead(t, tc.addr, tc.req)
			if !strings.HasPrefix(head, "HTTP/1.1 "+tc.status+" ") {
				t.Fatalf("answer %q, want %s", head, tc.status)
			}
			var dates []string
			for _, l := range strings.Split(head, "\r\n") {
				if name, v, ok := strings.Cut(l, ":"); ok && strings.EqualFold(name, "Date") {
					dates = append(dates, strings.TrimSpace(v))
				}
			}
			if len(dates) != 1 {
				t.Fatalf("Date lines %q, want one: %q", dates, head)
			}
			if at, err := http.ParseTime(dates[0]); err != nil || at.Before(before) || at.After(time.Now()) {
				t.Errorf("Date %q (%v), want the time of the answer", dates[0], err)
			}
		})
	}
}
