package proxy

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"net/textproto"
	"strings"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// A sandbox's 101 reaches the client without its hop-by-hop headers
// (RFC 9110 §7.6.1), as every other answer does, but with Upgrade and one
// "Connection: Upgrade" line (§7.8), as nginx rebuilds it: Keep-Alive,
// Proxy-Connection, TE, Trailer and what its Connection lines name
// describe the sandbox's connection to the proxy, not the client's. Its
// Transfer-Encoding and Content-Length never go out either (a 101 has no
// body: the bytes after it are the tunnel's), and the bytes the sandbox
// sent with its 101 follow the head unchanged. A 101 whose Connection
// lines list more options than any answer may is refused, as other
// answers are.
func TestSwitchDropsHopHeaders(t *testing.T) {
	h := newHarness(t)
	answers, host := answerOnce(t, h, "wshops")
	gone := []string{"Keep-Alive", "Proxy-Connection", "Te", "Trailer", "Transfer-Encoding", "Content-Length", "X-Hop", "X-Hop2"}
	for _, tc := range []struct {
		name, head string
		status     int
	}{
		{"every hop-by-hop header", "Connection: Upgrade, X-Hop, keep-alive\r\nX-Hop: secret\r\nKeep-Alive: timeout=5\r\n" +
			"Proxy-Connection: keep-alive\r\nTE: trailers\r\nTrailer: X-T\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n", 101},
		{"Connection on several lines", "Connection: keep-alive\r\nConnection: X-Hop\r\nConnection: upgrade, X-Hop2\r\n" +
			"X-Hop: 1\r\nX-Hop2: 2\r\nKeep-Alive: timeout=5\r\n", 101},
		{"plain", "Connection: Upgrade\r\n", 101},
		{"too many Connection options", "Connection: Upgrade" + strings.Repeat(", X-A", maxConnectionOptions) + "\r\n", 502},
	} {
		answers <- "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n" + tc.head +
			"Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\nX-End: kept\r\n\r\nhello"
		c := dialRaw(t, h.addr)
		fmt.Fprintf(c, "GET /ws HTTP/1.1\r\nHost: %s\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"+
			"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n", host)
		br := bufio.NewReader(c)
		if tc.status != 101 {
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatalf("%s: %v", tc.name, err)
			}
			body, _ := io.ReadAll(resp.Body)
			checkProxyError(t, resp, string(body), tc.status, CodeUpstreamBadHeader)
		} else {
			// Read as sent: net/http's reader hides Transfer-Encoding.
			tp := textproto.NewReader(br)
			status, err := tp.ReadLine()
			if err != nil {
				t.Fatalf("%s: %v", tc.name, err)
			}
			hdr, err := tp.ReadMIMEHeader()
			if err != nil {
				t.Fatalf("%s: %q: %v", tc.name, status, err)
			}
			if status != "HTTP/1.1 101 Switching Protocols" {
				t.Errorf("%s: status line %q", tc.name, status)
			}
			if got := hdr.Values("Connection"); len(got) != 1 || got[0] != "Upgrade" {
				t.Errorf("%s: Connection %q, want one line \"Upgrade\"", tc.name, got)
			}
			if got := hdr.Values("Upgrade"); len(got) != 1 || got[0] != "websocket" {
				t.Errorf("%s: Upgrade %q, want the sandbox's \"websocket\"", tc.name, got)
			}
			for _, name := range gone {
				if v, ok := hdr[textproto.CanonicalMIMEHeaderKey(name)]; ok {
					t.Errorf("%s: %s: %q reached the client", tc.name, name, v)
				}
			}
			if hdr.Get("X-End") != "kept" || hdr.Get("Sec-WebSocket-Accept") == "" {
				t.Errorf("%s: end-to-end headers lost: %q", tc.name, hdr)
			}
			first := make([]byte, 5)
			_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
			if _, err := io.ReadFull(br, first); err != nil || string(first) != "hello" {
				t.Errorf("%s: tunnel's first bytes %q, %v; want \"hello\"", tc.name, first, err)
			}
		}
		c.Close()
		testenv.WaitFor(t, 5*time.Second, tc.name+": the tunnel and its slots to be released", func() bool {
			_, n := h.proxy.streams.open()
			return n == 0 && poolConns(h) == 0 && h.proxy.sandboxes.peek("wshops").inFlight() == 0
		})
	}
}
