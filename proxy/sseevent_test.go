package proxy

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// A heartbeat is written only between events, whichever way the stream
// leaves the proxy: a GET's event stream (detached), a POST's (an MCP
// call's answer, on fasthttp's writer), and either of them to an HTTP/1.0
// client (detached, unframed). The sandbox sends an event of 4 MiB in
// 64 KiB pieces, which the client reads a kilobyte at a time, and holds it
// open, its blank line unsent, until the client has all of its bytes:
// heartbeats are due many times over meanwhile (10 ms), and one written
// into the event would join its data line. The client must have seen a
// heartbeat before the event, so they are not off.
func TestHeartbeatNeverSplitsALargeEvent(t *testing.T) {
	h := newHarness(t, func(o *harnessOpts) { o.cfg.HeartbeatInterval = 10 * time.Millisecond })
	const size = 4 << 20
	ack := make(chan struct{})
	wait := func(r *http.Request) bool {
		select {
		case <-ack:
			return true
		case <-r.Context().Done():
			return false
		}
	}
	port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f := sseHeaders(w)
		fmt.Fprint(w, "data: a\n\n")
		f.Flush()
		if !wait(r) {
			return
		}
		fmt.Fprint(w, "id: 2\ndata: ")
		piece := bytes.Repeat([]byte("x"), 64<<10)
		for i := 0; i < size/len(piece); i++ {
			w.Write(piece)
			f.Flush()
		}
		if !wait(r) {
			return
		}
		fmt.Fprint(w, "\n\ndata: b\n\n")
		f.Flush()
		wait(r)
	}))
	host := h.route("bigevent", port)
	for _, tc := range []struct {
		method string
		http10 bool
	}{{"GET", false}, {"POST", false}, {"GET", true}, {"POST", true}} {
		t.Run(fmt.Sprintf("%s http10=%v", tc.method, tc.http10), func(t *testing.T) {
			var body io.ReadCloser
			if tc.http10 {
				c, err := net.Dial("tcp", h.addr)
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				_ = c.SetDeadline(time.Now().Add(30 * time.Second))
				fmt.Fprintf(c, "%s /sse HTTP/1.0\r\nHost: %s\r\nContent-Length: 0\r\n\r\n", tc.method, host)
				resp, err := http.ReadResponse(bufio.NewReader(c), nil)
				if err != nil {
					t.Fatal(err)
				}
				body = resp.Body
			} else {
				resp := h.do(h.req(tc.method, host, "/sse", http.NoBody))
				body = resp.Body
			}
			defer body.Close()
			br := bufio.NewReaderSize(body, 4096)
			if ev, err := readEvent(br); ev != "data: a\n" {
				t.Fatalf("first event %q %v", ev, err)
			}
			for {
				ev, err := readEvent(br)
				if err != nil {
					t.Fatal(err)
				}
				if ev == ": keep-alive\n" {
					break
				}
			}
			testenv.Send(t, ack, struct{}{}, 10*time.Second, "the sandbox to take the ack of the heartbeat")
			for {
				line, err := br.ReadString('\n')
				if err != nil {
					t.Fatal(err)
				}
				if line == "id: 2\n" {
					break
				}
				if line != ": keep-alive\n" && line != "\n" {
					t.Fatalf("event 2 begins %q", line)
				}
			}
			// The rest of the event, a kilobyte at a time.
			var got []byte
			buf := make([]byte, 1024)
			for bytes.Count(got, []byte("x")) < size {
				n, err := br.Read(buf)
				got = append(got, buf[:n]...)
				if err != nil {
					t.Fatal(err)
				}
			}
			testenv.Send(t, ack, struct{}{}, 10*time.Second, "the sandbox to take the ack of the big event")
			rest, err := br.ReadString('b')
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, rest...)
			want := "data: " + string(bytes.Repeat([]byte("x"), size)) + "\n\ndata: b"
			if string(got) != want {
				i := 0
				for i < len(got) && i < len(want) && got[i] == want[i] {
					i++
				}
				t.Fatalf("event 2 differs at byte %d: %q", i, got[i:min(len(got), i+40)])
			}
			testenv.Send(t, ack, struct{}{}, 10*time.Second, "the sandbox to take the last ack")
		})
	}
}
