package proxy

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// readUntilEvent reads events (heartbeats among them) until want, and
// fails the test if the stream ends first.
func readUntilEvent(t *testing.T, br *bufio.Reader, want, what string) {
	t.Helper()
	for {
		ev, err := readEvent(br)
		if err != nil {
			t.Fatalf("stream ended before %s: %v", what, err)
		}
		if ev == want {
			return
		}
	}
}

// readEvent reads one SSE event: its lines up to a blank line, comment
// lines included (it skips nothing).
func readEvent(br *bufio.Reader) (string, error) {
	var b strings.Builder
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			return b.String(), err
		}
		if line == "\n" {
			return b.String(), nil
		}
		b.WriteString(line)
	}
}

func sseHeaders(w http.ResponseWriter) http.Flusher {
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(200)
	f := w.(http.Flusher)
	f.Flush()
	return f
}

// The backend writes event i and then waits until the client has received
// event i through the proxy. Any buffering in the proxy deadlocks this and
// the test fails on its deadline.
func TestSSEEventArrivesWhileBackendHoldsStream(t *testing.T) {
	h := newHarness(t)
	const n = 20
	ack := make(chan int)
	backendErr := make(chan error, 1)
	port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f := sseHeaders(w)
		for i := 1; i <= n; i++ {
			fmt.Fprintf(w, "id: %d\ndata: event %d\n\n", i, i)
			f.Flush()
			select {
			case got := <-ack:
				if got != i {
					backendErr <- fmt.Errorf("ack %d for event %d", got, i)
					return
				}
			case <-time.After(10 * time.Second):
				backendErr <- fmt.Errorf("no ack for event %d: the proxy held it back", i)
				return
			}
		}
		backendErr <- nil
	}))
	host := h.route("sse1", port)

	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	resp := h.do(h.req("GET", host, "/events", nil).WithContext(ctx))
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("content-type %q", ct)
	}
	br := bufio.NewReader(resp.Body)
	for i := 1; i <= n; i++ {
		ev, err := readEvent(br)
		if err != nil {
			t.Fatalf("event %d: %v", i, err)
		}
		if want := fmt.Sprintf("id: %d\ndata: event %d\n", i, i); ev != want {
			t.Fatalf("event %d = %q, want %q", i, ev, want)
		}
		select {
		case ack <- i:
		case err := <-backendErr:
			t.Fatalf("the backend stopped before event %d's ack: %v", i, err)
		case <-time.After(10 * time.Second):
			t.Fatalf("the backend never took event %d's ack", i)
		}
	}
	if err := <-backendErr; err != nil {
		t.Fatal(err)
	}
}

func TestSSEManyConcurrentStreams(t *testing.T) {
	h := newHarness(t)
	const streams, events = 200, 200
	port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f := sseHeaders(w)
		for i := 0; i < events; i++ {
			fmt.Fprintf(w, "data: %d\n\n", i)
			f.Flush()
		}
	}))
	host := h.route("many", port)
	var wg sync.WaitGroup
	errs := make(chan error, streams)
	for s := 0; s < streams; s++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := h.client.Do(h.req("GET", host, "/", nil))
			if err != nil {
				errs <- err
				return
			}
			defer resp.Body.Close()
			if resp.StatusCode != 200 {
				b, _ := io.ReadAll(resp.Body)
				errs <- fmt.Errorf("status %d %s %q", resp.StatusCode, resp.Header, b)
				return
			}
			br := bufio.NewReader(resp.Body)
			for i := 0; i < events; i++ {
				ev, err := readEvent(br)
				if err != nil {
					errs <- fmt.Errorf("event %d: %w (%s)", i, err, resp.Header)
					return
				}
				if ev != fmt.Sprintf("data: %d\n", i) {
					errs <- fmt.Errorf("event %d out of order: %q", i, ev)
					return
				}
			}
			if _, err := br.ReadByte(); err != io.EOF {
				errs <- fmt.Errorf("stream did not end cleanly: %v", err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// A silent SSE stream gets a heartbeat comment, only at an event boundary.
func TestSSEHeartbeatAtEventBoundary(t *testing.T) {
	h := newHarness(t, func(o *harnessOpts) { o.cfg.HeartbeatInterval = 100 * time.Millisecond })
	sawHeartbeat := make(chan struct{})
	port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f := sseHeaders(w)
		fmt.Fprint(w, "data: a\n\n")
		f.Flush()
		<-sawHeartbeat
		// Half an event, then silence longer than the heartbeat interval:
		// no comment may be inserted inside it.
		fmt.Fprint(w, "data: b")
		f.Flush()
		time.Sleep(350 * time.Millisecond)
		fmt.Fprint(w, "\n\n")
	}))
	host := h.route("hb", port)
	resp := h.do(h.req("GET", host, "/", nil))
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	if ev, _ := readEvent(br); ev != "data: a\n" {
		t.Fatalf("first event %q", ev)
	}
	if ev, _ := readEvent(br); ev != ": keep-alive\n" {
		t.Fatalf("want heartbeat comment, got %q", ev)
	}
	close(sawHeartbeat)
	ev, err := readEvent(br)
	for err == nil && ev == ": keep-alive\n" {
		ev, err = readEvent(br) // heartbeats before the half event are fine
	}
	if ev != "data: b\n" {
		t.Fatalf("event b arrived as %q (err %v): a heartbeat split it", ev, err)
	}
}

// A stream whose sandbox sent a comment line (": connected\n", no blank
// line) and then fell silent is between events: it gets heartbeats, where
// earlier builds waited for a blank line that never came and sent none, so
// a middlebox's idle timeout ended it. GET streams (detached) and POST ones
// (fasthttp's loop) arm the heartbeat in different places; both are
// checked, and neither gets one after a field line.
func TestSSEHeartbeatAfterCommentLine(t *testing.T) {
	for _, tc := range []struct {
		method, first string
		beat          bool
	}{
		{"GET", ": connected\n", true},
		{"POST", ": connected\r\n", true},
		{"GET", "data: a\n\n: connected\r", true},
		{"GET", ": connected\ndata: a\n", false},
	} {
		t.Run(fmt.Sprintf("%s %q", tc.method, tc.first), func(t *testing.T) {
			h := newHarness(t, func(o *harnessOpts) { o.cfg.HeartbeatInterval = 100 * time.Millisecond })
			done := make(chan struct{})
			port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				f := sseHeaders(w)
				io.WriteString(w, tc.first)
				f.Flush()
				select {
				case <-done:
				case <-time.After(10 * time.Second):
				}
				io.WriteString(w, "\ndata: end\n\n")
			}))
			host := h.route("hbcomment", port)
			resp := h.do(h.req(tc.method, host, "/", strings.NewReader("{}")))
			defer resp.Body.Close()
			c := make(chan string, 1)
			go func() {
				var got strings.Builder
				br := bufio.NewReader(resp.Body)
				for !strings.Contains(got.String(), ": keep-alive\n") && !strings.Contains(got.String(), "data: end\n") {
					line, err := br.ReadString('\n')
					got.WriteString(line)
					if err != nil {
						break
					}
				}
				c <- got.String()
			}()
			if !tc.beat {
				// 5 heartbeat intervals with the half event held: none may
				// come, then the sandbox ends the event.
				time.Sleep(500 * time.Millisecond)
				close(done)
				got := testenv.Recv(t, c, 15*time.Second, "the stream's bytes")
				if strings.Contains(got, "keep-alive") {
					t.Fatalf("a heartbeat inside an event: %q", got)
				}
				return
			}
			got := testenv.Recv(t, c, 15*time.Second, "a heartbeat (the sandbox holds the stream 10 s)")
			close(done)
			if !strings.HasSuffix(got, ": keep-alive\n") || strings.Contains(got, "data: end") {
				t.Fatalf("no heartbeat after the comment line before the sandbox spoke again: %q", got)
			}
		})
	}
}

// A head that comes with only the size line of its first chunk goes out
// at once: the sandbox writes the chunk's data only once the client has
// acknowledged the head, so a head held back for that data deadlocks the
// exchange and the test fails on its deadline. GET event streams (detached,
// whose head the hijack writes) and every other stream (fasthttp's
// writer) are both checked, and so is a head that came with the last
// chunk's line but not the blank line that ends the body.
func TestHeadNotHeldForChunkFraming(t *testing.T) {
	for _, tc := range []struct {
		name, method, ctype, withHead, rest, want string
	}{
		{"event stream GET", "GET", "text/event-stream", "b\r\n", "data: one\n\n\r\n0\r\n\r\n", "data: one\n\n"},
		{"event stream POST", "POST", "text/event-stream", "b\r\n", "data: one\n\n\r\n0\r\n\r\n", "data: one\n\n"},
		{"chunked GET", "GET", "text/plain", "5\r\n", "hello\r\n0\r\n\r\n", "hello"},
		{"last chunk without its end", "GET", "text/plain", "0\r\n", "\r\n", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t) // heartbeats every 30 s: none during the test
			ln := listen(t, "127.0.0.1:0")
			t.Cleanup(func() { ln.Close() })
			ack := make(chan struct{})
			sandboxErr := make(chan error, 1)
			go func() {
				c, err := ln.Accept()
				if err != nil {
					sandboxErr <- err
					return
				}
				defer c.Close()
				if _, err := http.ReadRequest(bufio.NewReader(c)); err != nil {
					sandboxErr <- err
					return
				}
				io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: "+tc.ctype+"\r\nTransfer-Encoding: chunked\r\n\r\n"+tc.withHead)
				select {
				case <-ack:
				case <-time.After(5 * time.Second):
					sandboxErr <- errors.New("the client never got the head: the proxy held it back")
					return
				}
				io.WriteString(c, tc.rest)
				sandboxErr <- nil
				io.Copy(io.Discard, c)
			}()
			host := h.route("headframing", uint16(ln.Addr().(*net.TCPAddr).Port))
			c := dialRaw(t, h.addr)
			body := ""
			if tc.method == "POST" {
				body = "Content-Length: 2\r\n\r\n{}"
			} else {
				body = "\r\n"
			}
			fmt.Fprintf(c, "%s / HTTP/1.1\r\nHost: %s\r\n%s", tc.method, host, body)
			resp, err := http.ReadResponse(bufio.NewReader(c), &http.Request{Method: tc.method})
			if err != nil {
				t.Fatalf("head: %v", err)
			}
			close(ack)
			if err := testenv.Recv(t, sandboxErr, 10*time.Second, "the sandbox's rest of the answer (did the proxy connect to it?)"); err != nil {
				t.Fatal(err)
			}
			got, err := io.ReadAll(resp.Body)
			if err != nil || string(got) != tc.want {
				t.Fatalf("body %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

// An event stream may open with a UTF-8 BOM, which a client strips only at
// the very start of the stream. When the proxy's heartbeat went first, the
// BOM would open the sandbox's first line instead ("\uFEFFdata: a", a field
// no client knows) and its first event would be lost: the proxy drops it.
// GET streams (detached) and POST ones (fasthttp's loop) write heartbeats
// in different places; both are checked. A BOM that comes in pieces (a
// chunk of its own, cut in the middle) is dropped too: the proxy looked
// for it only in its first read, and the first event was lost; bytes that
// begin a BOM and turn out not to be one are passed on whole.
func TestSSEBOMAfterHeartbeat(t *testing.T) {
	for _, tc := range []struct {
		method string
		pieces []string
		want   []sseEvent
	}{
		{"GET", []string{"\uFEFFdata: a\n\ndata: b\n\n"}, []sseEvent{{data: "a"}, {data: "b"}}},
		{"POST", []string{"\uFEFFdata: a\n\ndata: b\n\n"}, []sseEvent{{data: "a"}, {data: "b"}}},
		{"GET", []string{"\xEF", "\xBB", "\xBFdata: a\n\ndata: b\n\n"}, []sseEvent{{data: "a"}, {data: "b"}}},
		{"POST", []string{"\xEF\xBB", "\xBFdata: a\n\ndata: b\n\n"}, []sseEvent{{data: "a"}, {data: "b"}}},
		{"GET", []string{"\xEF\xBB", "data: a\n\ndata: b\n\n"}, []sseEvent{{data: "b"}}},
	} {
		method := tc.method
		t.Run(fmt.Sprintf("%s %q", method, tc.pieces), func(t *testing.T) {
			h := newHarness(t, func(o *harnessOpts) { o.cfg.HeartbeatInterval = 50 * time.Millisecond })
			sawHeartbeat := make(chan struct{})
			port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				f := sseHeaders(w)
				select {
				case <-sawHeartbeat:
				case <-r.Context().Done():
					return
				}
				for i, p := range tc.pieces {
					if i > 0 {
						time.Sleep(20 * time.Millisecond) // pacing: each piece a read of its own
					}
					fmt.Fprint(w, p)
					f.Flush()
				}
			}))
			resp := h.do(h.req(method, h.route("bom", port), "/", nil))
			defer resp.Body.Close()
			br := bufio.NewReader(resp.Body)
			if ev, err := readEvent(br); ev != ": keep-alive\n" {
				t.Fatalf("want a heartbeat first, got %q (%v)", ev, err)
			}
			close(sawHeartbeat)
			var stream strings.Builder
			stream.WriteString(": keep-alive\n\n")
			for !strings.Contains(stream.String(), "data: b\n\n") {
				ev, err := readEvent(br)
				if err != nil {
					t.Fatalf("stream ended: %v after %q", err, stream.String())
				}
				stream.WriteString(ev + "\n")
			}
			if got := sseEvents([]byte(stream.String())); !slices.Equal(got, tc.want) {
				t.Fatalf("a client reads %q as %q, want %q", stream.String(), got, tc.want)
			}
		})
	}
}

// When the client goes away, the backend's connection is closed within a
// second, for a busy stream and for a silent one (noticed via heartbeat).
func TestClientDisconnectClosesUpstream(t *testing.T) {
	for _, tc := range []struct {
		name   string
		silent bool
	}{{"busy", false}, {"silent", true}} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, func(o *harnessOpts) { o.cfg.HeartbeatInterval = 200 * time.Millisecond })
			ended := make(chan time.Time, 1)
			port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				defer func() { ended <- time.Now() }()
				f := sseHeaders(w)
				fmt.Fprint(w, "data: first\n\n")
				f.Flush()
				if tc.silent {
					<-r.Context().Done()
					return
				}
				for {
					if _, err := fmt.Fprint(w, "data: more\n\n"); err != nil {
						return
					}
					f.Flush()
					select {
					case <-r.Context().Done():
						return
					case <-time.After(5 * time.Millisecond):
					}
				}
			}))
			host := h.route("gone", port)
			resp := h.do(h.req("GET", host, "/", nil))
			br := bufio.NewReader(resp.Body)
			if ev, _ := readEvent(br); ev != "data: first\n" {
				t.Fatalf("first event %q", ev)
			}
			closedAt := time.Now()
			resp.Body.Close()
			h.client.CloseIdleConnections()
			select {
			case at := <-ended:
				if d := at.Sub(closedAt); d > time.Second {
					t.Fatalf("backend noticed after %v", d)
				}
			case <-time.After(3 * time.Second):
				t.Fatal("backend stream still open 3s after the client left")
			}
			testenv.WaitFor(t, 10*time.Second, "proxy stream released", func() bool {
				s, _ := h.proxy.streams.open()
				return s == 0
			})
		})
	}
}

// A client that half-closes its connection (FIN, as an HTTP client's
// timeout or an agent shutting down its transport does) on a silent stream
// has gone: nginx and net/http take a client FIN as the end of the request.
// The heartbeat written into such a connection succeeds (the client may even
// keep reading), so the proxy must look before it writes, or the sandbox's
// handler (an MCP gateway's GET stream, which refuses a resumption while it
// lives) stays open for ever, or until a second heartbeat fails.
func TestSilentStreamEndsWhenClientHalfCloses(t *testing.T) {
	for _, method := range []string{"GET", "POST"} {
		t.Run(method, func(t *testing.T) {
			h := newHarness(t, func(o *harnessOpts) { o.cfg.HeartbeatInterval = 100 * time.Millisecond })
			ended := make(chan struct{})
			port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				defer close(ended)
				f := sseHeaders(w)
				fmt.Fprint(w, "data: first\n\n")
				f.Flush()
				<-r.Context().Done()
			}))
			host := h.route("halfclose", port)
			c, err := net.Dial("tcp", h.addr)
			if err != nil {
				t.Fatal(err)
			}
			_ = c.SetDeadline(time.Now().Add(10 * time.Second))
			defer c.Close()
			fmt.Fprintf(c, "%s / HTTP/1.1\r\nHost: %s\r\nContent-Length: 2\r\n\r\n{}", method, host)
			br := bufio.NewReader(c)
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatal(err)
			}
			if ev, _ := readEvent(bufio.NewReader(resp.Body)); ev != "data: first\n" {
				t.Fatalf("first event %q", ev)
			}
			// Keep reading, as a half-closed client may: the stream must end
			// (the proxy closes the connection) rather than carry heartbeats
			// (100 of them in the 10 s the helper waits).
			go io.Copy(io.Discard, br)
			hangUpAndWait(t, h, c, true, ended)
		})
	}
}

// A silent stream ends as soon as its client hangs up, without waiting for
// a heartbeat (an hour here): the sandbox's handler is released at once, as
// nginx releases it on the client's FIN. "again" runs a second stream on a
// keep-alive connection whose first stream was watched too.
func TestSilentStreamEndsAtClientHangUp(t *testing.T) {
	for _, tc := range []struct {
		name, method string
		half, again  bool
	}{
		{"GET close", "GET", false, false},
		{"GET half-close", "GET", true, false},
		{"POST close", "POST", false, false},
		{"POST again close", "POST", false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, func(o *harnessOpts) { o.cfg.HeartbeatInterval = time.Hour })
			ended := make(chan struct{}, 2)
			port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				defer func() { ended <- struct{}{} }()
				f := sseHeaders(w)
				fmt.Fprint(w, "data: first\n\n")
				f.Flush()
				if r.URL.Path == "/short" {
					return
				}
				<-r.Context().Done()
			}))
			host := h.route("hangup", port)
			c, err := net.Dial("tcp", h.addr)
			if err != nil {
				t.Fatal(err)
			}
			_ = c.SetDeadline(time.Now().Add(10 * time.Second))
			defer c.Close()
			br := bufio.NewReader(c)
			stream := func(path string) {
				t.Helper()
				fmt.Fprintf(c, "%s %s HTTP/1.1\r\nHost: %s\r\nContent-Length: 2\r\n\r\n{}", tc.method, path, host)
				resp, err := http.ReadResponse(br, nil)
				if err != nil {
					t.Fatal(err)
				}
				body := bufio.NewReader(resp.Body)
				if ev, _ := readEvent(body); ev != "data: first\n" {
					t.Fatalf("first event %q", ev)
				}
				if path == "/short" {
					if _, err := io.Copy(io.Discard, body); err != nil {
						t.Fatal(err)
					}
					<-ended
				}
			}
			if tc.again {
				stream("/short")
			}
			stream("/")
			hangUpAndWait(t, h, c, tc.half, ended)
		})
	}
}

// A streamed answer that is not an event stream (a command's output as
// chunked text or NDJSON, envd's Connect streams, a long poll, a download
// generated as it is sent) ends as soon as its client hangs up, as an SSE
// stream does: a client talking to the
// sandbox directly, or through nginx or Go's ReverseProxy, has its request
// ended by its FIN, so the sandbox stops the work. Found by bench/interop: a
// fetch() aborted mid-download left the sandbox writing into the proxy
// until its next write failed, and a silent one until upstream.idle_timeout.
func TestSilentNonSSEStreamEndsAtClientHangUp(t *testing.T) {
	for _, tc := range []struct {
		name, proto, ctype string
		half, close        bool // client half-closes; sandbox body ends with its connection
		sized              bool // a Content-Length body larger than wholeBody, generated as it is sent
	}{
		{"chunked text", "HTTP/1.1", "text/plain", false, false, false},
		{"chunked NDJSON half-close", "HTTP/1.1", "application/x-ndjson", true, false, false},
		{"close-delimited", "HTTP/1.1", "application/octet-stream", false, true, false},
		{"HTTP/1.0 client", "HTTP/1.0", "text/plain", false, false, false},
		{"sized download", "HTTP/1.1", "application/octet-stream", false, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, func(o *harnessOpts) { o.cfg.HeartbeatInterval = time.Hour })
			ended := make(chan struct{})
			port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				defer close(ended)
				w.Header().Set("Content-Type", tc.ctype)
				if tc.close {
					w.Header().Set("Connection", "close")
				}
				if tc.sized {
					w.Header().Set("Content-Length", strconv.Itoa(4*wholeBody))
				}
				fmt.Fprint(w, "first\n")
				if tc.sized {
					w.Write(bytes.Repeat([]byte("x"), wholeBody+1)) // past what is read whole
				}
				w.(http.Flusher).Flush()
				<-r.Context().Done()
			}))
			host := h.route("plainstream", port)
			c, err := net.Dial("tcp", h.addr)
			if err != nil {
				t.Fatal(err)
			}
			_ = c.SetDeadline(time.Now().Add(10 * time.Second))
			defer c.Close()
			fmt.Fprintf(c, "GET / %s\r\nHost: %s\r\n\r\n", tc.proto, host)
			br := bufio.NewReader(c)
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatal(err)
			}
			body := bufio.NewReader(resp.Body)
			if line, _ := body.ReadString('\n'); line != "first\n" {
				t.Fatalf("first line %q", line)
			}
			if tc.sized {
				// All of it, as a client reading ahead does: a close with
				// unread bytes would reset, failing the proxy's next write.
				if _, err := io.ReadFull(body, make([]byte, wholeBody+1)); err != nil {
					t.Fatal(err)
				}
			}
			if runtime.GOOS == "linux" {
				// The client hangs up once the stream has lasted clientCheck
				// and is watched: a stream the proxy ended by itself at the
				// check (an HTTP/1.0 client's was, before waitReadable knew
				// the check) would pass for one its client's hang-up ended.
				testenv.WaitFor(t, 10*time.Second, "client watched", func() bool {
					return watchedHangups(h.proxy.hangups) == 1
				})
			}
			hangUpAndWait(t, h, c, tc.half, ended)
		})
	}
}

// Bytes from the client (a pipelined request) are not a hang-up.
func TestSilentStreamSurvivesClientBytes(t *testing.T) {
	h := newHarness(t, func(o *harnessOpts) { o.cfg.HeartbeatInterval = time.Hour })
	release := make(chan struct{})
	port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f := sseHeaders(w)
		fmt.Fprint(w, "data: first\n\n")
		f.Flush()
		select {
		case <-release:
		case <-r.Context().Done():
			return
		}
		fmt.Fprint(w, "data: second\n\n")
	}))
	host := h.route("pipelined", port)
	c, err := net.Dial("tcp", h.addr)
	if err != nil {
		t.Fatal(err)
	}
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	defer c.Close()
	fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: %s\r\n\r\n", host)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	body := bufio.NewReader(resp.Body)
	if ev, _ := readEvent(body); ev != "data: first\n" {
		t.Fatalf("first event %q", ev)
	}
	fmt.Fprintf(c, "GET /next HTTP/1.1\r\nHost: %s\r\n\r\n", host)
	// A hang-up is noticed within microseconds; give bytes taken for one
	// a generous while to end the stream.
	for end := time.Now().Add(300 * time.Millisecond); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		if s, _ := h.proxy.streams.open(); s == 0 {
			t.Fatal("the stream ended on the client's bytes")
		}
	}
	close(release)
	if ev, err := readEvent(body); ev != "data: second\n" {
		t.Fatalf("second event %q (%v): the stream ended on the client's bytes", ev, err)
	}
}

// heapWatch samples the heap while a transfer runs and reports the peak
// growth over the starting point.
func heapWatch() (stop func() uint64) {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	base := ms.HeapAlloc
	var peak atomic.Uint64
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		for {
			var m runtime.MemStats
			runtime.ReadMemStats(&m)
			if m.HeapAlloc > base && m.HeapAlloc-base > peak.Load() {
				peak.Store(m.HeapAlloc - base)
			}
			select {
			case <-done:
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
	return func() uint64 { close(done); <-finished; return peak.Load() }
}

// patternReader yields n bytes of a repeating pattern without holding them.
type patternReader struct{ left int64 }

func (p *patternReader) Read(b []byte) (int, error) {
	if p.left <= 0 {
		return 0, io.EOF
	}
	if int64(len(b)) > p.left {
		b = b[:p.left]
	}
	// b[i] = byte(i*7), which repeats every 256 bytes: one period is
	// written and copied along b. Under -race a byte written in a loop
	// is a call into the race detector, and TestUploadStreamsWithBoundedHeap
	// generates 64 MiB three times.
	var period [256]byte
	for i := range period {
		period[i] = byte(i * 7)
	}
	for i := 0; i < len(b); {
		i += copy(b[i:], period[:])
	}
	p.left -= int64(len(b))
	return len(b), nil
}

func TestUploadStreamsWithBoundedHeap(t *testing.T) {
	const size = 64 << 20
	want := sha256.New()
	io.Copy(want, &patternReader{left: size})
	wantSum := fmt.Sprintf("%x", want.Sum(nil))

	for _, chunked := range []bool{true, false} {
		t.Run(fmt.Sprintf("chunked=%v", chunked), func(t *testing.T) {
			h := newHarness(t)
			port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				hs := sha256.New()
				n, err := io.Copy(hs, r.Body)
				fmt.Fprintf(w, "%d %x %v %v", n, hs.Sum(nil), err, r.TransferEncoding)
			}))
			host := h.route("up", port)
			var body io.Reader = &patternReader{left: size}
			if chunked {
				body = io.MultiReader(body) // hides the length: sent chunked
			}
			req := h.req("POST", host, "/upload", body)
			if !chunked {
				req.ContentLength = size
			}
			stop := heapWatch()
			resp := h.do(req)
			got, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			peak := stop()
			wantTE := "[]"
			if chunked {
				wantTE = "[chunked]"
			}
			if want := fmt.Sprintf("%d %s <nil> %s", size, wantSum, wantTE); string(got) != want {
				t.Fatalf("backend got %q, want %q", got, want)
			}
			// The client, the proxy and the backend share this heap; a
			// buffered body alone would be 64 MiB.
			if peak > 16<<20 {
				t.Fatalf("heap grew by %d MiB during a 64 MiB upload", peak>>20)
			}
			t.Logf("peak heap growth %.1f MiB", float64(peak)/(1<<20))
		})
	}
}

// Each piece of an upload reaches the sandbox as it arrives, whatever its
// size: the client sends the next piece only once the sandbox has read
// every byte sent so far, so a piece held back in the proxy deadlocks the
// exchange and the test fails on its deadline. A Content-Length body's
// small pieces used to wait in the request's 4 KiB writer until more came.
func TestUploadPiecesArriveAtOnce(t *testing.T) {
	// The first piece is over what fasthttp reads before the handler runs,
	// so the rest goes through the body stream.
	pieces := []int{fasthttpPreRead + 1000, 10, 1000, 3000, 1, 5000}
	total := 0
	for _, n := range pieces {
		total += n
	}
	for _, tc := range []struct {
		name, framing string
		piece         func(n int) string
		end           string
	}{
		{"content-length", fmt.Sprintf("Content-Length: %d\r\n", total),
			func(n int) string { return strings.Repeat("u", n) }, ""},
		{"chunked", "Transfer-Encoding: chunked\r\n",
			func(n int) string { return fmt.Sprintf("%x\r\n%s\r\n", n, strings.Repeat("u", n)) }, "0\r\n\r\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			port, progress := progressBackend(t, 64<<10)
			host := h.route("uppieces", port)
			c := dialRaw(t, h.addr)
			fmt.Fprintf(c, "POST /up HTTP/1.1\r\nHost: %s\r\n%s\r\n", host, tc.framing)
			sent, seen := 0, 0
			for i, n := range pieces {
				io.WriteString(c, tc.piece(n))
				sent += n
				deadline := time.After(5 * time.Second)
				for seen < sent {
					select {
					case seen = <-progress:
					case <-deadline:
						t.Fatalf("piece %d (%d bytes): the sandbox has %d of the %d bytes the client sent", i, n, seen, sent)
					}
				}
			}
			io.WriteString(c, tc.end)
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			if want := fmt.Sprintf("%d EOF", total); string(b) != want {
				t.Fatalf("sandbox answered %q, want %q", b, want)
			}
		})
	}
}

// progressBackend is a sandbox that reads a request's body with reads of
// up to bufSize bytes, sends the count read so far after each, and answers
// "<count> <error>" when the body ends: an upload test sends its next piece
// only once the sandbox has every byte sent, so that a piece the proxy
// holds back deadlocks the exchange instead of passing unnoticed.
func progressBackend(t *testing.T, bufSize int) (uint16, <-chan int) {
	progress := make(chan int, 64)
	port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got, buf := 0, make([]byte, bufSize)
		for {
			n, err := r.Body.Read(buf)
			got += n
			if n > 0 {
				select {
				case progress <- got:
				case <-r.Context().Done():
					return
				}
			}
			if err != nil {
				fmt.Fprintf(w, "%d %v", got, err)
				return
			}
		}
	}))
	return port, progress
}

// A chunked upload's head reaches the sandbox before the client's first
// chunk: the client sends that chunk only once the sandbox has the head
// (its handler runs), so a head held back for the body deadlocks the
// exchange and the test fails on its deadline.
func TestChunkedUploadHeadGoesFirst(t *testing.T) {
	h := newHarness(t)
	started := make(chan struct{})
	port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(started)
		b, err := io.ReadAll(r.Body)
		fmt.Fprintf(w, "%s %v", b, err)
	}))
	host := h.route("uphead", port)
	c := dialRaw(t, h.addr)
	fmt.Fprintf(c, "POST /up HTTP/1.1\r\nHost: %s\r\nTransfer-Encoding: chunked\r\n\r\n", host)
	select {
	case <-started:
	case <-time.After(5 * time.Second):
		t.Fatal("the sandbox never got the head: the proxy held it back for the first chunk")
	}
	io.WriteString(c, "5\r\nhello\r\n0\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := io.ReadAll(resp.Body); string(b) != "hello <nil>" {
		t.Fatalf("sandbox answered %q", b)
	}
}

func TestDownloadWithContentLengthStreams(t *testing.T) {
	const size = 64 << 20
	h := newHarness(t)
	port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", fmt.Sprint(size))
		io.Copy(w, &patternReader{left: size})
	}))
	host := h.route("down", port)
	stop := heapWatch()
	resp := h.do(h.req("GET", host, "/", nil))
	if resp.ContentLength != size {
		t.Fatalf("Content-Length %d, want %d", resp.ContentLength, size)
	}
	n, err := io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	peak := stop()
	if err != nil || n != size {
		t.Fatalf("read %d bytes, err %v", n, err)
	}
	if peak > 16<<20 {
		t.Fatalf("heap grew by %d MiB during a 64 MiB download", peak>>20)
	}
}

func TestRequestBodyCap(t *testing.T) {
	h := newHarness(t, func(o *harnessOpts) { o.cfg.MaxRequestBodySize = 1 << 20 })
	var got atomic.Int64
	port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, _ := io.Copy(io.Discard, r.Body)
		got.Store(n)
	}))
	host := h.route("cap", port)
	for _, tc := range []struct {
		name    string
		size    int64
		chunked bool
		status  int
	}{
		{"length at cap", 1 << 20, false, 200},
		{"length over cap", 1<<20 + 1, false, 413},
		{"chunked at cap", 1 << 20, true, 200},
		{"chunked over cap", 2 << 20, true, 413},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var body io.Reader = &patternReader{left: tc.size}
			if tc.chunked {
				body = io.MultiReader(body)
			}
			req := h.req("POST", host, "/", body)
			if !tc.chunked {
				req.ContentLength = tc.size
			}
			resp, err := h.client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d (%s), want %d", resp.StatusCode, b, tc.status)
			}
			if tc.status == 413 && !strings.Contains(string(b), `"code":"request_body_too_large"`) {
				t.Fatalf("body %s", b)
			}
		})
	}
}

// A body over the cap is refused at once, before the client has sent it,
// and the connection closes after a lingering close that reads what the
// client still sends (so it gets the answer, not a reset).
// One byte over the cap is refused as early as ten times over it.
func TestRequestBodyCapAnswersBeforeTheBody(t *testing.T) {
	const limit = 1 << 20
	h := newHarness(t, func(o *harnessOpts) { o.cfg.MaxRequestBodySize = limit })
	host := h.route("capslow", backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {})))
	for _, length := range []int{limit + 1, 10 * limit} {
		t.Run(fmt.Sprint(length), func(t *testing.T) { capAnswersBeforeTheBody(t, h.addr, host, length) })
	}
}

func capAnswersBeforeTheBody(t *testing.T, addr, host string, length int) {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "POST / HTTP/1.1\r\nHost: %s\r\nContent-Length: %d\r\n\r\n", host, length)
	chunk := make([]byte, 64<<10)
	if _, err := c.Write(chunk); err != nil {
		t.Fatal(err)
	}
	// The uploader pauses: the answer must not wait for the rest.
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("no answer while the client paused its upload: %v", err)
	}
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 413 || !resp.Close || !strings.Contains(string(b), `"code":"request_body_too_large"`) {
		t.Fatalf("got %d close=%v %s, want 413 with Connection: close", resp.StatusCode, resp.Close, b)
	}
	// The rest of the upload is read and discarded, then the proxy closes.
	for range 4 {
		if _, err := c.Write(chunk); err != nil {
			t.Fatalf("the proxy stopped reading the rest of the body: %v", err)
		}
	}
	c.(*net.TCPConn).CloseWrite()
	if n, err := br.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("after the lingering close: read %d, %v; want EOF", n, err)
	}
}

// A sandbox whose stream is still open is active now, however long ago the
// request that opened it arrived: an idle reaper polling last_active must
// not pause it under the stream. Once the stream ends it is dated by then.
func TestLastActiveCountsOpenStreams(t *testing.T) {
	h := newHarness(t)
	release := make(chan struct{})
	port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f := sseHeaders(w)
		fmt.Fprint(w, "data: first\n\n")
		f.Flush()
		<-release
	}))
	host := h.route("longlived", port)
	active := func(since int64) (int64, bool) {
		t.Helper()
		st, body := h.adminDo("GET", fmt.Sprintf("/admin/last_active?since=%d", since), "", "")
		var out struct{ Entries map[string]int64 }
		if st != 200 || json.Unmarshal([]byte(body), &out) != nil {
			t.Fatalf("last_active: %d %s", st, body)
		}
		ts, ok := out.Entries["longlived"]
		return ts, ok
	}

	resp := h.do(h.req("GET", host, "/events", nil))
	defer resp.Body.Close()
	if ev, err := readEvent(bufio.NewReader(resp.Body)); err != nil || ev != "data: first\n" {
		t.Fatalf("first event %q: %v", ev, err)
	}
	// Every poll after the request started still finds the sandbox while
	// the backend holds the stream open.
	for range 3 {
		since := time.Now().UnixMilli()
		if ts, ok := active(since); !ok || ts < since {
			t.Fatalf("open stream: last_active %d, %v; want >= %d", ts, ok, since)
		}
		time.Sleep(5 * time.Millisecond) // so that since moves past the request's start
	}
	close(release)
	io.Copy(io.Discard, resp.Body)
	// The proxy finishes the exchange just after the client saw its end.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		ts, ok := active(time.Now().UnixMilli())
		if !ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the stream ended but the sandbox is still reported active (%d)", ts)
		}
	}
}

// A Content-Length body too large to be read whole still streams: each
// piece reaches the client while the backend holds the rest back until the
// client acknowledges it.
func TestFixedLengthBodyPiecesArriveAtOnce(t *testing.T) {
	h := newHarness(t)
	const pieces, piece = 4, wholeBody // 4 pieces: more than one whole-body read
	ack := make(chan struct{})
	backendErr := make(chan error, 1)
	port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", fmt.Sprint(pieces*(piece+1)))
		w.WriteHeader(200)
		for i := range pieces {
			// A small marker first, then the piece: the marker alone must
			// make it through.
			fmt.Fprint(w, i)
			w.(http.Flusher).Flush()
			select {
			case <-ack:
			case <-time.After(10 * time.Second):
				backendErr <- fmt.Errorf("piece %d: the client never saw its first byte", i)
				return
			}
			w.Write(bytes.Repeat([]byte{'x'}, piece))
		}
		backendErr <- nil
	}))
	host := h.route("pieces", port)
	resp := h.do(h.req("GET", host, "/", nil))
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	for i := range pieces {
		if c, err := br.ReadByte(); err != nil || c != byte('0'+i) {
			t.Fatalf("piece %d: marker %q, %v", i, c, err)
		}
		select {
		case ack <- struct{}{}:
		case err := <-backendErr:
			t.Fatalf("the backend stopped before piece %d's ack: %v", i, err)
		case <-time.After(10 * time.Second):
			t.Fatalf("the backend never took piece %d's ack", i)
		}
		if _, err := io.CopyN(io.Discard, br, piece); err != nil {
			t.Fatalf("piece %d: %v", i, err)
		}
	}
	if err := <-backendErr; err != nil {
		t.Fatal(err)
	}
}

// A backend that sends a large body slowly must not use up the client's
// write timeout: it bounds how long the client takes each piece, counted
// from when the backend delivered it. A second, not 300 ms: the proxy's
// goroutine starved for 300 ms between a piece and its write (the race
// run on a loaded machine) was cut at the third piece; the body takes
// 1.6 s, still well past it.
func TestSlowFixedDownloadOutlivesWriteTimeout(t *testing.T) {
	h := newHarness(t, func(o *harnessOpts) { o.srv.ClientWriteTimeout = time.Second })
	const pieces, piece = 8, 16 << 10 // 128 KiB: streamed, not read whole
	port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", fmt.Sprint(pieces*piece))
		w.WriteHeader(200)
		for range pieces {
			w.Write(bytes.Repeat([]byte{'x'}, piece))
			w.(http.Flusher).Flush()
			time.Sleep(200 * time.Millisecond) // 1.6 s in all, well past the timeout
		}
	}))
	host := h.route("slowdl", port)
	resp := h.do(h.req("GET", host, "/", nil))
	defer resp.Body.Close()
	if n, err := io.Copy(io.Discard, resp.Body); err != nil || n != pieces*piece {
		t.Fatalf("slow download: %d of %d bytes, %v", n, pieces*piece, err)
	}
}

// No heartbeat comment goes into an event stream with a Content-Length:
// it would push the body's last bytes out of the count.
func TestFixedLengthEventStreamGetsNoHeartbeat(t *testing.T) {
	h := newHarness(t, func(o *harnessOpts) { o.cfg.HeartbeatInterval = 50 * time.Millisecond })
	first, rest := "data: a\n\n", strings.Repeat("y", wholeBody)
	port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("Content-Length", fmt.Sprint(len(first)+len(rest)))
		w.WriteHeader(200)
		io.WriteString(w, first)
		w.(http.Flusher).Flush()
		time.Sleep(300 * time.Millisecond) // six heartbeat intervals of silence
		io.WriteString(w, rest)
	}))
	host := h.route("ssefixed", port)
	resp := h.do(h.req("GET", host, "/", nil))
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || string(b) != first+rest {
		t.Fatalf("body: %d bytes (want %d), %v; heartbeat at %d", len(b), len(first)+len(rest), err, strings.Index(string(b), ": keep-alive"))
	}
}

// A heartbeat interval under a second still means one heartbeat per
// interval of silence, not one per read attempt.
func TestHeartbeatUnderOneSecond(t *testing.T) {
	for _, method := range []string{"GET", "POST"} { // detached and fasthttp-written streams
		t.Run(method, func(t *testing.T) {
			h := newHarness(t, func(o *harnessOpts) { o.cfg.HeartbeatInterval = 100 * time.Millisecond })
			release := make(chan struct{})
			port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				f := sseHeaders(w)
				fmt.Fprint(w, "data: a\n\n")
				f.Flush()
				<-release
				fmt.Fprint(w, "data: end\n\n")
			}))
			host := h.route("hbfast", port)
			// Started before the request, so before the proxy's first
			// interval: started after the first event was read, a test
			// goroutine run late measured less than the intervals.
			start := time.Now()
			resp := h.do(h.req(method, host, "/", strings.NewReader("")))
			defer resp.Body.Close()
			br := bufio.NewReader(resp.Body)
			if ev, err := readEvent(br); err != nil || ev != "data: a\n" {
				t.Fatalf("first event %q: %v", ev, err)
			}
			n := 0
			for n < 5 {
				if ev, err := readEvent(br); err != nil || ev != ": keep-alive\n" {
					t.Fatalf("heartbeat %d: %q, %v", n, ev, err)
				}
				n++
			}
			// Five heartbeats take five intervals after the first event; a
			// storm takes microseconds.
			if d := time.Since(start); d < 4*100*time.Millisecond {
				t.Errorf("5 heartbeats in %v at a 100 ms interval", d)
			}
			close(release)
			readUntilEvent(t, br, "data: end\n", "the last event")
		})
	}
}

// A heartbeat comes an interval after the last event, an eighth of it
// early at most: the deadline is not moved for every event, and with a
// fixed second of slack a 1 s interval's heartbeat could follow an event
// at once (the interop lab's py.http10-sse got one in a 0.1 s stream).
func TestHeartbeatCountsFromTheLastEvent(t *testing.T) {
	const interval = time.Second
	for _, method := range []string{"GET", "POST"} { // detached and fasthttp-written streams
		t.Run(method, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, func(o *harnessOpts) { o.cfg.HeartbeatInterval = interval })
			next, release := make(chan struct{}), make(chan struct{})
			port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				f := sseHeaders(w)
				fmt.Fprint(w, "data: a\n\n")
				f.Flush()
				<-next
				fmt.Fprint(w, "data: b\n\n")
				f.Flush()
				<-release
			}))
			defer close(release)
			host := h.route("hblast", port)
			resp := h.do(h.req(method, host, "/", strings.NewReader("")))
			defer resp.Body.Close()
			br := bufio.NewReader(resp.Body)
			if ev, err := readEvent(br); err != nil || ev != "data: a\n" {
				t.Fatalf("first event %q: %v", ev, err)
			}
			// The second event three quarters of an interval after the
			// first: the deadline armed after the first is a quarter of an
			// interval after it.
			time.Sleep(interval * 3 / 4)
			close(next)
			// A heartbeat before it only if the test's sleep ran late.
			readUntilEvent(t, br, "data: b\n", "the second event")
			after := time.Now()
			if ev, err := readEvent(br); err != nil || ev != ": keep-alive\n" {
				t.Fatalf("heartbeat: %q, %v", ev, err)
			}
			if d := time.Since(after); d < interval/2 {
				t.Errorf("heartbeat %v after the last event, at a %v interval", d, interval)
			}
		})
	}
}

// Heartbeats are the proxy's own bytes, not the sandbox's: a stream whose
// sandbox says nothing for the idle timeout is closed even though the
// client kept getting heartbeats (a hung sandbox, or one paused without
// the proxy being told, must not hold the stream, and the client's
// reconnect, for ever; one paused through /admin/state keeps it,
// TestMCPPauseOutlastsIdleTimeout).
func TestSilentStreamWithHeartbeatsHitsIdleTimeout(t *testing.T) {
	t.Parallel()
	for _, method := range []string{"GET", "POST"} { // detached and fasthttp-written streams
		t.Run(method, func(t *testing.T) {
			h := newHarness(t, func(o *harnessOpts) {
				o.cfg.HeartbeatInterval = 100 * time.Millisecond
				o.cfg.IdleStreamTimeout = time.Second
			})
			ended := make(chan struct{})
			port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				defer close(ended)
				f := sseHeaders(w)
				fmt.Fprint(w, "data: a\n\n")
				f.Flush()
				<-r.Context().Done() // silent until the proxy closes the stream
			}))
			host := h.route("hbidle", port)
			resp := h.do(h.req(method, host, "/", strings.NewReader("")))
			defer resp.Body.Close()
			br := bufio.NewReader(resp.Body)
			if ev, err := readEvent(br); err != nil || ev != "data: a\n" {
				t.Fatalf("first event %q: %v", ev, err)
			}
			heartbeats := 0
			for {
				ev, err := readEvent(br)
				if err != nil {
					// Cut, without its last chunk: ended cleanly, an MCP
					// client took a call's answer stream for a whole one
					// and did not resume it.
					if !errors.Is(err, io.ErrUnexpectedEOF) {
						t.Errorf("the stream ended with %v, want a cut (unexpected EOF): the sandbox never ended it", err)
					}
					break
				}
				if ev != ": keep-alive\n" {
					t.Fatalf("unexpected event %q", ev)
				}
				// 10 s of heartbeats is ten idle timeouts.
				if heartbeats++; heartbeats == 100 {
					t.Fatal("a stream silent for ten idle timeouts is still open: heartbeats renew the idle timeout")
				}
			}
			select {
			case <-ended:
			case <-time.After(5 * time.Second):
				t.Fatal("the sandbox's connection is still open")
			}
		})
	}
}

// A client that leaves while its sandbox is still working on the answer (an
// agent cancelling a long MCP tool call, an HTTP client's timeout) ends the
// request: the sandbox's connection is closed, so its server cancels the
// work, and the request gives back its max_streams_per_sandbox slot, as
// nginx does (499): at once, when the request has waited clientCheck and
// its client is in the hang-up watch. Before, the proxy waited for the
// answer's head for up to upstream.response_header_timeout
// (upstream.idle_timeout, two hours, for a request that accepts an event
// stream), holding both, and a client that retried after its own timeout
// was soon refused with 429.
func TestClientGoneBeforeHeadClosesUpstream(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, head string
		last       string // sent before the close: a TLS client's close_notify comes before its FIN
		reset      bool
	}{
		{"GET, client closes", "GET /slow HTTP/1.1\r\n", "", false},
		{"GET, client sends bytes, then closes", "GET /slow HTTP/1.1\r\n", "\x15\x03\x03\x00\x02\x01\x00", false},
		{"GET, client resets", "GET /slow HTTP/1.1\r\n", "", true},
		{"MCP POST, client closes", "POST /mcp HTTP/1.1\r\nAccept: application/json, text/event-stream\r\nContent-Length: 2\r\n", "", false},
		// A Jupyter kernel's channel answers its upgrade only once the
		// kernel is up: a client may give up on the handshake first.
		{"WebSocket upgrade, client closes", "GET /ws HTTP/1.1\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n", "", false},
		{"WebSocket upgrade, client resets", "GET /ws HTTP/1.1\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n", "", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, logs := logHarness(t, "json", func(o *harnessOpts) { o.cfg.MaxStreamsPerSandbox = 1 })
			got, canceled := make(chan struct{}, 1), make(chan struct{}, 1)
			port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path == "/fast" {
					io.WriteString(w, "ok")
					return
				}
				io.Copy(io.Discard, r.Body)
				got <- struct{}{}
				select {
				case <-r.Context().Done():
					canceled <- struct{}{}
				case <-time.After(20 * time.Second):
				}
			}))
			host := h.route("thinks", port)
			c, err := net.Dial("tcp", h.addr)
			if err != nil {
				t.Fatal(err)
			}
			io.WriteString(c, tc.head+"Host: "+host+"\r\nX-Cube-Request-Id: gone-before-head\r\n\r\n{}")
			testenv.Recv(t, got, 10*time.Second, "the request's body at the sandbox")
			if runtime.GOOS == "linux" {
				// Past clientCheck the client is in the hang-up watch, which
				// tells of its departure at once rather than at a later look.
				testenv.WaitFor(t, 5*time.Second, "the waiting request's client watched",
					func() bool { return watchedHangups(h.proxy.hangups) == 1 })
			}
			io.WriteString(c, tc.last)
			if tc.reset {
				reset(c.(*net.TCPConn))
			} else {
				c.Close()
			}
			select {
			case <-canceled:
			case <-time.After(5 * time.Second):
				t.Fatal("the sandbox's request is still open 5s after its client left")
			}
			e := logs.waitJSON(t, "gone-before-head")
			if e["status"] != float64(499) || e["error_code"] != CodeClientClosed || e["body_bytes_sent"] != float64(0) {
				t.Errorf("logged status %v error_code %v body_bytes_sent %v, want 499 %s 0",
					e["status"], e["error_code"], e["body_bytes_sent"], CodeClientClosed)
			}
			// The slot is free: the next request is served, not refused.
			if st, body, _ := h.get(host, "/fast"); st != 200 || body != "ok" {
				t.Errorf("next request: %d %q", st, body)
			}
		})
	}
}

// Media types are case-insensitive (RFC 9110 §8.3.1), and EventSource
// takes "Text/Event-Stream" as an event stream: so must the proxy, or the
// stream gets no heartbeat, no hang-up watch and no clean end at drain.
// The backend holds the stream until the client has seen a heartbeat.
func TestEventStreamTypeIsCaseInsensitive(t *testing.T) {
	for _, ct := range []string{"text/event-stream", "Text/Event-Stream", "TEXT/EVENT-STREAM; charset=utf-8"} {
		t.Run(ct, func(t *testing.T) {
			h := newHarness(t, func(o *harnessOpts) { o.cfg.HeartbeatInterval = 50 * time.Millisecond })
			sawHeartbeat := make(chan struct{})
			port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", ct)
				fmt.Fprint(w, "data: a\n\n")
				w.(http.Flusher).Flush()
				select {
				case <-sawHeartbeat:
					fmt.Fprint(w, "data: b\n\n")
				case <-time.After(10 * time.Second):
				}
			}))
			host := h.route("casefold", port)
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			defer cancel()
			resp := h.do(h.req("GET", host, "/", nil).WithContext(ctx))
			defer resp.Body.Close()
			br := bufio.NewReader(resp.Body)
			if ev, err := readEvent(br); ev != "data: a\n" {
				t.Fatalf("first event %q, %v", ev, err)
			}
			if ev, err := readEvent(br); ev != ": keep-alive\n" {
				t.Fatalf("want a heartbeat while the sandbox is silent, got %q, %v", ev, err)
			}
			close(sawHeartbeat)
			ev, err := readEvent(br)
			for err == nil && ev == ": keep-alive\n" {
				ev, err = readEvent(br)
			}
			if ev != "data: b\n" {
				t.Fatalf("second event %q, %v", ev, err)
			}
		})
	}
}

// The drain leaves a GET's event stream open only when its first line is
// the endpoint event of MCP's HTTP+SSE transport, as each SDK writes it,
// however the sandbox splits it across writes.
func TestOpensLegacySession(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		want       bool
	}{
		{"go-sdk and TypeScript SDK", "event: endpoint\ndata: /messages?sessionId=1\n\n", true},
		{"python sse-starlette", "event: endpoint\r\ndata: /messages/?session_id=1\r\n\r\n", true},
		{"no space", "event:endpoint\ndata: /m\n\n", true},
		{"byte order mark", "\xEF\xBB\xBFevent: endpoint\n", true},
		{"streamable HTTP message", "event: message\nid: 1\ndata: {}\n\n", false},
		{"priming event", "id: 1\ndata: \n\n", false},
		{"another event name", "event: endpoints\ndata: x\n\n", false},
		{"endpoint not first", ": hi\n\nevent: endpoint\ndata: /m\n\n", false},
		{"ticker", "id: 1\nevent: tick\ndata: {}\n\n", false},
	} {
		for _, split := range []int{1, 3, 7, len(tc.body)} {
			p := &Proxy{}
			s := &bodyStream{p: p, resumable: true, probing: true}
			for b := []byte(tc.body); len(b) > 0 && s.probing; {
				n := min(split, len(b))
				s.probeFirstEvent(b[:n])
				b = b[n:]
			}
			if got := !s.resumable; got != tc.want {
				t.Errorf("%s, written %d bytes at a time: kept for the drain deadline = %v, want %v", tc.name, split, got, tc.want)
			}
		}
	}
}

// hangUpAndWait closes c (only its sending side when half) and waits for
// the sandbox's handler to end (ended) and the proxy to release the stream.
func hangUpAndWait(t *testing.T, h *harness, c net.Conn, half bool, ended <-chan struct{}) {
	t.Helper()
	if half {
		_ = c.(*net.TCPConn).CloseWrite()
	} else {
		c.Close()
	}
	select {
	case <-ended:
	case <-time.After(10 * time.Second):
		t.Fatal("the sandbox's stream still open 10s after the client hung up")
	}
	testenv.WaitFor(t, 10*time.Second, "proxy stream released", func() bool {
		s, _ := h.proxy.streams.open()
		return s == 0
	})
}
