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
			_ = c.SetDeadline(time.Now().Add(10 * time.Second))
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
			_ = c.SetDeadline(time.Now().Add(10 * time.Second))
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

// hungUp is a hangUpper that tells a channel.
type hungUp chan struct{}

func (c hungUp) hangUp() net.Conn { close(c); return nil }

// A watch on a connection that was watched before is one epoll_ctl (MOD),
// not an EEXIST ADD and then a MOD; a descriptor that was closed and then
// reused by a new connection is added again. Every watch still hears its
// client's hang-up.
func TestHangupWatchCtlCalls(t *testing.T) {
	h, err := newHangups()
	if err != nil {
		t.Fatal(err)
	}
	go h.run()
	t.Cleanup(h.close)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	pair := func() (net.Conn, net.Conn) { return acceptPair(t, ln) }
	fdOf := func(c net.Conn) uintptr {
		var fd uintptr
		if err := rawConn(c).Control(func(f uintptr) { fd = f }); err != nil {
			t.Fatal(err)
		}
		return fd
	}
	// watch watches s and returns the epoll_ctl calls it took.
	watch := func(s net.Conn, hu hungUp) (uint64, int) {
		t.Helper()
		h.mu.Lock()
		before := h.ctls
		h.mu.Unlock()
		key := h.watch(s, hu)
		if key == 0 {
			t.Fatal("watch failed")
		}
		h.mu.Lock()
		defer h.mu.Unlock()
		return key, h.ctls - before
	}
	heard := func(hu hungUp) {
		t.Helper()
		select {
		case <-hu:
		case <-time.After(5 * time.Second):
			t.Fatal("hang-up not told")
		}
	}

	s, c := pair()
	if _, n := watch(s, make(hungUp)); n != 1 {
		t.Errorf("first watch took %d epoll_ctl calls, want 1 (ADD)", n)
	}
	for i := range 3 { // later streams on the same keep-alive connection
		key, n := watch(s, make(hungUp))
		if n != 1 {
			t.Errorf("watch %d on a connection watched before took %d epoll_ctl calls, want 1 (MOD)", i+2, n)
		}
		h.unwatch(key)
	}
	hu := make(hungUp)
	watch(s, hu)
	c.Close()
	heard(hu)

	// A descriptor whose bit outlived it: closed (which takes it out of the
	// set) and reused by a new connection, which must be added again.
	s2, c2 := pair()
	h.mu.Lock()
	h.markAdded(fdOf(s2))
	h.mu.Unlock()
	hu2 := make(hungUp)
	if _, n := watch(s2, hu2); n != 2 {
		t.Errorf("watch on a reused descriptor took %d epoll_ctl calls, want 2 (MOD, then ADD)", n)
	}
	c2.Close()
	heard(hu2)
}

// A sized answer small enough to be read whole (up to wholeBody) goes out
// once all of it came. A client that leaves while its sandbox is slow to
// send that body (the head is there, the body is not) ends the request, as
// one that leaves before the head does, and as nginx ends it on
// EPOLLRDHUP: before, the sandbox's connection and the request's
// max_streams_per_sandbox slot were held until the body came, or until
// upstream.idle_timeout (2 h) for a sandbox that stalled.
func TestClientGoneWhileSmallBodyIsReadEndsRequest(t *testing.T) {
	h := newHarness(t)
	ended := make(chan struct{})
	port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer close(ended)
		w.Header().Set("Content-Length", "100")
		fmt.Fprint(w, "first\n")
		w.(http.Flusher).Flush()
		<-r.Context().Done() // the other 94 bytes never come
	}))
	id := "slowsmall"
	host := h.route(id, port)
	c := dialRaw(t, h.addr)
	fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: %s\r\n\r\n", host)
	testenv.WaitFor(t, 10*time.Second, "the client watched while the body is awaited", func() bool {
		return watchedHangups(h.proxy.hangups) == 1
	})
	hangUpAndWait(t, h, c, false, ended)
	testenv.WaitFor(t, 5*time.Second, "the sandbox's request count to drop", func() bool {
		return h.proxy.sandboxes.peek(id).inFlight() == 0
	})
}

// The hang-up watch must not shut the sandbox sockets of the streams whose
// clients left under its lock, which every new stream's watch and every
// stream's end take: a mass hang-up of 9,000 SSE clients held it 0.25-0.47 s
// in all (up to 43 ms at a time) on the built binary, closing 64 sockets at
// a time. Closing one also waits for every other holder of the socket to
// let go of it: the test holds a reference to the stream's sandbox socket,
// as a read about to run does, and the stream must still end, its watch
// given up, while it is held.
func TestHangUpShutsSocketsOutsideWatchLock(t *testing.T) {
	h := newHarness(t)
	_, conns := heldStreams(t, h, "hupheld", 1)
	testenv.WaitFor(t, 5*time.Second, "the stream to be watched for its client's hang-up", func() bool {
		open, _ := h.proxy.streams.open()
		return open == 1 && h.proxy.readersOut.Load() == 0 && watchedHangups(h.proxy.hangups) == 1
	})

	holdStreamSocket(h)
	_ = conns[0].Close()
	// Not watchedHangups: it takes the lock. Nor streams.open: the
	// stream is counted open until its line is logged, after the close of
	// that socket, which waits for the test to let go of it.
	testenv.WaitFor(t, 5*time.Second, "the stream whose client left to end while its socket is held", func() bool {
		r := &h.proxy.streams
		r.mu.Lock()
		defer r.mu.Unlock()
		return r.head == nil
	})
}
