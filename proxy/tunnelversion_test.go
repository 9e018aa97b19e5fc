package proxy

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"testing"
	"time"
)

// A sandbox's 101 goes out with the proxy's own HTTP version, as every
// other answer does (respond) and as nginx writes it: a server that speaks
// HTTP/1.0 on its status line (Python's http.server does by default) got
// its "HTTP/1.0 101" relayed verbatim, which Python's websockets and Rust's
// tungstenite clients refuse ("unsupported protocol; expected HTTP/1.1"),
// and which RFC 9110 §2.5 forbids an intermediary to pass on.
func TestTunnel101GoesOutAsHTTP11(t *testing.T) {
	h := newHarness(t)
	answers, host := answerOnce(t, h, "wsversion")
	answers <- "HTTP/1.0 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\nfirst frame"
	c, err := net.Dial("tcp", h.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintf(c, "GET /ws HTTP/1.1\r\nHost: %s\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"+
		"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n", host)
	br := bufio.NewReader(c)
	line, err := br.ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	if line != "HTTP/1.1 101 Switching Protocols\r\n" {
		t.Fatalf("status line %q, want HTTP/1.1 101 Switching Protocols", line)
	}
	for {
		l, err := br.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		if l == "\r\n" {
			break
		}
	}
	// What the sandbox sent with its 101 follows, untouched.
	got := make([]byte, len("first frame"))
	if _, err := io.ReadFull(br, got); err != nil || string(got) != "first frame" {
		t.Fatalf("after the head: %q, %v", got, err)
	}
}
