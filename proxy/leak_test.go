package proxy

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
	"github.com/cube-sandbox/cubeproxy/telemetry"
)

// The leak tests drive exchanges that end in every way an exchange can end
// and check that each gives back everything it took: goroutines, client
// and sandbox sockets, max_conns slots, the sandbox's request count, the
// registries of open streams, tunnels, hijacks and watched SSE clients,
// pooled readers, and the open connection/stream/WebSocket gauges.

// leakStep is one request as the scripted sandbox received it: the test
// answers it (through w, or the raw connection after hijack) and ends it.
type leakStep struct {
	w    http.ResponseWriter
	r    *http.Request
	done chan struct{}
	over bool
	env  *leakEnv
}

// end lets the sandbox's handler return (net/http then finishes the
// answer, or forgets a hijacked connection).
func (s *leakStep) end() {
	if !s.over {
		s.over = true
		close(s.done)
	}
}

// raw takes the sandbox's connection over: the test writes the answer
// byte by byte (and closes or resets it) itself.
func (s *leakStep) raw(t *testing.T) (*net.TCPConn, *bufio.Reader) {
	t.Helper()
	c, brw, err := s.w.(http.Hijacker).Hijack()
	if err != nil {
		t.Fatal(err)
	}
	s.end()
	s.env.conns = append(s.env.conns, c)
	return c.(*net.TCPConn), brw.Reader
}

// answer answers with body b.
func (s *leakStep) answer(b string) {
	io.WriteString(s.w, b)
	s.end()
}

// write sends b as part of the answer, at once.
func (s *leakStep) write(b string) {
	io.WriteString(s.w, b)
	s.w.(http.Flusher).Flush()
}

type leakEnv struct {
	h     *harness
	tel   *telemetry.Telemetry
	host  string
	steps chan *leakStep
	conns []net.Conn // the test's ends, closed by check
	// incarnation counts the route changes recreate made (ledger_test.go).
	incarnation int
}

func newLeakEnv(t *testing.T, mod func(*harnessOpts)) *leakEnv {
	t.Helper()
	e := &leakEnv{tel: obsTelemetry(t, nil), steps: make(chan *leakStep)}
	e.h = newHarness(t, func(o *harnessOpts) {
		o.cfg.Telemetry = e.tel
		o.cfg.MaxRequestBodySize = 1 << 10
		if mod != nil {
			mod(o)
		}
	})
	port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s := &leakStep{w: w, r: r, done: make(chan struct{}), env: e}
		select {
		case e.steps <- s:
		case <-r.Context().Done():
			return
		}
		<-s.done
	}))
	e.host = e.h.route("sbxleak", port)
	return e
}

// next is the sandbox's next request.
func (e *leakEnv) next(t *testing.T) *leakStep {
	t.Helper()
	select {
	case s := <-e.steps:
		t.Cleanup(s.end)
		return s
	case <-time.After(5 * time.Second):
		t.Fatal("the sandbox got no request")
		return nil
	}
}

// noStep checks that no request reached the sandbox.
func (e *leakEnv) noStep(t *testing.T) {
	t.Helper()
	select {
	case s := <-e.steps:
		s.end()
		t.Fatalf("the sandbox got %s %s", s.r.Method, s.r.URL)
	default:
	}
}

// dial opens a client connection to the proxy.
func (e *leakEnv) dial(t *testing.T) (*net.TCPConn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("tcp", e.h.addr)
	if err != nil {
		t.Fatal(err)
	}
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	e.conns = append(e.conns, c)
	return c.(*net.TCPConn), bufio.NewReader(c)
}

// head is a request head for the scripted sandbox.
func (e *leakEnv) head(method, path, extra string) string {
	return method + " " + path + " HTTP/1.1\r\nHost: " + e.host + "\r\n" + extra + "\r\n"
}

const leakUpgrade = "Connection: Upgrade\r\nUpgrade: websocket\r\n"

func leakSend(t *testing.T, c net.Conn, s string) {
	t.Helper()
	if _, err := io.WriteString(c, s); err != nil {
		t.Fatal(err)
	}
}

func leakResponse(t *testing.T, br *bufio.Reader, method string, status int) *http.Response {
	t.Helper()
	resp, err := http.ReadResponse(br, &http.Request{Method: method})
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != status {
		// The body names the code: which cut came first.
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<10))
		t.Fatalf("status %d %s, want %d", resp.StatusCode, body, status)
	}
	return resp
}

// readUntil reads r until it has seen want.
func readUntil(t *testing.T, r io.Reader, want string) {
	t.Helper()
	var got []byte
	b := make([]byte, 4096)
	for !strings.Contains(string(got), want) {
		n, err := r.Read(b)
		got = append(got, b[:n]...)
		if err != nil {
			t.Fatalf("read %q, waiting for %q: %v", got, want, err)
		}
	}
}

// readEOF reads c until the proxy closes it.
func readEOF(t *testing.T, c net.Conn) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.Copy(io.Discard, c); err != nil && !isConnReset(err) {
		t.Fatalf("waiting for the proxy to close: %v", err)
	}
}

// openStreamsGone waits until the proxy holds no stream or tunnel: an end
// that only the proxy can notice (a client hang-up) has been noticed.
func (e *leakEnv) openStreamsGone(t *testing.T) {
	t.Helper()
	testenv.WaitFor(t, 5*time.Second, "the stream to end", func() bool {
		s, tn := e.h.proxy.streams.open()
		return s == 0 && tn == 0
	})
}

// leakBaseline is what the process holds with nothing in flight.
type leakBaseline struct{ fds, goroutines int }

func takeBaseline(t *testing.T, e *leakEnv) leakBaseline {
	t.Helper()
	e.check(t, leakBaseline{fds: 1 << 30, goroutines: 1 << 30})
	g, _ := liveGoroutines()
	return leakBaseline{fds: testenv.OpenFDs(t), goroutines: g}
}

// countFDs counts the open descriptors whose link reads target.
func countFDs(t *testing.T, target string) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skip("no /proc/self/fd:", err)
	}
	n := 0
	for _, d := range ents {
		if l, _ := os.Readlink("/proc/self/fd/" + d.Name()); l == target {
			n++
		}
	}
	return n
}

// liveGoroutines counts goroutines, leaving out fasthttp's idle workers
// (parked for MaxIdleWorkerDuration after serving a connection) and the
// route cache's idle store-call goroutines (kept as long), and returns
// their stacks.
func liveGoroutines() (int, []string) {
	var live []string
	for _, g := range testenv.Stacks() {
		if strings.Contains(g, "(*workerPool).workerFunc") && !strings.Contains(g, "serveConn") {
			continue
		}
		if strings.Contains(g, "routing.(*Cache).loader") && !strings.Contains(g, "routing.(*Cache).fly") {
			continue
		}
		live = append(live, g)
	}
	return len(live), live
}

// leakState is every counter that must be back at rest.
func (e *leakEnv) leakState(t *testing.T) string {
	p := e.h.proxy
	var out []string
	if s, tn := p.streams.open(); s != 0 || tn != 0 {
		out = append(out, fmt.Sprintf("registry: %d streams, %d tunnels", s, tn))
	}
	hijacks := 0
	p.hijacks.Range(func(any, any) bool { hijacks++; return true })
	if hijacks != 0 {
		out = append(out, fmt.Sprintf("%d pending hijacks", hijacks))
	}
	if n := watchedHangups(p.hangups); n != 0 {
		out = append(out, fmt.Sprintf("%d watched SSE clients", n))
	}
	p.sandboxes.m.Range(func(k, v any) bool {
		if n := v.(*sandboxState).inFlight(); n != 0 {
			out = append(out, fmt.Sprintf("sandbox %s: %d requests in flight", k, n))
		}
		return true
	})
	if n := p.readersOut.Load(); n != 0 {
		out = append(out, fmt.Sprintf("%d upstream readers out", n))
	}
	p.pools.mu.RLock()
	for k, u := range p.pools.m {
		u.mu.Lock()
		idle, busy := len(u.idle), u.busy != nil
		u.mu.Unlock()
		if c, pend := u.conns.Load(), u.pending.Load(); int(c) != idle || pend != 0 || busy {
			out = append(out, fmt.Sprintf("pool %v: %d connections counted, %d idle, %d pending, busy list empty %v", k, c, idle, pend, !busy))
		}
	}
	p.pools.mu.RUnlock()
	rec := httptest.NewRecorder()
	e.tel.MetricsHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	samples, err := testenv.ParsePromText(rec.Body)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"cubeproxy_connections_open", "cubeproxy_streams_open", "cubeproxy_websockets_open"} {
		var v float64
		for _, s := range samples {
			if s.Name == name {
				v += s.Value
			}
		}
		if v != 0 {
			out = append(out, fmt.Sprintf("%s = %v", name, v))
		}
	}
	return strings.Join(out, "; ")
}

// waitEnded waits up to 5 s for every exchange to end, and fails with
// what is still open: a bare timeout under load says nothing to go on.
func (e *leakEnv) waitEnded(t *testing.T) {
	t.Helper()
	testenv.Eventually(t, 5*time.Second, func() error {
		if state := e.leakState(t); state != "" {
			return fmt.Errorf("not released: %s", state)
		}
		return nil
	})
}

// check waits until everything is back at rest, then closes the idle
// sandbox connections and waits for the descriptor and goroutine counts
// to come back to base.
func (e *leakEnv) check(t *testing.T, base leakBaseline) {
	t.Helper()
	e.noStep(t)
	// The test's own ends of its connections (the proxy's must close by
	// themselves: they are what is counted).
	for _, c := range e.conns {
		c.Close()
	}
	e.conns = nil
	e.waitEnded(t)
	e.h.proxy.pools.closeIdle()
	var fds, gs int
	var stacks []string
	deadline := time.Now().Add(5 * time.Second)
	for {
		fds = testenv.OpenFDs(t)
		gs, stacks = liveGoroutines()
		if fds <= base.fds && gs <= base.goroutines+2 {
			return
		}
		if time.Now().After(deadline) {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	if fds > base.fds {
		links := ""
		ents, _ := os.ReadDir("/proc/self/fd")
		for _, d := range ents {
			l, _ := os.Readlink("/proc/self/fd/" + d.Name())
			links += " " + l
		}
		tcp, _ := os.ReadFile("/proc/net/tcp")
		t.Errorf("%d descriptors open, %d at the start:%s\n%s", fds, base.fds, links, tcp)
	}
	if gs > base.goroutines+2 {
		t.Errorf("%d goroutines, %d at the start:\n%s", gs, base.goroutines, strings.Join(stacks, "\n\n"))
	}
	t.FailNow()
}

type leakCase struct {
	name string
	run  func(t *testing.T, e *leakEnv)
}

// leakEnds is every way an exchange ends with the default timeouts.
var leakEnds = []leakCase{
	{"plain, twice on a keep-alive connection", func(t *testing.T, e *leakEnv) {
		c, br := e.dial(t)
		for range 2 {
			leakSend(t, c, e.head("GET", "/", ""))
			e.next(t).answer("hello")
			resp := leakResponse(t, br, "GET", 200)
			io.Copy(io.Discard, resp.Body)
		}
		c.Close()
	}},
	{"HEAD", func(t *testing.T, e *leakEnv) {
		c, br := e.dial(t)
		leakSend(t, c, e.head("HEAD", "/", ""))
		s := e.next(t)
		s.w.Header().Set("Content-Length", "5")
		s.end()
		leakResponse(t, br, "HEAD", 200)
		c.Close()
	}},
	{"pipelined", func(t *testing.T, e *leakEnv) {
		c, br := e.dial(t)
		leakSend(t, c, e.head("GET", "/1", "")+e.head("GET", "/2", ""))
		e.next(t).answer("one")
		e.next(t).answer("two")
		for range 2 {
			io.Copy(io.Discard, leakResponse(t, br, "GET", 200).Body)
		}
		c.Close()
	}},
	{"download whole", func(t *testing.T, e *leakEnv) {
		c, br := e.dial(t)
		leakSend(t, c, e.head("GET", "/", ""))
		s := e.next(t)
		s.w.Header().Set("Content-Length", fmt.Sprint(3*wholeBody))
		s.write(strings.Repeat("d", 3*wholeBody))
		s.end()
		resp := leakResponse(t, br, "GET", 200)
		if n, _ := io.Copy(io.Discard, resp.Body); n != 3*wholeBody {
			t.Fatalf("%d bytes", n)
		}
		c.Close()
	}},
	{"download, client resets mid-body", func(t *testing.T, e *leakEnv) {
		c, br := e.dial(t)
		leakSend(t, c, e.head("GET", "/", ""))
		s := e.next(t)
		s.w.Header().Set("Content-Length", fmt.Sprint(3*wholeBody))
		s.write(strings.Repeat("d", wholeBody))
		resp := leakResponse(t, br, "GET", 200)
		io.ReadFull(resp.Body, make([]byte, 1024))
		reset(c)
		s.write(strings.Repeat("d", 2*wholeBody))
		s.end()
	}},
	{"chunked whole, then a second stream on the connection", func(t *testing.T, e *leakEnv) {
		c, br := e.dial(t)
		for range 2 {
			leakSend(t, c, e.head("GET", "/", ""))
			s := e.next(t)
			s.write("piece one\n")
			s.write("piece two\n")
			s.end()
			io.Copy(io.Discard, leakResponse(t, br, "GET", 200).Body)
		}
		c.Close()
	}},
	{"chunked, client closes mid-body", func(t *testing.T, e *leakEnv) {
		c, br := e.dial(t)
		leakSend(t, c, e.head("GET", "/", ""))
		s := e.next(t)
		s.write("piece one\n")
		resp := leakResponse(t, br, "GET", 200)
		readUntil(t, resp.Body, "piece one")
		c.Close()
		// Found on the next write (no hang-up watch for a non-SSE body).
		s.write("piece two\n")
		s.write("piece three\n")
		s.end()
	}},
	{"SSE GET (detached), sandbox ends it", func(t *testing.T, e *leakEnv) {
		c, br := e.dial(t)
		s, resp := e.sseOpen(t, c, br, "GET")
		s.end()
		io.Copy(io.Discard, resp.Body)
		readEOF(t, c)
	}},
	{"SSE GET (detached), client closes", func(t *testing.T, e *leakEnv) {
		c, br := e.dial(t)
		s, _ := e.sseOpen(t, c, br, "GET")
		c.Close()
		e.openStreamsGone(t)
		s.end()
	}},
	{"SSE GET (detached), client resets before the first event", func(t *testing.T, e *leakEnv) {
		c, br := e.dial(t)
		leakSend(t, c, e.head("GET", "/sse", ""))
		s := e.next(t)
		sseHeaders(s.w)
		leakResponse(t, br, "GET", 200)
		reset(c)
		e.openStreamsGone(t)
		s.end()
	}},
	{"SSE POST, client closes", func(t *testing.T, e *leakEnv) {
		c, br := e.dial(t)
		s, _ := e.sseOpen(t, c, br, "POST")
		c.Close()
		e.openStreamsGone(t)
		s.end()
	}},
	{"SSE POST twice on a keep-alive connection, client closes during the second", func(t *testing.T, e *leakEnv) {
		c, br := e.dial(t)
		leakSend(t, c, e.head("POST", "/mcp", "Content-Length: 2\r\n")+"{}")
		s := e.next(t)
		sseHeaders(s.w)
		s.write("data: one\n\n")
		s.end()
		io.Copy(io.Discard, leakResponse(t, br, "POST", 200).Body)
		leakSend(t, c, e.head("POST", "/mcp", "Content-Length: 2\r\n")+"{}")
		s = e.next(t)
		sseHeaders(s.w)
		s.write("data: two\n\n")
		readUntil(t, leakResponse(t, br, "POST", 200).Body, "data: two")
		c.Close()
		e.openStreamsGone(t)
		s.end()
	}},
	{"SSE POST, client half-closes", func(t *testing.T, e *leakEnv) {
		c, br := e.dial(t)
		s, _ := e.sseOpen(t, c, br, "POST")
		c.CloseWrite()
		e.openStreamsGone(t)
		s.end()
		readEOF(t, c)
	}},
	{"client closes while the sandbox thinks", func(t *testing.T, e *leakEnv) {
		c, _ := e.dial(t)
		leakSend(t, c, e.head("GET", "/", ""))
		s := e.next(t)
		c.Close()
		s.write("late")
		s.end()
	}},
	{"client resets while the sandbox thinks", func(t *testing.T, e *leakEnv) {
		c, _ := e.dial(t)
		leakSend(t, c, e.head("GET", "/", ""))
		s := e.next(t)
		reset(c)
		s.write("late")
		s.end()
	}},
	{"client closes mid-head", func(t *testing.T, e *leakEnv) {
		c, _ := e.dial(t)
		leakSend(t, c, "GET / HTTP/1.1\r\nHost: "+e.host+"\r\nX-Half")
		c.Close()
	}},
	{"client half-closes after its request", func(t *testing.T, e *leakEnv) {
		// A half-close is a departure once the sandbox has not answered
		// within clientCheck (a 499): this case is the quick answer, which
		// a client that only half-closed still reads. A stall of the
		// test's own goroutine past clientCheck (loaded cores) makes it
		// the other ending, which must give everything back as well:
		// again, up to three times.
		for attempt := 1; ; attempt++ {
			c, br := e.dial(t)
			leakSend(t, c, e.head("GET", "/", "X-Attempt: "+itoa(uint16(attempt))+"\r\n"))
			c.CloseWrite()
			got := make(chan *http.Response, 1)
			go func() {
				resp, _ := http.ReadResponse(br, &http.Request{Method: "GET"})
				got <- resp
			}()
			var resp *http.Response
		wait:
			for {
				select {
				case s := <-e.steps:
					t.Cleanup(s.end)
					if s.r.Header.Get("X-Attempt") != itoa(uint16(attempt)) {
						s.end() // an earlier attempt's, its exchange already over
						continue
					}
					s.answer("hello")
					resp = <-got // c's deadline bounds it
					break wait
				case resp = <-got: // over before the sandbox's handler was reached
					break wait
				case <-time.After(5 * time.Second):
					t.Fatal("neither the sandbox nor the client got anything")
				}
			}
			if resp == nil {
				t.Fatal("no answer to a client that only half-closed")
			}
			body, _ := io.ReadAll(resp.Body)
			readEOF(t, c)
			if resp.StatusCode == 499 && attempt < 3 {
				t.Logf("attempt %d: the sandbox's answer came after clientCheck (%s); again", attempt, strings.TrimSpace(string(body)))
				continue
			}
			if resp.StatusCode != 200 || string(body) != "hello" {
				t.Fatalf("status %d %q, want 200 \"hello\"", resp.StatusCode, body)
			}
			return
		}
	}},
	{"client resets mid-upload", func(t *testing.T, e *leakEnv) {
		c, _ := e.dial(t)
		leakSend(t, c, e.head("POST", "/", "Transfer-Encoding: chunked\r\n")+"10\r\n0123456789")
		s := e.next(t)
		reset(c)
		io.Copy(io.Discard, s.r.Body)
		s.end()
	}},
	{"body too large (lingering close)", func(t *testing.T, e *leakEnv) {
		c, br := e.dial(t)
		leakSend(t, c, e.head("POST", "/", "Content-Length: 4096\r\n")+strings.Repeat("b", 4096))
		leakResponse(t, br, "POST", 413)
		c.Close()
	}},
	{"chunked body too large", func(t *testing.T, e *leakEnv) {
		c, br := e.dial(t)
		leakSend(t, c, e.head("POST", "/", "Transfer-Encoding: chunked\r\n")+"800\r\n"+strings.Repeat("b", 0x800)+"\r\n")
		s := e.next(t)
		io.Copy(io.Discard, s.r.Body)
		s.end()
		leakResponse(t, br, "POST", 413)
		c.Close()
	}},
	{"sandbox resets before the head", func(t *testing.T, e *leakEnv) {
		c, br := e.dial(t)
		leakSend(t, c, e.head("GET", "/", ""))
		sc, _ := e.next(t).raw(t)
		reset(sc)
		io.Copy(io.Discard, leakResponse(t, br, "GET", 502).Body)
		c.Close()
	}},
	{"sandbox closes before the head", func(t *testing.T, e *leakEnv) {
		c, br := e.dial(t)
		leakSend(t, c, e.head("GET", "/", ""))
		sc, _ := e.next(t).raw(t)
		sc.Close()
		io.Copy(io.Discard, leakResponse(t, br, "GET", 502).Body)
		c.Close()
	}},
	{"sandbox closes a pooled connection under a GET (re-sent)", func(t *testing.T, e *leakEnv) {
		c, br := e.dial(t)
		leakSend(t, c, e.head("GET", "/", ""))
		e.next(t).answer("first")
		io.Copy(io.Discard, leakResponse(t, br, "GET", 200).Body)
		leakSend(t, c, e.head("GET", "/", ""))
		sc, _ := e.next(t).raw(t) // on the pooled connection
		sc.Close()
		e.next(t).answer("again") // on a new one
		io.Copy(io.Discard, leakResponse(t, br, "GET", 200).Body)
		c.Close()
	}},
	{"sandbox resets a pooled connection under a POST (502)", func(t *testing.T, e *leakEnv) {
		c, br := e.dial(t)
		leakSend(t, c, e.head("GET", "/", ""))
		e.next(t).answer("first")
		io.Copy(io.Discard, leakResponse(t, br, "GET", 200).Body)
		leakSend(t, c, e.head("POST", "/", "Content-Length: 2\r\n")+"hi")
		sc, _ := e.next(t).raw(t)
		reset(sc)
		io.Copy(io.Discard, leakResponse(t, br, "POST", 502).Body)
		c.Close()
	}},
	{"sandbox resets a pooled connection while idle", func(t *testing.T, e *leakEnv) {
		c, br := e.dial(t)
		leakSend(t, c, e.head("GET", "/", ""))
		sc, _ := e.next(t).raw(t)
		io.WriteString(sc, "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nfirst")
		io.Copy(io.Discard, leakResponse(t, br, "GET", 200).Body)
		reset(sc)
		leakSend(t, c, e.head("GET", "/", ""))
		e.next(t).answer("again")
		io.Copy(io.Discard, leakResponse(t, br, "GET", 200).Body)
		c.Close()
	}},
	{"sandbox closes mid fixed-length body", func(t *testing.T, e *leakEnv) {
		c, br := e.dial(t)
		leakSend(t, c, e.head("GET", "/", ""))
		sc, _ := e.next(t).raw(t)
		io.WriteString(sc, fmt.Sprintf("HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s", 3*wholeBody, strings.Repeat("x", wholeBody)))
		resp := leakResponse(t, br, "GET", 200)
		io.ReadFull(resp.Body, make([]byte, 1024))
		sc.Close()
		io.Copy(io.Discard, resp.Body)
		readEOF(t, c)
	}},
	{"sandbox resets mid chunked body", func(t *testing.T, e *leakEnv) {
		c, br := e.dial(t)
		leakSend(t, c, e.head("GET", "/", ""))
		sc, _ := e.next(t).raw(t)
		io.WriteString(sc, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nabcd\r\n")
		resp := leakResponse(t, br, "GET", 200)
		readUntil(t, resp.Body, "abcd")
		reset(sc)
		io.Copy(io.Discard, resp.Body)
		readEOF(t, c)
	}},
	{"sandbox breaks its chunk framing with the head (502)", func(t *testing.T, e *leakEnv) {
		c, br := e.dial(t)
		leakSend(t, c, e.head("GET", "/", ""))
		sc, _ := e.next(t).raw(t)
		io.WriteString(sc, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n")
		io.Copy(io.Discard, leakResponse(t, br, "GET", 502).Body)
		c.Close()
	}},
	{"sandbox breaks its chunk framing mid-body", func(t *testing.T, e *leakEnv) {
		c, br := e.dial(t)
		leakSend(t, c, e.head("GET", "/", ""))
		sc, _ := e.next(t).raw(t)
		io.WriteString(sc, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nabcd\r\n")
		resp := leakResponse(t, br, "GET", 200)
		readUntil(t, resp.Body, "abcd")
		io.WriteString(sc, "zz\r\n")
		io.Copy(io.Discard, resp.Body)
		readEOF(t, c)
	}},
	{"sandbox ends a close-delimited body", func(t *testing.T, e *leakEnv) {
		c, br := e.dial(t)
		leakSend(t, c, e.head("GET", "/", ""))
		sc, _ := e.next(t).raw(t)
		io.WriteString(sc, "HTTP/1.1 200 OK\r\n\r\nuntil close")
		resp := leakResponse(t, br, "GET", 200)
		readUntil(t, resp.Body, "until close")
		sc.Close()
		io.Copy(io.Discard, resp.Body)
		c.Close()
	}},
	{"sandbox resets a detached SSE stream", func(t *testing.T, e *leakEnv) {
		c, br := e.dial(t)
		leakSend(t, c, e.head("GET", "/sse", ""))
		sc, _ := e.next(t).raw(t)
		io.WriteString(sc, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
		resp := leakResponse(t, br, "GET", 200)
		io.WriteString(sc, "b\r\ndata: one\n\n\r\n")
		readUntil(t, resp.Body, "data: one")
		reset(sc)
		readEOF(t, c)
	}},
	{"sandbox resets an SSE POST stream", func(t *testing.T, e *leakEnv) {
		c, br := e.dial(t)
		leakSend(t, c, e.head("POST", "/mcp", "Content-Length: 2\r\n")+"{}")
		sc, _ := e.next(t).raw(t)
		io.WriteString(sc, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\nb\r\ndata: one\n\n\r\n")
		resp := leakResponse(t, br, "POST", 200)
		readUntil(t, resp.Body, "data: one")
		reset(sc)
		io.Copy(io.Discard, resp.Body)
		readEOF(t, c)
	}},
	{"unknown sandbox", func(t *testing.T, e *leakEnv) {
		c, br := e.dial(t)
		leakSend(t, c, "GET / HTTP/1.1\r\nHost: 80-sbxleakmissing.cube.test\r\n\r\n")
		io.Copy(io.Discard, leakResponse(t, br, "GET", 404).Body)
		c.Close()
	}},
	{"WebSocket, client closes", func(t *testing.T, e *leakEnv) {
		c, br, sc, sbr := e.tunnel(t)
		leakEcho(t, c, br, sc, sbr)
		c.Close()
		readEOF(t, sc)
	}},
	{"WebSocket, client resets", func(t *testing.T, e *leakEnv) {
		c, br, sc, sbr := e.tunnel(t)
		leakEcho(t, c, br, sc, sbr)
		reset(c)
		readEOF(t, sc)
	}},
	{"WebSocket, client half-closes", func(t *testing.T, e *leakEnv) {
		c, br, sc, sbr := e.tunnel(t)
		leakEcho(t, c, br, sc, sbr)
		c.CloseWrite()
		readEOF(t, sc) // the client's FIN; the sandbox's side stays open
		sc.Close()
		readEOF(t, c)
	}},
	{"WebSocket, sandbox closes (lingering close), client closes after", func(t *testing.T, e *leakEnv) {
		c, br, sc, sbr := e.tunnel(t)
		leakEcho(t, c, br, sc, sbr)
		io.WriteString(sc, "bye")
		sc.Close()
		readUntil(t, br, "bye")
		e.openStreamsGone(t) // the exchange ended; the client lingers
		io.WriteString(c, "dropped")
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		io.Copy(io.Discard, br)
		c.Close()
	}},
	{"WebSocket, sandbox resets", func(t *testing.T, e *leakEnv) {
		c, br, sc, sbr := e.tunnel(t)
		leakEcho(t, c, br, sc, sbr)
		reset(sc)
		readEOF(t, c)
	}},
	{"WebSocket declined", func(t *testing.T, e *leakEnv) {
		c, br := e.dial(t)
		leakSend(t, c, e.head("GET", "/ws", leakUpgrade))
		s := e.next(t)
		s.w.WriteHeader(404)
		s.write("no")
		s.end()
		io.Copy(io.Discard, leakResponse(t, br, "GET", 404).Body)
		c.Close()
	}},
	{"WebSocket, client resets before the 101", func(t *testing.T, e *leakEnv) {
		c, _ := e.dial(t)
		leakSend(t, c, e.head("GET", "/ws", leakUpgrade))
		sc, _ := e.next(t).raw(t)
		reset(c)
		io.WriteString(sc, ws101+"early")
		readEOF(t, sc)
	}},
	{"pipelined ahead of a detached SSE stream, client resets", func(t *testing.T, e *leakEnv) {
		c, _ := e.dial(t)
		leakSend(t, c, e.head("GET", "/1", "")+e.head("GET", "/sse", ""))
		e.next(t).answer("one")
		s := e.next(t)
		reset(c)
		sseHeaders(s.w)
		s.write("data: one\n\n")
		e.openStreamsGone(t)
		s.end()
	}},
	{"WebSocket, sandbox killed", func(t *testing.T, e *leakEnv) {
		c, br, sc, sbr := e.tunnel(t)
		leakEcho(t, c, br, sc, sbr)
		e.kill(t)
		readEOF(t, c)
		readEOF(t, sc)
	}},
	{"WebSocket, sandbox killed before its 101", func(t *testing.T, e *leakEnv) {
		c, br := e.dial(t)
		leakSend(t, c, e.head("GET", "/ws", leakUpgrade))
		sc, _ := e.next(t).raw(t)
		e.kill(t)
		io.Copy(io.Discard, leakResponse(t, br, "GET", 410).Body)
		readEOF(t, sc)
	}},
	{"pipelined ahead of a WebSocket, client resets", func(t *testing.T, e *leakEnv) {
		c, _ := e.dial(t)
		leakSend(t, c, e.head("GET", "/1", "")+e.head("GET", "/ws", leakUpgrade))
		e.next(t).answer("one")
		sc, _ := e.next(t).raw(t)
		reset(c)
		io.WriteString(sc, ws101)
		readEOF(t, sc)
	}},
}

// kill kills the scripted sandbox through the admin API, and stores its
// route again, which lifts the kill for the cases that follow.
func (e *leakEnv) kill(t *testing.T) {
	t.Helper()
	if st, body := e.h.adminDo("POST", "/admin/meta/delete", `{"sandbox_id":"sbxleak"}`, ""); st != 200 {
		t.Fatalf("kill: %d %s", st, body)
	}
	port, _, _ := strings.Cut(e.host, "-")
	if st, body := e.h.adminDo("PUT", "/admin/routes/sbxleak", `{"HostIP":"127.0.0.1","SandboxIP":"127.0.0.1","CreatedAt":"1","`+port+`":"`+port+`"}`, ""); st != 200 {
		t.Fatalf("store the route again: %d %s", st, body)
	}
	// adminDo's keep-alive connection is none of the exchange's.
	http.DefaultClient.CloseIdleConnections()
}

// tunnel opens a WebSocket tunnel through the proxy to the scripted
// sandbox and returns both ends.
func (e *leakEnv) tunnel(t *testing.T) (c *net.TCPConn, br *bufio.Reader, sc *net.TCPConn, sbr *bufio.Reader) {
	t.Helper()
	c, br = e.dial(t)
	leakSend(t, c, e.head("GET", "/ws", leakUpgrade))
	sc, sbr = e.next(t).raw(t)
	io.WriteString(sc, ws101)
	leakResponse(t, br, "GET", 101)
	return c, br, sc, sbr
}

// leakEcho sends bytes both ways through a tunnel.
func leakEcho(t *testing.T, c net.Conn, br *bufio.Reader, sc net.Conn, sbr *bufio.Reader) {
	t.Helper()
	leakSend(t, c, "ping")
	readUntil(t, sbr, "ping")
	leakSend(t, sc, "pong")
	readUntil(t, br, "pong")
}

// leakTimeouts end by a timeout of the proxy's (short ones, below).
var leakTimeouts = []leakCase{
	{"silent chunked stream hits the idle timeout", func(t *testing.T, e *leakEnv) {
		c, br := e.dial(t)
		leakSend(t, c, e.head("GET", "/", ""))
		s := e.next(t)
		s.write("piece one\n")
		resp := leakResponse(t, br, "GET", 200)
		io.Copy(io.Discard, resp.Body)
		e.openStreamsGone(t)
		s.end()
		c.Close()
	}},
	{"silent detached SSE stream hits the idle timeout", func(t *testing.T, e *leakEnv) {
		c, br := e.dial(t)
		leakSend(t, c, e.head("GET", "/sse", ""))
		s := e.next(t)
		sseHeaders(s.w)
		resp := leakResponse(t, br, "GET", 200)
		io.Copy(io.Discard, resp.Body) // heartbeats, then the end
		e.openStreamsGone(t)
		s.end()
		readEOF(t, c)
	}},
	{"sandbox gives no head in time", func(t *testing.T, e *leakEnv) {
		c, br := e.dial(t)
		leakSend(t, c, e.head("GET", "/", ""))
		s := e.next(t)
		io.Copy(io.Discard, leakResponse(t, br, "GET", 504).Body)
		s.end()
		c.Close()
	}},
	{"silent WebSocket hits the idle timeout", func(t *testing.T, e *leakEnv) {
		c, br, sc, sbr := e.tunnel(t)
		leakEcho(t, c, br, sc, sbr)
		readEOF(t, sc)
		readEOF(t, c)
	}},
	{"WebSocket, client stops reading while the sandbox sends", func(t *testing.T, e *leakEnv) {
		c, br, sc, sbr := e.tunnel(t)
		leakEcho(t, c, br, sc, sbr)
		// The client reads nothing more; the sandbox writes until the
		// proxy cuts the client (client.write_timeout) and closes its side.
		chunk := strings.Repeat("x", 64<<10)
		for {
			if _, err := io.WriteString(sc, chunk); err != nil {
				break
			}
		}
		readEOF(t, c)
	}},
	{"WebSocket, sandbox stops reading while it sends", func(t *testing.T, e *leakEnv) {
		c, br, sc, sbr := e.tunnel(t)
		leakEcho(t, c, br, sc, sbr)
		pinged := make(chan struct{})
		go func() { // pings, reading nothing, until the proxy closes its side
			defer close(pinged)
			tick := time.NewTicker(20 * time.Millisecond)
			defer tick.Stop()
			for range tick.C {
				if _, err := io.WriteString(sc, "p"); err != nil {
					return
				}
			}
		}()
		go io.Copy(io.Discard, br)
		_ = c.SetWriteDeadline(time.Now().Add(5 * time.Second))
		chunk := make([]byte, 64<<10)
		var err error
		for err == nil {
			_, err = c.Write(chunk)
		}
		if isTimeout(err) {
			t.Fatal("the tunnel to a sandbox that stopped reading was never cut")
		}
		testenv.Recv(t, pinged, 10*time.Second, "the sandbox's side of the cut tunnel closed")
		c.Close()
	}},
	{"idle keep-alive client", func(t *testing.T, e *leakEnv) {
		c, br := e.dial(t)
		leakSend(t, c, e.head("GET", "/", ""))
		e.next(t).answer("hello")
		io.Copy(io.Discard, leakResponse(t, br, "GET", 200).Body)
		readEOF(t, c)
	}},
	{"client stalls mid-head", func(t *testing.T, e *leakEnv) {
		c, _ := e.dial(t)
		leakSend(t, c, "GET / HTTP/1.1\r\nHost: "+e.host+"\r\nX-Half")
		readEOF(t, c)
	}},
	{"client stalls mid-body", func(t *testing.T, e *leakEnv) {
		c, br := e.dial(t)
		leakSend(t, c, e.head("POST", "/", "Transfer-Encoding: chunked\r\n")+"10\r\n0123456789")
		s := e.next(t)
		io.Copy(io.Discard, leakResponse(t, br, "POST", 408).Body)
		io.Copy(io.Discard, s.r.Body)
		s.end()
		c.Close()
	}},
}

func runLeakCases(t *testing.T, e *leakEnv, cases []leakCase, reps int) {
	base := takeBaseline(t, e)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			for range reps {
				c.run(t, e)
			}
			e.check(t, base)
		})
	}
}

// Every way an exchange can end gives back everything it took.
func TestLeakEveryWayAnExchangeEnds(t *testing.T) {
	e := newLeakEnv(t, nil)
	runLeakCases(t, e, leakEnds, 4)
}

// So does every timeout.
func TestLeakTimeouts(t *testing.T) {
	// Not t.Parallel: it looks at every goroutine of the process.
	e := newLeakEnv(t, leakTimeoutOpts)
	runLeakCases(t, e, leakTimeouts, 2)
}

// leakTimeoutOpts are the short timeouts leakTimeouts' cases wait out.
//
// Each runs under every case, not only the one that waits it out, so each
// must outlast the test's own steps on loaded cores (a full -race run on
// 2 busy cores stalls a goroutine for hundreds of milliseconds), or a case
// meets a timeout it does not test:
//   - every case answers through the test's goroutine: the sandbox's
//     handler hands the request over (next) and the test writes the head.
//     At 200 ms (175 with slack), a stall there got the 504 instead of
//     the 200 or 101, and at 1 s still did under a loaded -race run
//     (goroutines of the sandbox's server, of the test, the hijack).
//     Only "sandbox gives no head in time" waits it out.
//   - every tunnel case echoes (leakEcho) before its end, each step on
//     the test's goroutine: at 300 ms, a stall between the 101 and the
//     ping, or between the ping and the pong, idled the tunnel first
//     ("EOF before pong").
//   - every case dials, then writes its head: client.read_timeout counts
//     from the accept, and at 200 ms a stall in between timed the head
//     out before it was sent.
//
// Every case still waits out the one it tests: the reads that wait for
// its end (readEOF, the 408 and 504 answers) give up after 5 s.
func leakTimeoutOpts(o *harnessOpts) {
	o.cfg.IdleStreamTimeout = time.Second
	o.cfg.HeartbeatInterval = 100 * time.Millisecond
	o.cfg.ResponseHeaderTimeout = 2 * time.Second
	o.srv.ClientIdleTimeout = time.Second
	o.srv.ClientReadTimeout = time.Second
	o.srv.ClientBodyTimeout = time.Second
	// Only a client that stops reading meets it: every other case reads
	// what the proxy writes, which fits the socket buffers.
	o.srv.ClientWriteTimeout = 200 * time.Millisecond
}

// A drain with one of everything open leaves nothing behind: no goroutine
// of the proxy's (janitor, hang-up watch included) and no descriptor
// (the watch's epoll set included).
func TestLeakDrain(t *testing.T) {
	for rep := range 2 {
		t.Run(fmt.Sprint(rep), func(t *testing.T) {
			epolls := countFDs(t, "anon_inode:[eventpoll]")
			e := newLeakEnv(t, func(o *harnessOpts) { o.srv.DrainTimeout = 300 * time.Millisecond })
			g0, _ := liveGoroutines()
			fd0 := testenv.OpenFDs(t)
			var steps []*leakStep
			var clients []*net.TCPConn
			open := func(head string, status int) {
				c, br := e.dial(t)
				clients = append(clients, c)
				leakSend(t, c, head)
				s := e.next(t)
				steps = append(steps, s)
				if status == 0 {
					return // waits for its head
				}
				if strings.Contains(head, "/sse") {
					sseHeaders(s.w)
				}
				s.write("first\n\n")
				resp := leakResponse(t, br, "GET", status)
				readUntil(t, resp.Body, "first")
			}
			open(e.head("GET", "/sse", ""), 200)
			open(e.head("POST", "/sse", "Content-Length: 2\r\n")+"{}", 200)
			open(e.head("GET", "/download", ""), 200)
			open(e.head("GET", "/", ""), 0)
			waiting := clients[len(clients)-1]
			c, br, sc, sbr := e.tunnel(t)
			leakEcho(t, c, br, sc, sbr)
			clients = append(clients, c)

			if err := e.h.server.Shutdown(context.Background()); err != nil {
				t.Fatal(err)
			}
			if s, tn := e.h.proxy.streams.open(); s != 0 || tn != 0 {
				t.Fatalf("Shutdown returned with %d streams and %d tunnels open", s, tn)
			}
			// A request still waiting for its head was cut at the deadline
			// and answered.
			_ = waiting.SetReadDeadline(time.Now().Add(5 * time.Second))
			resp, err := http.ReadResponse(bufio.NewReader(waiting), &http.Request{Method: "GET"})
			if err != nil || resp.StatusCode != 504 {
				t.Fatalf("the request waiting for its head at the deadline: %v %v", resp, err)
			}
			for _, s := range steps {
				s.end()
			}
			for _, c := range clients {
				readEOF(t, c)
				c.Close()
			}
			sc.Close()
			e.waitEnded(t)
			if n := countFDs(t, "anon_inode:[eventpoll]"); n != epolls {
				t.Errorf("%d epoll sets open after Shutdown, %d before the server", n, epolls)
			}
			// The harness's listeners closed; the test's sandbox still runs.
			testenv.WaitFor(t, 5*time.Second, "descriptors and goroutines of the server to go", func() bool {
				g, _ := liveGoroutines()
				return testenv.OpenFDs(t) <= fd0 && g <= g0
			})
			_, stacks := liveGoroutines()
			for _, g := range stacks {
				if strings.Contains(g, "cubeproxy/proxy.(*") && !strings.Contains(g, "_test.go") {
					t.Errorf("proxy goroutine left after Shutdown:\n%s", g)
				}
			}
		})
	}
}

// sseOpen starts an SSE stream on c (a detached GET, or a POST as an MCP
// call's answer) and reads its first event: the stream is open at the
// proxy when it returns.
func (e *leakEnv) sseOpen(t *testing.T, c net.Conn, br *bufio.Reader, method string) (*leakStep, *http.Response) {
	t.Helper()
	if method == "GET" {
		leakSend(t, c, e.head("GET", "/sse", ""))
	} else {
		leakSend(t, c, e.head("POST", "/mcp", "Content-Length: 2\r\n")+"{}")
	}
	s := e.next(t)
	sseHeaders(s.w)
	s.write("data: one\n\n")
	resp := leakResponse(t, br, method, 200)
	readUntil(t, resp.Body, "data: one")
	return s, resp
}
