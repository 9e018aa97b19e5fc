package proxy

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/cube-sandbox/cubeproxy/accesslog"
	"github.com/cube-sandbox/cubeproxy/internal/testenv"
	"github.com/cube-sandbox/cubeproxy/routing"
)

// Shutdown with SSE streams and a WebSocket open: new connections are
// refused, SSE streams end cleanly at once, the WebSocket is cut at the
// drain deadline, and nothing is left running afterwards.
func TestGracefulShutdown(t *testing.T) {
	t.Parallel()
	// Long enough that "at once" (under drain/2) holds on a loaded 2-core
	// machine: at 1.5 s a stream once ended 794 ms in under the race
	// detector, and the WebSocket's cut at the deadline is what contrasts.
	const drain = 3 * time.Second
	h := newHarness(t, func(o *harnessOpts) { o.srv.DrainTimeout = drain })

	var sseOpen atomic.Int64
	sseStarted := make(chan struct{}, 3)
	ssePort := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sseOpen.Add(1)
		defer sseOpen.Add(-1)
		f := sseHeaders(w)
		fmt.Fprint(w, "data: hello\n\n")
		f.Flush()
		sseStarted <- struct{}{}
		<-r.Context().Done()
	}))
	sseHost := h.route("drainsse", ssePort)
	wsEnded := make(chan error, 1)
	wsHost := h.route("drainws", wsBackend(t, wsEnded))

	type result struct {
		err error
		at  time.Time
	}
	sseDone := make(chan result, 3)
	for i := 0; i < 3; i++ {
		resp := h.do(h.req("GET", sseHost, "/", nil))
		go func() {
			defer resp.Body.Close()
			br := bufio.NewReader(resp.Body)
			readEvent(br)
			_, err := io.Copy(io.Discard, br) // nil only on a clean end of stream
			sseDone <- result{err, time.Now()}
		}()
		<-sseStarted
	}
	ws := dialWS(t, h, wsHost)
	defer ws.CloseNow()
	wsDone := make(chan result, 1)
	go func() {
		_, _, err := ws.Read(context.Background())
		wsDone <- result{err, time.Now()}
	}()

	start := time.Now()
	shutdownDone := make(chan error, 1)
	go func() { shutdownDone <- h.server.Shutdown(context.Background()) }()

	for i := 0; i < 3; i++ {
		select {
		case r := <-sseDone:
			if r.err != nil {
				t.Errorf("SSE stream ended with %v, want a clean end", r.err)
			}
			if d := r.at.Sub(start); d > drain/2 {
				t.Errorf("SSE stream ended %v after shutdown began; SSE should end at once", d)
			}
		case <-time.After(drain + 2*time.Second):
			t.Fatal("SSE stream still open after the drain")
		}
	}
	h.waitListenerClosed(10 * time.Second)

	drainEnds(t, shutdownDone, drain+3*time.Second, "Shutdown did not return")
	if d := time.Since(start); d > drain+2500*time.Millisecond {
		t.Errorf("Shutdown took %v with a %v drain", d, drain)
	}
	select {
	case r := <-wsDone:
		if r.err == nil || r.at.Sub(start) < drain-100*time.Millisecond {
			t.Errorf("WebSocket ended at %v (%v): it should get the whole drain time", r.at.Sub(start), r.err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("WebSocket still open after Shutdown returned")
	}
	if s, n := h.proxy.streams.open(); s != 0 || n != 0 {
		t.Fatalf("after Shutdown: %d streams and %d tunnels still registered", s, n)
	}
	testenv.WaitFor(t, 10*time.Second, "backends saw every stream end", func() bool { return sseOpen.Load() == 0 })
	select {
	case <-wsEnded:
	case <-time.After(10 * time.Second):
		t.Fatal("the WebSocket backend never saw the tunnel close")
	}
	_ = websocket.StatusGoingAway
}

// gatedStore holds every lookup until release is closed.
type gatedStore struct {
	routing.Store
	entered chan struct{}
	release chan struct{}
}

func (s *gatedStore) Lookup(ctx context.Context, id string) (*routing.Route, error) {
	s.entered <- struct{}{}
	<-s.release
	return s.Store.Lookup(ctx, id)
}

// A request whose route lookup is in flight when the drain starts is
// answered, not failed with 503: fasthttp cancels its RequestCtx then.
func TestDrainCompletesLookupInFlight(t *testing.T) {
	port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
	mem := routing.NewMemoryStore()
	r, err := routing.ParseRouteStrict("slowlookup", map[string]string{"HostIP": "127.0.0.1", itoa(port): itoa(port)})
	if err != nil {
		t.Fatal(err)
	}
	if err := mem.Put(r); err != nil {
		t.Fatal(err)
	}
	st := &gatedStore{Store: mem, entered: make(chan struct{}, 1), release: make(chan struct{})}
	h := newHarness(t, func(o *harnessOpts) { o.store = st })
	type answer struct {
		code int
		body string
	}
	done := make(chan answer, 1)
	go func() {
		code, body, _ := h.get(itoa(port)+"-slowlookup.cube.test", "/")
		done <- answer{code, body}
	}()
	testenv.Recv(t, st.entered, 10*time.Second, "the request's route lookup")
	go h.server.Shutdown(context.Background())
	// The drain has started once the listener refuses connections.
	h.waitListenerClosed(10 * time.Second)
	time.Sleep(50 * time.Millisecond) // let fasthttp cancel the request's context
	close(st.release)
	if a := <-done; a.code != 200 || a.body != "ok" {
		t.Fatalf("request in flight when the drain started: %d %s", a.code, a.body)
	}
}

// A GET's SSE stream whose head comes from the sandbox after the drain
// began (a subscription still waiting for its head at SIGTERM) ends
// cleanly at once too, like the streams open when it began: it must not
// run until the drain deadline and then be cut, blamed on the sandbox.
// An event stream answering a POST (an MCP tool call's answer) cannot be
// asked for again: it gets the drain time to finish, like any answer.
func TestDrainEndsSSEStartedDuringDrain(t *testing.T) {
	for _, method := range []string{"GET", "POST"} { // detached, and on fasthttp's writer
		t.Run(method, func(t *testing.T) {
			const drain = 3 * time.Second
			h := newHarness(t, func(o *harnessOpts) { o.srv.DrainTimeout = drain })
			entered := make(chan struct{}, 1)
			release := make(chan struct{})
			more := make(chan struct{})
			ended := make(chan struct{}, 1)
			port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				defer func() { ended <- struct{}{} }()
				entered <- struct{}{}
				<-release
				// Head and event in one write: the drain ends a GET's
				// stream as soon as it registers, and what the sandbox had
				// not sent by then is left to the client's reconnect.
				w.Header().Set("Content-Type", "text/event-stream")
				fmt.Fprint(w, "id: 1\ndata: hello\n\n")
				w.(http.Flusher).Flush()
				if r.Method == "GET" {
					<-r.Context().Done()
					return
				}
				select {
				case <-more:
					fmt.Fprint(w, "id: 2\ndata: answer\n\n")
				case <-r.Context().Done():
				}
			}))
			host := h.route("latesse", port)
			type result struct {
				events string
				err    error
			}
			first := make(chan struct{})
			done := make(chan result, 1)
			go func() {
				resp, err := h.client.Do(h.req(method, host, "/", strings.NewReader("{}")))
				if err != nil {
					done <- result{"", err}
					return
				}
				defer resp.Body.Close()
				br := bufio.NewReader(resp.Body)
				ev, err := readEvent(br)
				close(first)
				if err == nil {
					var rest []byte
					rest, err = io.ReadAll(br) // nil only on a clean end of stream
					ev += "|" + string(rest)
				}
				done <- result{ev, err}
			}()
			testenv.Recv(t, entered, 10*time.Second, "the request at the sandbox")
			start := time.Now()
			shutdownDone := make(chan error, 1)
			go func() { shutdownDone <- h.server.Shutdown(context.Background()) }()
			h.waitListenerClosed(10 * time.Second)
			close(release)
			want := "id: 1\ndata: hello\n|"
			if method == "POST" {
				select {
				case <-first:
				case r := <-done:
					t.Fatalf("the POST's stream ended before its first event: %q %v", r.events, r.err)
				case <-time.After(10 * time.Second):
					t.Fatal("the POST's first event never came")
				}
				close(more)
				want += "id: 2\ndata: answer\n\n"
			}
			select {
			case r := <-done:
				if r.events != want || r.err != nil {
					t.Errorf("stream gave %q and ended with %v, want %q and a clean end", r.events, r.err, want)
				}
				if d := time.Since(start); d > drain/2 {
					t.Errorf("stream ended %v after the drain began; it should end at once", d)
				}
			case <-time.After(drain + 2*time.Second):
				t.Fatal("SSE stream still open after the drain")
			}
			drainEnds(t, shutdownDone, drain+10*time.Second, "the drain outlived its deadline")
			select {
			case <-ended:
			case <-time.After(10 * time.Second):
				t.Fatal("the sandbox never saw the stream end")
			}
		})
	}
}

// A download the drain deadline cuts is logged with its status and
// error_code drain_timeout: the proxy cut it, not the sandbox, so it must
// not read upstream_reset (which dashboards count against sandboxes).
func TestDrainCutDownloadLogged(t *testing.T) {
	h, buf, _ := drainLogHarness(t, 300*time.Millisecond)
	port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "10485760")
		w.Write(make([]byte, 1<<20))
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	}))
	req := h.req("GET", h.route("drainget", port), "/", nil)
	req.Header.Set(HeaderRequestID, "cut-download")
	resp := h.do(req)
	defer resp.Body.Close()
	if _, err := io.ReadFull(resp.Body, make([]byte, 1<<20)); err != nil {
		t.Fatal(err)
	}
	go h.server.Shutdown(context.Background())
	if _, err := io.Copy(io.Discard, resp.Body); err == nil {
		t.Fatal("the cut download ended cleanly: it would pass for a complete file")
	}
	var line string
	testenv.WaitFor(t, 5*time.Second, "access log line", func() bool {
		for _, l := range strings.Split(buf.String(), "\n") {
			if strings.Contains(l, `"x_cube_request_id":"cut-download"`) {
				line = l
				return true
			}
		}
		return false
	})
	if !strings.Contains(line, `"status":200`) || !strings.Contains(line, `"error_code":"drain_timeout"`) {
		t.Fatalf("access log line of the cut download: %s", line)
	}
}

// A WebSocket the drain deadline cuts is logged as such, not as a tunnel
// that ended normally.
func TestDrainCutTunnelLogged(t *testing.T) {
	h, buf := logHarness(t, accesslog.FormatJSON, func(o *harnessOpts) { o.srv.DrainTimeout = 200 * time.Millisecond })
	wsEnded := make(chan error, 1)
	ws := dialWS(t, h, h.route("draincutws", wsBackend(t, wsEnded)))
	defer ws.CloseNow()
	if err := h.server.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	entry := buf.waitJSONLine(t, `"status":101`) // the tunnel's
	if entry["error_code"] != CodeDrainTimeout {
		t.Errorf("a tunnel cut by the drain logged error_code %v, want %s", entry["error_code"], CodeDrainTimeout)
	}
}

// What registers after the drain deadline cut everything (a response whose
// head the sandbox sent during the unwind, a WebSocket whose 101 came
// then) is cut as it registers, and logged as the drain's: left alone it
// held Shutdown's unwind, then died unlogged with the process.
func TestDrainStreamStartedAfterDeadlineIsCut(t *testing.T) {
	// Each framing of a download whose sandbox stays silent after its
	// first bytes: the one read to the sandbox's close must not pass the
	// proxy's cut for that close (the cut shuts the sandbox's socket, which
	// reads as an end of input: wake).
	for _, framing := range []struct{ name, reply string }{
		{"chunked", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4\r\npart\r\n"},
		{"content-length", "HTTP/1.1 200 OK\r\nContent-Length: 1048576\r\n\r\npart"}, // over 64 KiB: streamed
		{"read to close", "HTTP/1.1 200 OK\r\nConnection: close\r\n\r\npart"},
	} {
		t.Run("download, "+framing.name, func(t *testing.T) {
			h, buf := logHarness(t, accesslog.FormatJSON)
			port, _ := muteSandbox(t, framing.reply)
			h.proxy.streams.endSSE()
			h.proxy.streams.abortAll()
			req := h.req("GET", h.route("latedl", port), "/", nil)
			req.Header.Set(HeaderRequestID, "late-download")
			resp := h.do(req)
			defer resp.Body.Close()
			read := make(chan error, 1)
			go func() { _, err := io.Copy(io.Discard, resp.Body); read <- err }()
			select {
			case err := <-read:
				if err == nil {
					t.Fatal("the cut download ended cleanly: it would pass for a complete file")
				}
			case <-time.After(5 * time.Second):
				t.Fatal("a download that started after the drain deadline is still open")
			}
			if e := buf.waitJSON(t, "late-download"); e["error_code"] != CodeDrainTimeout {
				t.Errorf("error_code %v, want %s", e["error_code"], CodeDrainTimeout)
			}
		})
	}
	t.Run("websocket", func(t *testing.T) {
		h, buf := logHarness(t, accesslog.FormatJSON)
		host := h.route("latews", wsBackend(t, make(chan error, 1)))
		h.proxy.streams.endSSE()
		h.proxy.streams.abortAll()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		// The tunnel registers before it writes the 101: cut then, the
		// client sees the connection close instead.
		ws, _, err := websocket.Dial(ctx, "ws://"+h.addr+"/ws", &websocket.DialOptions{Host: host, Subprotocols: []string{"echo.v1"}})
		if err == nil {
			defer ws.CloseNow()
			if _, _, err := ws.Read(ctx); ctx.Err() != nil {
				t.Fatalf("a WebSocket that started after the drain deadline is still open (%v)", err)
			}
		} else if ctx.Err() != nil {
			t.Fatalf("dial: %v", err)
		}
		// Its client got no 101: logged as the drain's 504, with the
		// sandbox's 101 as upstream_status.
		entry := buf.waitJSONLine(t, `"upstream_status":101`) // the tunnel's
		if entry["error_code"] != CodeDrainTimeout || entry["status"] != float64(504) {
			t.Errorf("status %v error_code %v, want 504 %s", entry["status"], entry["error_code"], CodeDrainTimeout)
		}
	})
}

// muteSandbox accepts connections, writes reply (if any) and then
// neither reads nor writes a byte: a sandbox that hangs on a request, on an
// upload, or halfway through an answer. Each accepted connection is sent
// on the returned channel.
func muteSandbox(t *testing.T, reply string) (uint16, <-chan net.Conn) {
	t.Helper()
	accepted := make(chan net.Conn, 4)
	ln := testenv.ServeTCP(t, func(c net.Conn) {
		io.WriteString(c, reply)
		accepted <- c
	})
	return uint16(ln.Addr().(*net.TCPAddr).Port), accepted
}

// A request still waiting on its sandbox at the drain deadline (for the
// head of the answer, however long its own timeout, or for the sandbox to
// take its upload) is cut then: the client gets a 504 drain_timeout with
// Connection: close, the access log has its line before Shutdown returns,
// and Shutdown returns near the deadline. Left alone, such a request ran
// to its own timeout (120 s, 7206 s for one that accepts an event
// stream) and the process exited under it, unanswered and unlogged.
func TestDrainCutsRequestsWaitingOnTheSandbox(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, method, extra string
		upload              bool
		reply               string // what the sandbox sends before it hangs
	}{
		{"no answer", "GET", "", false, ""},
		{"no answer to an event-stream request", "POST", "Accept: application/json, text/event-stream\r\nContent-Length: 2\r\n", false, ""},
		{"no answer to an upgrade", "GET", "Connection: Upgrade\r\nUpgrade: websocket\r\n", false, ""},
		{"upload never read", "PUT", "Content-Length: 67108864\r\n", true, ""},
		// Read whole before answering (under 64 KiB): no byte went out.
		{"small body never finished", "GET", "", false, "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nhalf"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const drain = 300 * time.Millisecond
			h, buf, al := drainLogHarness(t, drain)
			port, accepted := muteSandbox(t, tc.reply)
			host := h.route("mute", port)

			c, err := net.Dial("tcp", h.addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			head := tc.method + " / HTTP/1.1\r\nHost: " + host + "\r\nX-Cube-Request-Id: cut-" + tc.method + "\r\n" + tc.extra + "\r\n"
			if _, err := io.WriteString(c, head); err != nil {
				t.Fatal(err)
			}
			if tc.upload {
				// Until the proxy closes: it stops reading once the
				// sandbox's socket buffers are full.
				go func() {
					b := make([]byte, 64<<10)
					for {
						if _, err := c.Write(b); err != nil {
							return
						}
					}
				}()
			} else if tc.method != "GET" {
				io.WriteString(c, "{}")
			}
			select {
			case <-accepted:
			case <-time.After(5 * time.Second):
				t.Fatal("the request never reached the sandbox")
			}

			start := time.Now()
			shutdownDone := make(chan error, 1)
			go func() { shutdownDone <- h.server.Shutdown(context.Background()) }()

			_ = c.SetReadDeadline(time.Now().Add(drain + 5*time.Second))
			resp, err := http.ReadResponse(bufio.NewReader(c), &http.Request{Method: tc.method})
			if err != nil {
				t.Fatalf("no answer at the drain deadline: %v", err)
			}
			body, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != 504 || !resp.Close || !strings.Contains(string(body), `"code":"`+CodeDrainTimeout+`"`) {
				t.Errorf("answer %d (close %v) %s, want 504 %s with Connection: close", resp.StatusCode, resp.Close, body, CodeDrainTimeout)
			}
			if d := time.Since(start); d < drain-50*time.Millisecond {
				t.Errorf("cut %v after the drain began, before its %v deadline", d, drain)
			}
			drainEnds(t, shutdownDone, drain+3*time.Second, "Shutdown did not return")
			if d := time.Since(start); d > drain+time.Second {
				t.Errorf("Shutdown took %v with a %v drain", d, drain)
			}
			// The process exits now: what is not logged by then never is.
			_ = al.Close()
			var line string
			for _, l := range strings.Split(buf.String(), "\n") {
				if strings.Contains(l, `"x_cube_request_id":"cut-`+tc.method+`"`) {
					line = l
				}
			}
			if !strings.Contains(line, `"status":504`) || !strings.Contains(line, `"error_code":"`+CodeDrainTimeout+`"`) {
				t.Errorf("access log line when Shutdown returned: %q", line)
			}
			if _, conns, pending := h.proxy.pools.stats(); conns != 0 || pending != 0 {
				t.Errorf("after Shutdown: %d sandbox connections open, %d requests pending", conns, pending)
			}
		})
	}
}

// A response still streaming at the drain deadline to a client that
// stopped reading (the proxy blocked writing to it, not reading from the
// sandbox) ends at the deadline too, and is logged before Shutdown
// returns: cutting the sandbox's side alone left the write blocked for
// client.write_timeout, and the process exited under it, unlogged.
func TestDrainCutsStreamToStalledClient(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, path, ct string
		pipelined      bool // a request follows, which the proxy leaves unread
	}{
		{"download", "/dl", "", false},
		{"chunked", "/chunked", "", false},
		{"SSE answer to a POST", "/sse", "text/event-stream", false},
		{"download with a request pipelined behind it", "/dl", "", true},
		{"chunked with a request pipelined behind it", "/chunked", "", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const drain = 300 * time.Millisecond
			h, buf, al := drainLogHarness(t, drain)
			port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if tc.ct != "" {
					w.Header().Set("Content-Type", tc.ct)
				}
				if tc.path == "/dl" {
					w.Header().Set("Content-Length", strconv.Itoa(1<<30))
				}
				b := []byte(strings.Repeat("data: x\n\n", 7000))
				for {
					if _, err := w.Write(b); err != nil {
						return
					}
				}
			}))
			host := h.route("stalled", port)
			c, err := net.Dial("tcp", h.addr)
			if err != nil {
				t.Fatal(err)
			}
			_ = c.SetDeadline(time.Now().Add(10 * time.Second))
			defer c.Close()
			fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: %s\r\nX-Cube-Request-Id: stalled\r\nContent-Length: 0\r\n\r\n", tc.path, host)
			if tc.pipelined {
				fmt.Fprintf(c, "GET /next HTTP/1.1\r\nHost: %s\r\n\r\n", host)
			}
			// The head, then nothing more is read: the socket buffers fill.
			if _, err := http.ReadResponse(bufio.NewReader(c), &http.Request{Method: "POST"}); err != nil {
				t.Fatal(err)
			}
			testenv.WaitFor(t, 5*time.Second, "the stream to open", func() bool { s, _ := h.proxy.streams.open(); return s == 1 })
			start := time.Now()
			if err := h.server.Shutdown(context.Background()); err != nil {
				t.Fatal(err)
			}
			if d := time.Since(start); d > drain+time.Second {
				t.Errorf("Shutdown took %v with a %v drain", d, drain)
			}
			_ = al.Close() // the process exits now
			if !strings.Contains(buf.String(), `"x_cube_request_id":"stalled"`) {
				t.Errorf("no access-log line for the stream when Shutdown returned: %q", buf.String())
			}
		})
	}
}

// drainLogHarness is a harness with the given drain timeout and a JSON
// access log into buf (mods change the rest). al is returned so that a
// test can close it when Shutdown returns: what is not logged by then
// never is.
func drainLogHarness(t *testing.T, drain time.Duration, mods ...func(*harnessOpts)) (h *harness, buf *obsLogBuf, al *accesslog.Logger) {
	t.Helper()
	buf = new(obsLogBuf)
	al, err := accesslog.New(accesslog.Config{Format: accesslog.FormatJSON, Output: buf}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = al.Close() })
	return newHarness(t, append([]func(*harnessOpts){func(o *harnessOpts) { o.srv.DrainTimeout = drain; o.cfg.AccessLog = al }}, mods...)...), buf, al
}

// wantDrainCut shuts h down while c waits on request reqID and checks
// that c gets 504 drain_timeout with Connection: close, that Shutdown
// returns soon after the drain deadline, and that the request's access-log
// line (in buf, of al) was written by then: the process exits next.
func wantDrainCut(t *testing.T, h *harness, c net.Conn, method, reqID string, drain time.Duration, buf *obsLogBuf, al *accesslog.Logger) {
	t.Helper()
	start := time.Now()
	shutdownDone := make(chan error, 1)
	go func() { shutdownDone <- h.server.Shutdown(context.Background()) }()

	_ = c.SetReadDeadline(time.Now().Add(drain + 5*time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), &http.Request{Method: method})
	if err != nil {
		t.Fatalf("no answer at the drain deadline: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 504 || !resp.Close || !strings.Contains(string(body), `"code":"`+CodeDrainTimeout+`"`) {
		t.Errorf("answer %d (close %v) %s, want 504 %s with Connection: close", resp.StatusCode, resp.Close, body, CodeDrainTimeout)
	}
	if d := time.Since(start); d > drain+time.Second {
		t.Errorf("answered %v after the drain began, with a %v drain", d, drain)
	}
	drainEnds(t, shutdownDone, drain+5*time.Second, "Shutdown did not return")
	if d := time.Since(start); d > drain+time.Second {
		t.Errorf("Shutdown took %v with a %v drain", d, drain)
	}
	_ = al.Close()
	var line string
	for _, l := range strings.Split(buf.String(), "\n") {
		if strings.Contains(l, `"x_cube_request_id":"`+reqID+`"`) {
			line = l
		}
	}
	if !strings.Contains(line, `"status":504`) || !strings.Contains(line, `"error_code":"`+CodeDrainTimeout+`"`) {
		t.Errorf("access log line when Shutdown returned: %q", line)
	}
}

// A client that stalls halfway through its upload at the drain deadline
// (a phone that lost its signal) is cut then too, as a request waiting on
// its sandbox is: the proxy was blocked reading the client's body, which
// closing the sandbox connection does not wake, so the request ran on to
// client.body_timeout (60 s) and the process exited under it, unanswered
// and unlogged.
func TestDrainCutsStalledUpload(t *testing.T) {
	const drain = 300 * time.Millisecond
	h, buf, al := drainLogHarness(t, drain)
	const sent = 64 << 10
	ln := listen(t, "127.0.0.1:0")
	got := make(chan struct{})
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		// The head and what the client sent of the body, then nothing.
		b := make([]byte, 32<<10)
		n := 0
		for n < sent {
			m, err := c.Read(b)
			if err != nil {
				return
			}
			n += m
		}
		close(got)
		_, _ = io.Copy(io.Discard, c)
	}()
	t.Cleanup(func() { ln.Close() })
	host := h.route("stalled-upload", uint16(ln.Addr().(*net.TCPAddr).Port))

	c, err := net.Dial("tcp", h.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "PUT /up HTTP/1.1\r\nHost: %s\r\nX-Cube-Request-Id: stalled-upload\r\nContent-Length: %d\r\n\r\n", host, 1<<20)
	if _, err := c.Write(make([]byte, sent)); err != nil {
		t.Fatal(err)
	}
	select {
	case <-got:
	case <-time.After(5 * time.Second):
		t.Fatal("the upload never reached the sandbox")
	}
	wantDrainCut(t, h, c, "PUT", "stalled-upload", drain, buf, al)
}

// The plain-HTTP redirect listener is drained with the HTTPS one, when the
// drain begins: it stops accepting and its idle keep-alive connections are
// closed at once, so clients and load balancers move on. It was shut down
// only after the traffic drain ended (up to drain_timeout later): all that
// time it took new connections and kept serving keep-alive ones, and closed
// those idle connections at the very end, under clients about to reuse them.
func TestDrainClosesRedirectListenerAtOnce(t *testing.T) {
	h := newHarness(t, func(o *harnessOpts) { o.srv.DrainTimeout = time.Minute })
	rln := listen(t, "127.0.0.1:0")
	go h.server.ServeRedirect(rln, "8443")

	// A request the sandbox holds keeps the traffic drain going.
	port, accepted := muteSandbox(t, "")
	c, err := net.Dial("tcp", h.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	io.WriteString(c, "GET / HTTP/1.1\r\nHost: "+h.route("held", port)+"\r\n\r\n")
	var sandbox net.Conn
	select {
	case sandbox = <-accepted:
	case <-time.After(5 * time.Second):
		t.Fatal("the request never reached the sandbox")
	}

	// An idle keep-alive connection to the redirect listener.
	rc, err := net.Dial("tcp", rln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	rbr := bufio.NewReader(rc)
	io.WriteString(rc, "GET /a HTTP/1.1\r\nHost: 50005-box.cube.test\r\n\r\n")
	resp, err := http.ReadResponse(rbr, nil)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	if resp.StatusCode != 308 || resp.Close {
		t.Fatalf("redirect %d (close %v), want a kept-alive 308", resp.StatusCode, resp.Close)
	}

	shutdownDone := make(chan error, 1)
	go func() { shutdownDone <- h.server.Shutdown(context.Background()) }()
	h.waitListenerClosed(5 * time.Second)
	testenv.WaitFor(t, 3*time.Second, "the redirect listener refuses connections", func() bool {
		c, err := net.DialTimeout("tcp", rln.Addr().String(), 100*time.Millisecond)
		if err == nil {
			c.Close()
		}
		return err != nil
	})
	_ = rc.SetReadDeadline(time.Now().Add(3 * time.Second))
	if _, err := rbr.ReadByte(); err != io.EOF {
		t.Errorf("idle redirect connection during the drain: %v, want it closed (EOF)", err)
	}

	// The held request still gets its answer, and the drain ends with it.
	io.WriteString(sandbox, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	resp, err = http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("held request: %v", err)
	}
	if resp.StatusCode != 200 || !resp.Close {
		t.Errorf("held request: %d (close %v), want 200 with Connection: close", resp.StatusCode, resp.Close)
	}
	drainEnds(t, shutdownDone, 5*time.Second, "Shutdown did not return after the last request ended")
}

// The process log says when the drain deadline cut what was still open,
// and how much: an operator reading it saw "draining", then "stopped"
// drain_timeout later, and could not tell a drain that finished from one
// that cut WebSockets and requests (with the access log off or in a file,
// nothing said so at all). A drain that finishes in time says nothing.
func TestDrainDeadlineLogged(t *testing.T) {
	for _, tc := range []struct {
		name  string
		cut   bool
		check string
	}{
		{"cut", true, `"websockets":1`},
		{"finished", false, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			logs := new(obsLogBuf)
			h := newHarness(t, func(o *harnessOpts) {
				o.srv.DrainTimeout = 300 * time.Millisecond
				o.cfg.Logger = slog.New(slog.NewJSONHandler(logs, nil))
			})
			if tc.cut {
				ws := dialWS(t, h, h.route("cutws", wsBackend(t, make(chan error, 1))))
				defer ws.CloseNow()
			}
			if err := h.server.Shutdown(context.Background()); err != nil {
				t.Fatal(err)
			}
			out := logs.String()
			var line string
			for _, l := range strings.Split(out, "\n") {
				if strings.Contains(l, "drain deadline") {
					line = l
				}
			}
			if tc.cut && (!strings.Contains(line, `"level":"WARN"`) || !strings.Contains(line, tc.check)) {
				t.Errorf("no warning naming what the deadline cut (%s) in the log:\n%s", tc.check, out)
			}
			if !tc.cut && line != "" {
				t.Errorf("a drain that finished in time logged %s", line)
			}
		})
	}
}

// A client that stalls in what fasthttp reads before the handler runs (a
// request head, the first 8 KiB of a Content-Length body, all of a smaller
// one) is cut at the drain deadline like one that stalls later in its
// upload: answered 504 drain_timeout with Connection: close, and logged
// where the request can be told from a silent connection. Neither the
// stream registry nor pools.abort reached it: it went unanswered until
// its own read timeout (client.read_timeout or client.body_timeout, up to
// a minute), so the process held its unwind for it and then exited under
// it, reset and unlogged.
func TestDrainCutsRequestsStalledBeforeTheHandler(t *testing.T) {
	// Not t.Parallel: it looks at every goroutine of the process.
	const drain = 300 * time.Millisecond
	sandbox := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
	}))
	for _, tc := range []struct {
		name      string
		keepAlive bool // a request answered on the connection first
		stall     string
		readIn    string // the fasthttp read the stall leaves the connection in
		logged    bool
	}{
		{name: "head begun", stall: "POST /up HTTP/1.1\r\nHost: %s\r\nX-Cube-Req", readIn: headRead, logged: true},
		{name: "small body, first request", stall: "POST /up HTTP/1.1\r\nHost: %s\r\nContent-Length: 100\r\n\r\nab", readIn: bodyRead, logged: true},
		{name: "large body's first bytes, first request", stall: "PUT /up HTTP/1.1\r\nHost: %s\r\nContent-Length: 1048576\r\n\r\nab", readIn: bodyRead, logged: true},
		{name: "small body, keep-alive", keepAlive: true, stall: "POST /up HTTP/1.1\r\nHost: %s\r\nContent-Length: 100\r\n\r\nab", readIn: bodyRead, logged: true},
		{name: "large body's first bytes, keep-alive", keepAlive: true, stall: "PUT /up HTTP/1.1\r\nHost: %s\r\nContent-Length: 1048576\r\n\r\nab", readIn: bodyRead, logged: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, buf, al := drainLogHarness(t, drain)
			host := h.route("stall", sandbox)
			c, err := net.Dial("tcp", h.addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			br := bufio.NewReader(c)
			if tc.keepAlive {
				fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: %s\r\n\r\n", host)
				resp, err := http.ReadResponse(br, nil)
				if err != nil {
					t.Fatal(err)
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				if resp.StatusCode != 200 {
					t.Fatalf("first request: %d", resp.StatusCode)
				}
			}
			fmt.Fprintf(c, tc.stall, host)
			// Once fasthttp waits for the rest, the connection is no
			// longer idle: Shutdown would otherwise close a keep-alive one
			// under the request it had not read yet.
			testenv.WaitFor(t, 5*time.Second, "fasthttp waiting for the rest of the request", func() bool {
				_, stacks := liveGoroutines()
				return strings.Contains(strings.Join(stacks, "\n"), tc.readIn)
			})

			start := time.Now()
			shutdownDone := make(chan error, 1)
			go func() { shutdownDone <- h.server.Shutdown(context.Background()) }()
			_ = c.SetReadDeadline(time.Now().Add(drain + 5*time.Second))
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatalf("no answer at the drain deadline: %v", err)
			}
			body, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != 504 || !resp.Close || !strings.Contains(string(body), `"code":"`+CodeDrainTimeout+`"`) {
				t.Errorf("answer %d (close %v) %s, want 504 %s with Connection: close", resp.StatusCode, resp.Close, body, CodeDrainTimeout)
			}
			drainEnds(t, shutdownDone, drain+5*time.Second, "Shutdown did not return")
			if d := time.Since(start); d > drain+time.Second {
				t.Errorf("Shutdown took %v with a %v drain: it waited for the stalled client", d, drain)
			}
			_ = al.Close()
			cut := strings.Count(buf.String(), `"error_code":"`+CodeDrainTimeout+`"`)
			if want := map[bool]int{true: 1, false: 0}[tc.logged]; cut != want {
				t.Errorf("%d access-log lines for a drain cut, want %d:\n%s", cut, want, buf)
			}
		})
	}
}

// The fasthttp functions a connection waits in for the rest of a request
// head, and of the part of a body read before the handler.
const (
	headRead = "fasthttp.(*RequestHeader).Read("
	bodyRead = "fasthttp.(*Request).ContinueReadBodyStream("
)

// During a drain the probes say what Kubernetes needs (README,
// Observability, Health): /readyz answers 503 "draining", so the load
// balancer stops sending, and /admin/healthz stays 200 with
// "draining":true, so the liveness probe does not restart a pod that is
// finishing its requests. Both on the admin listener, which stays open
// until the drain ends (without reuse_port), as does the metrics listener
// (metrics_addr), whose scrape must see the drain through.
func TestDrainProbes(t *testing.T) {
	h, metrics := metricsHarness(t, "", func(o *harnessOpts) { o.srv.DrainTimeout = 30 * time.Second })
	scrape := func() (int, string, error) {
		resp, err := h.client.Get("http://" + metrics + "/metrics")
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), err
	}
	unblock, held := holdDrain(t, h, "drainprobe")
	shutdownDone := make(chan error, 1)
	go func() { shutdownDone <- h.server.Shutdown(context.Background()) }()

	testenv.WaitFor(t, 10*time.Second, `/readyz 503 "draining"`, func() bool {
		st, body := h.adminDo("GET", "/readyz", "", "")
		return st == 503 && strings.Contains(body, `"reason":"draining"`)
	})
	if st, out := h.adminJSON("GET", "/admin/healthz", ""); st != 200 || out["ok"] != true || out["draining"] != true {
		t.Fatalf("healthz during the drain: %d %v, want 200 with draining true", st, out)
	}
	if st, body, err := scrape(); st != 200 || body != "scrape\n" {
		t.Fatalf("scrape on the metrics listener during the drain: %d %q %v", st, body, err)
	}
	unblock()
	if code := <-held; code != 200 {
		t.Fatalf("the request the drain waited for: %d, want 200", code)
	}
	drainEnds(t, shutdownDone, 40*time.Second, "the drain outlived its deadline (30 s) after the request it waited for")
	h.client.CloseIdleConnections()
	if _, err := net.DialTimeout("tcp", metrics, time.Second); err == nil {
		t.Fatal("the metrics listener still accepts after the drain")
	}
}

// A client that sent its next request (pipelined, or as soon as the head
// of the answer came) while a download was still going out when the drain
// began gets the whole download, then the end of the connection, over
// plain HTTP as over TLS: fasthttp closes the connection once the answer
// ends, and closed with the next request unread the socket was reset,
// which threw away what of the download the kernel had not sent yet (on
// the binary: 4.4 of 8 MiB, then ECONNRESET, logged as 200 with every byte
// sent). nginx 1.22's nginx -s quit delivered all of it.
func TestDrainDeliversAnswerAheadOfNextRequest(t *testing.T) {
	const size = 8 << 20
	for _, useTLS := range []bool{false, true} {
		t.Run(fmt.Sprintf("tls=%v", useTLS), func(t *testing.T) {
			h := newHarness(t, func(o *harnessOpts) { o.srv.DrainTimeout = 20 * time.Second })
			port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Length", strconv.Itoa(size))
				_, _ = w.Write(make([]byte, size))
			}))
			host := h.route("pipebox", port)
			var c net.Conn
			if !useTLS {
				c = dialRaw(t, h.addr)
				// A small window, as over a real network: more of the
				// download waits in the proxy's socket when it ends.
				_ = c.(*net.TCPConn).SetReadBuffer(32 << 10)
			} else {
				addr, roots := serveTLS(t, h)
				tc, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: roots, ServerName: host})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { tc.Close() })
				_ = tc.SetDeadline(time.Now().Add(10 * time.Second))
				c = tc
			}
			fmt.Fprintf(c, "GET /big HTTP/1.1\r\nHost: %s\r\n\r\n", host)
			br := bufio.NewReader(c)
			resp, err := http.ReadResponse(br, nil)
			if err != nil || resp.StatusCode != 200 {
				t.Fatalf("download: %v %v", resp, err)
			}
			// The download is going out: its first bytes are here, and the
			// rest waits on this client, which reads no more for now.
			if _, err := io.ReadFull(resp.Body, make([]byte, 64<<10)); err != nil {
				t.Fatalf("the download's first bytes: %v", err)
			}
			shutdownDone := make(chan error, 1)
			go func() { shutdownDone <- h.server.Shutdown(context.Background()) }()
			h.waitListenerClosed(10 * time.Second)
			fmt.Fprintf(c, "GET /next HTTP/1.1\r\nHost: %s\r\n\r\n", host)
			n, err := io.Copy(io.Discard, resp.Body)
			if err != nil || n != size-64<<10 {
				t.Fatalf("the download during the drain: %d of %d bytes after the first 64 KiB, %v", n, size-64<<10, err)
			}
			// Then the connection ends; the next request is not answered
			// (the client sends it again elsewhere).
			if b, err := br.ReadByte(); err == nil {
				t.Fatalf("more after the download: %q", b)
			}
			c.Close()
			drainEnds(t, shutdownDone, 10*time.Second, "the drain did not end after the client left")
		})
	}
}

// drainEnds waits up to within for Shutdown's result on done, and fails
// the test with msg when none comes, or with the error it returned.
func drainEnds(t *testing.T, done <-chan error, within time.Duration, msg string) {
	t.Helper()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Shutdown: %v", err)
		}
	case <-time.After(within):
		t.Fatal(msg)
	}
}

// drainGoesOn fails the test with msg when Shutdown has returned on done.
func drainGoesOn(t *testing.T, done <-chan error, msg string) {
	t.Helper()
	select {
	case err := <-done:
		t.Fatalf("%s (Shutdown returned %v)", msg, err)
	default:
	}
}

// A small answer (read whole, so not a stream the registry lists) that
// fasthttp writes to a client taking none of it is cut once the drain
// deadline and its grace have passed, as nginx's worker_shutdown_timeout
// closes every connection, also one whose write began after the deadline:
// the client pipelined more answers than the socket buffers hold and
// reads nothing. Earlier builds left the write alone: Shutdown waited out
// its whole unwind, 2 s past the deadline, and the process exited under
// it.
func TestDrainCutsSmallAnswerToStalledClient(t *testing.T) {
	t.Parallel()
	const drain = 300 * time.Millisecond
	h, _, _ := drainLogHarness(t, drain)
	body := strings.Repeat("x", 60<<10) // under wholeBody: read whole
	var answered atomic.Int64
	port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		answered.Add(1)
		w.Header().Set("Content-Length", strconv.Itoa(len(body)))
		io.WriteString(w, body)
	}))
	host := h.route("smallstall", port)
	c, err := net.Dial("tcp", h.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.(*net.TCPConn).SetReadBuffer(4096)
	// 12 MB of answers, more than both sockets' buffers: the proxy's
	// writes stall, whether they began before the deadline or after.
	var reqs strings.Builder
	for i := range 200 {
		fmt.Fprintf(&reqs, "GET /%d HTTP/1.1\r\nHost: %s\r\n\r\n", i, host)
	}
	if _, err := io.WriteString(c, reqs.String()); err != nil {
		t.Fatal(err)
	}
	// The proxy forwards the next request once it has written the answer
	// before (the sandbox answers at once): a count that stands still is a
	// write that waits. Began to drain before that, fasthttp would finish
	// the answer in hand and close the connection, nothing stalled.
	last, since := int64(0), time.Now()
	testenv.WaitFor(t, 10*time.Second, "the proxy's write to stall", func() bool {
		if n := answered.Load(); n != last {
			last, since = n, time.Now()
		}
		return last > 0 && time.Since(since) > 200*time.Millisecond
	})
	if n := answered.Load(); n == 200 {
		t.Fatal("every answer went out: the socket buffers held them all")
	}
	start := time.Now()
	shutdownDone := make(chan error, 1)
	go func() { shutdownDone <- h.server.Shutdown(context.Background()) }()
	drainEnds(t, shutdownDone, drain+10*time.Second, "Shutdown did not return")
	if d := time.Since(start); d > drain+drainWriteGrace+time.Second {
		t.Errorf("Shutdown took %v with a %v drain: the stalled answer was not cut", d, drain)
	}
}
