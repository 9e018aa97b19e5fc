package proxy

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// watchedHangups is how many clients h watches for a hang-up.
func watchedHangups(h *hangups) int {
	if h == nil {
		return 0
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.watched)
}

// hangupWatchesMade is how many watches h has registered so far.
func hangupWatchesMade(h *hangups) uint64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.seq
}

// A streamed answer that ends within clientCheck is never put on the
// hang-up watch, which costs epoll_ctl calls and allocations: most chunked
// answers (a Go handler that flushed, a Node res.write) are short. An
// event stream is watched from its start.
func TestShortStreamsSkipHangupWatch(t *testing.T) {
	const requests = 20
	for _, tc := range []struct {
		ctype   string
		watched bool
	}{
		{"application/json", false},
		{"text/event-stream", true},
	} {
		t.Run(tc.ctype, func(t *testing.T) {
			h := newHarness(t)
			port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", tc.ctype)
				fmt.Fprint(w, "data: one\n\n")
				w.(http.Flusher).Flush() // chunked: no Content-Length
				fmt.Fprint(w, "data: two\n\n")
			}))
			host := h.route("short", port)
			before := hangupWatchesMade(h.proxy.hangups)
			for range requests {
				if code, body, hdr := h.get(host, "/"); code != 200 || body != "data: one\n\ndata: two\n\n" || hdr.Get("Content-Length") != "" {
					t.Fatalf("got %d %q (Content-Length %q), want 200 with both parts, streamed", code, body, hdr.Get("Content-Length"))
				}
			}
			made := hangupWatchesMade(h.proxy.hangups) - before
			// A loaded machine may stall one answer past clientCheck; the
			// eager watch would make one per request.
			if got := made >= requests/2; got != tc.watched {
				t.Fatalf("%d of %d short streams were watched; want watched=%v", made, requests, tc.watched)
			}
		})
	}
}

// A streamed answer that outlasts clientCheck is put on the watch and goes
// on to its end, whatever the client: the check must not end it. An
// HTTP/1.0 client's chunked answer is detached (its wait is waitReadable's,
// not Read's), and was reset at the check until waitReadable knew it. The
// sandbox sends the rest only once the watch is in place.
func TestLongStreamOutlivesClientCheck(t *testing.T) {
	for _, tc := range []struct {
		name, proto string
		sized       bool
	}{
		{"HTTP/1.0 chunked", "HTTP/1.0", false},
		{"HTTP/1.1 chunked", "HTTP/1.1", false},
		{"HTTP/1.1 sized", "HTTP/1.1", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			watched := make(chan struct{})
			tail := bytes.Repeat([]byte("y"), wholeBody+1) // a sized body past what is read whole
			port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "text/plain")
				if tc.sized {
					w.Header().Set("Content-Length", strconv.Itoa(len("first\n")+len(tail)))
				}
				fmt.Fprint(w, "first\n")
				w.(http.Flusher).Flush()
				select {
				case <-watched:
				case <-r.Context().Done():
					return
				}
				w.Write(tail)
			}))
			host := h.route("long", port)
			before := hangupWatchesMade(h.proxy.hangups)
			c, err := net.Dial("tcp", h.addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			fmt.Fprintf(c, "GET / %s\r\nHost: %s\r\n\r\n", tc.proto, host)
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Fatal(err)
			}
			body := bufio.NewReader(resp.Body)
			if line, _ := body.ReadString('\n'); line != "first\n" {
				t.Fatalf("first line %q", line)
			}
			testenv.WaitFor(t, 10*time.Second, "the client put on the hang-up watch", func() bool {
				return hangupWatchesMade(h.proxy.hangups) > before
			})
			close(watched)
			rest, err := io.ReadAll(body)
			if err != nil || !bytes.Equal(rest, tail) {
				t.Fatalf("rest of the body: %d bytes, %v; want %d bytes and its end", len(rest), err, len(tail))
			}
		})
	}
}

// Where a client cannot be watched (other systems; here the watch is
// closed), the client check looks at its socket every clientCheck instead:
// a client that hangs up while the answer's head is awaited, or during a
// silent body that is not an event stream, still ends the sandbox's request.
func TestClientCheckWithoutWatch(t *testing.T) {
	for _, tc := range []struct {
		name string
		body bool // the sandbox sends a first line, then falls silent
	}{
		{"head awaited", false},
		{"silent body", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			h.proxy.hangups.close() // nothing was watched yet: every watch now fails
			ended := make(chan struct{})
			port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				defer close(ended)
				if tc.body {
					w.Header().Set("Content-Type", "text/plain")
					fmt.Fprint(w, "first\n")
					w.(http.Flusher).Flush()
				}
				<-r.Context().Done()
			}))
			host := h.route("unwatched", port)
			c, err := net.Dial("tcp", h.addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: %s\r\n\r\n", host)
			if tc.body {
				resp, err := http.ReadResponse(bufio.NewReader(c), nil)
				if err != nil {
					t.Fatal(err)
				}
				if line, _ := bufio.NewReader(resp.Body).ReadString('\n'); line != "first\n" {
					t.Fatalf("first line %q", line)
				}
			}
			hangUpAndWait(t, h, c, false, ended)
			if n := hangupWatchesMade(h.proxy.hangups); n != 0 {
				t.Fatalf("%d watches made; the test meant none", n)
			}
		})
	}
}
