package proxy

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// A gateway whose event stream has no framing of its own (an HTTP/1.0
// server, or one that answers "Connection: close" without chunked: the
// body ends with the connection) and whose process dies in the middle of
// an event. Its close is all the proxy sees, and passed on as the
// stream's clean end (the last chunk), it had the client take the cut
// event's first lines for a whole event: the go-sdk dispatches what it
// holds at a clean end, so a cut notification failed the whole session
// ("failed to decode event"), where a cut stream makes it resume with
// Last-Event-ID. A stream cut inside an event must reach the client as
// cut, as the proxy's own drain ends one (drainEndsCleanly); one that ends
// between events, or a compressed one (its own trailer tells a cut), stays
// clean, as does one whose gateway frames it (chunked) and ends it inside
// an event: its framing tells its end. Comment lines hold nothing of an
// event: a stream that ends on one (": ping\n", no blank line) ended
// cleanly, where earlier builds took it for a cut (the client saw an error
// and the log upstream_reset). The first event arrives while the gateway still holds the stream
// (it waits for the client's acknowledgement before it sends the rest).
func TestCloseDelimitedEventStreamCutMidEvent(t *testing.T) {
	const first = "id: 1\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/message\"}\n\n"
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	io.WriteString(zw, "id: 2\ndata: x\n")
	zw.Flush() // the first line can be inflated from what came so far
	flushed := gz.Len()
	zw.Close()
	for _, tc := range []struct {
		name, method, encoding, tail string
		cut                          bool
		http10                       bool   // the client's request is HTTP/1.0: its body ends with the connection
		framing                      string // the gateway's: "chunked", "chunked, no last chunk", "chunked, last chunk's line only"; none: the close
	}{
		{"GET mid-data", "GET", "", "id: 2\ndata: {\"jsonrpc\":\"2.0\",\"met", true, false, ""},
		{"GET after a field", "GET", "", "id: 2\ndata: x\n", true, false, ""},
		{"GET after a CR", "GET", "", "id: 2\r\ndata: x\r", true, false, ""},
		{"POST mid-data", "POST", "", "id: 2\ndata: {\"jsonrpc\":\"2.0\",\"res", true, false, ""},
		{"GET between events", "GET", "", "id: 2\ndata: x\n\n", false, false, ""},
		{"GET after the first event", "GET", "", "", false, false, ""},
		{"POST between events", "POST", "", "data: x\r\n\r\n", false, false, ""},
		{"GET gzip", "GET", "gzip", "", false, false, ""},
		{"POST gzip", "POST", "gzip", "", false, false, ""},
		{"HTTP/1.0 GET mid-data", "GET", "", "id: 2\ndata: {\"jsonrpc\"", true, true, ""},
		{"HTTP/1.0 GET between events", "GET", "", "id: 2\ndata: x\n\n", false, true, ""},
		{"chunked, ended inside an event", "GET", "", "id: 2\ndata: x\n", false, false, "chunked"},
		// A comment line holds nothing of an event: a stream that ends
		// after one, its blank line not sent, has no event half received
		// (a gateway's ": ping\n" keep-alive, then its close).
		{"GET after a comment line", "GET", "", ": ping\n", false, false, ""},
		{"POST after a comment line", "POST", "", ": ping\r\n", false, false, ""},
		{"GET after comment lines, CR", "GET", "", ": ping\r: pong\r", false, false, ""},
		{"GET after an event and a comment", "GET", "", "id: 2\ndata: x\n\n: ping\n", false, false, ""},
		{"GET after a comment and its blank line", "GET", "", ": ping\r\n\r\n", false, false, ""},
		{"HTTP/1.0 GET after a comment line", "GET", "", ": ping\n", false, true, ""},
		// But one behind an event's field, or a comment cut mid-line, is.
		{"GET after a field and a comment", "GET", "", "data: x\n: ping\n", true, false, ""},
		{"GET after a comment and a field", "GET", "", ": ping\ndata: x\n", true, false, ""},
		{"GET mid-comment", "GET", "", ": pi", true, false, ""},
		// A retry line is a field like any other: the blank line ends it.
		{"GET after a retry line", "GET", "", "retry: 1000\n", true, false, ""},
		{"GET after a retry event", "GET", "", "retry: 1000\n\n", false, false, ""},
		// A chunked stream the gateway closes without its last chunk is cut,
		// between events too: its framing, not the events, tells its end.
		{"chunked, closed without its last chunk", "GET", "", "id: 2\ndata: x\n\n", true, false, "chunked, no last chunk"},
		{"chunked POST, closed without its last chunk", "POST", "", ": ping\n\n", true, false, "chunked, no last chunk"},
		{"HTTP/1.0 GET, chunked, closed without its last chunk", "GET", "", "data: x\n\n", true, true, "chunked, no last chunk"},
		// Its last chunk's line without the blank line that ends the body:
		// cut too, as nginx takes it (the upstream closed prematurely).
		{"chunked, closed inside its last chunk", "GET", "", "data: x\n\n", true, false, "chunked, last chunk's line only"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			ln := listen(t, "127.0.0.1:0")
			defer ln.Close()
			ack := make(chan struct{})
			gatewayDone := make(chan error, 1)
			go func() {
				c, err := ln.Accept()
				if err != nil {
					gatewayDone <- err
					return
				}
				defer c.Close()
				req, err := http.ReadRequest(bufio.NewReader(c))
				if err != nil {
					gatewayDone <- err
					return
				}
				// All of it: a close with unread bytes would be a reset.
				if _, err := io.Copy(io.Discard, req.Body); err != nil {
					gatewayDone <- err
					return
				}
				head := "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n"
				body, tail := first, tc.tail
				if tc.encoding != "" {
					head += "Content-Encoding: " + tc.encoding + "\r\n"
					// Flushed data first, then the member's end: the
					// inflated text ends inside an event, but the
					// compressed stream is whole.
					body, tail = gz.String()[:flushed], gz.String()[flushed:]
				}
				switch tc.framing {
				case "chunked":
					head = strings.Replace(head, "Connection: close", "Transfer-Encoding: chunked", 1)
					body = fmt.Sprintf("%x\r\n%s\r\n", len(body), body)
					tail = fmt.Sprintf("%x\r\n%s\r\n0\r\n\r\n", len(tail), tail)
				case "chunked, last chunk's line only":
					head = strings.Replace(head, "Connection: close", "Transfer-Encoding: chunked", 1)
					body = fmt.Sprintf("%x\r\n%s\r\n", len(body), body)
					tail = fmt.Sprintf("%x\r\n%s\r\n0\r\n", len(tail), tail)
				case "chunked, no last chunk":
					head = strings.Replace(head, "Connection: close", "Transfer-Encoding: chunked", 1)
					body = fmt.Sprintf("%x\r\n%s\r\n", len(body), body)
					tail = fmt.Sprintf("%x\r\n%s\r\n", len(tail), tail)
				}
				if _, err := io.WriteString(c, head+"\r\n"+body); err != nil {
					gatewayDone <- err
					return
				}
				select {
				case <-ack:
				case <-time.After(10 * time.Second):
					gatewayDone <- errors.New("no acknowledgement of the first event: the proxy held it back")
					return
				}
				_, err = io.WriteString(c, tail)
				gatewayDone <- err
			}()
			host := h.route("ssecut", uint16(ln.Addr().(*net.TCPAddr).Port))
			ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
			defer cancel()
			var reqBody io.Reader
			if tc.method == "POST" {
				reqBody = strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"tools/call"}`)
			}
			var resp *http.Response
			if tc.http10 {
				c := dialRaw(t, h.addr)
				io.WriteString(c, "GET /mcp HTTP/1.0\r\nHost: "+host+"\r\n\r\n")
				var err error
				if resp, err = http.ReadResponse(bufio.NewReader(c), nil); err != nil {
					t.Fatalf("head: %v", err)
				}
			} else {
				resp = h.do(h.req(tc.method, host, "/mcp", reqBody).WithContext(ctx))
			}
			defer resp.Body.Close()
			var body io.Reader = resp.Body
			if tc.encoding != "" {
				zr, err := gzip.NewReader(body)
				if err != nil {
					t.Fatalf("gzip header: %v", err)
				}
				body = zr
			}
			br := bufio.NewReader(body)
			if tc.encoding == "" {
				if ev, err := readEvent(br); err != nil || ev+"\n" != first {
					t.Fatalf("first event %q, %v", ev, err)
				}
			} else if line, err := br.ReadString('\n'); err != nil || line != "id: 2\n" {
				t.Fatalf("first line %q, %v", line, err)
			}
			testenv.Send(t, ack, struct{}{}, 10*time.Second, "the acknowledgement of the first event")
			if err := testenv.Recv(t, gatewayDone, 10*time.Second, "the gateway's end"); err != nil {
				t.Fatalf("gateway: %v", err)
			}
			rest, err := io.ReadAll(br)
			switch {
			case tc.cut && err == nil:
				t.Fatalf("a stream cut inside an event ended cleanly behind %q: the client takes the cut event for whole", rest)
			case !tc.cut && err != nil:
				t.Fatalf("a stream that ended between events ended as cut: %v (after %q)", err, rest)
			}
		})
	}
}

// The drain ends a GET's event stream cleanly only between events (the
// client reconnects elsewhere), and as cut inside one (drainEndsCleanly).
// A stream whose last bytes are a comment line (": ping\n", no blank line)
// has no event half sent: it ends cleanly, where earlier builds cut it, so
// the client saw an error and the log drain_timeout.
func TestDrainEndsStreamAfterCommentLineCleanly(t *testing.T) {
	for _, tc := range []struct {
		sent string
		cut  bool
	}{
		{"data: a\n\n: ping\n", false},
		{": ping\r\n", false},
		{"data: a\n\n", false},
		{"data: a\n\ndata: b\n", true},
		{"data: a\n\n: ping\ndata: b\n", true},
	} {
		t.Run(fmt.Sprintf("%q", tc.sent), func(t *testing.T) {
			const drain = 3 * time.Second
			h := newHarness(t, func(o *harnessOpts) { o.srv.DrainTimeout = drain })
			port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				f := sseHeaders(w)
				io.WriteString(w, tc.sent)
				f.Flush()
				<-r.Context().Done()
			}))
			host := h.route("draincomment", port)
			resp := h.do(h.req("GET", host, "/", nil))
			defer resp.Body.Close()
			got := make([]byte, len(tc.sent))
			if _, err := io.ReadFull(resp.Body, got); err != nil || string(got) != tc.sent {
				t.Fatalf("before the drain: %q, %v", got, err)
			}
			shutdownDone := make(chan error, 1)
			go func() { shutdownDone <- h.server.Shutdown(context.Background()) }()
			ended := make(chan error, 1)
			go func() {
				_, err := io.ReadAll(resp.Body)
				ended <- err
			}()
			err := testenv.Recv(t, ended, drain+5*time.Second, "the stream's end at the drain")
			switch {
			case tc.cut && err == nil:
				t.Fatalf("the drain ended a stream inside an event cleanly")
			case !tc.cut && err != nil:
				t.Fatalf("the drain cut a stream between events: %v", err)
			}
			drainEnds(t, shutdownDone, drain+10*time.Second, "the drain outlived its deadline")
		})
	}
}
