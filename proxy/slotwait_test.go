package proxy

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// At max_streams_per_sandbox, a request refused for want of a slot waits
// up to StreamLimitWait for one to free before its 429: an MCP client
// sends its next request as soon as it reads a result's event, before
// the proxy has seen that answer's stream end (waitForSlot).

// slotWaitBox is a proxy at max_streams_per_sandbox 1 with StreamLimitWait
// wait and metrics, in front of a sandbox "waitbox" whose /sse answers one
// SSE event at once and ends its stream only once release is closed, and
// whose /hold tells arrived of each request and answers it 200 "held"
// once hold is closed; it answers anything else 200 "sandbox: <method>
// <bytes of body>".
type slotWaitBox struct {
	h       *harness
	admin   string // metrics
	sb      *sandboxState
	release chan struct{}
	once    sync.Once
	arrived chan struct{}
	hold    chan struct{}
	unheld  sync.Once
}

// releaseOnce lets /sse end its stream.
func (w *slotWaitBox) releaseOnce() { w.once.Do(func() { close(w.release) }) }

// unhold lets /hold answer.
func (w *slotWaitBox) unhold() { w.unheld.Do(func() { close(w.hold) }) }

const slotWaitHost = "8080-waitbox.cube.test"

func newSlotWaitBox(t *testing.T, wait time.Duration, mod ...func(*harnessOpts)) *slotWaitBox {
	t.Helper()
	tel := obsTelemetry(t, nil)
	h := newHarness(t, append([]func(*harnessOpts){func(o *harnessOpts) {
		o.cfg.MaxStreamsPerSandbox = 1
		o.cfg.StreamLimitWait = wait
		o.cfg.Telemetry = tel
	}}, mod...)...)
	w := &slotWaitBox{h: h, admin: obsMetricsAdmin(t, h, tel), release: make(chan struct{}),
		arrived: make(chan struct{}, 16), hold: make(chan struct{})}
	t.Cleanup(w.releaseOnce)
	t.Cleanup(w.unhold)
	port := backend(t, "127.0.0.1", http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/hold" {
			w.arrived <- struct{}{}
			<-w.hold
			io.WriteString(rw, "held")
			return
		}
		if r.URL.Path == "/sse" {
			rw.Header().Set("Content-Type", "text/event-stream")
			io.WriteString(rw, "event: message\ndata: {\"result\":1}\n\n")
			rw.(http.Flusher).Flush()
			<-w.release
			return
		}
		b, _ := io.ReadAll(r.Body)
		fmt.Fprintf(rw, "sandbox: %s %d", r.Method, len(b))
	}))
	h.put("waitbox", map[string]string{"HostIP": "127.0.0.1", "CreatedAt": "1", "8080": itoa(port)})
	w.sb = h.proxy.sandboxes.get([]byte("waitbox"))
	return w
}

// openSSE sends request A: a GET of /sse, whose event it reads. Its stream
// then holds the sandbox's one slot until release; the returned body is
// read to its end by the caller.
func (w *slotWaitBox) openSSE(t *testing.T) io.ReadCloser {
	t.Helper()
	resp, err := w.h.client.Do(w.h.req("GET", slotWaitHost, "/sse", nil))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	if resp.StatusCode != 200 {
		t.Fatalf("the SSE request: %d", resp.StatusCode)
	}
	br := bufio.NewReader(resp.Body)
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("reading the SSE event: %v", err)
		}
		if line == "\n" {
			break // the event is whole
		}
	}
	if n := w.sb.inFlight(); n != 1 {
		t.Fatalf("%d requests in flight with the SSE stream open, want 1", n)
	}
	return io.NopCloser(br)
}

// slotAnswer is what request B got.
type slotAnswer struct {
	status int
	body   string
	err    error
}

// send sends r (request B) and delivers its answer on the channel returned.
func (w *slotWaitBox) send(r *http.Request) <-chan slotAnswer {
	ch := make(chan slotAnswer, 1)
	go func() {
		resp, err := w.h.client.Do(r)
		if err != nil {
			ch <- slotAnswer{err: err}
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		ch <- slotAnswer{status: resp.StatusCode, body: string(b)}
	}()
	return ch
}

// waiting waits until B (answer) is waiting for a slot at the proxy, and
// fails if it was answered first.
func (w *slotWaitBox) waiting(t *testing.T, answer <-chan slotAnswer) {
	t.Helper()
	var early *slotAnswer
	testenv.WaitFor(t, 10*time.Second, "the request to wait for a slot", func() bool {
		select {
		case a := <-answer:
			early = &a
			return true
		default:
			return w.h.proxy.limitWaiting.Load() == 1
		}
	})
	if early != nil {
		t.Fatalf("answered before it waited for a slot: %d %q (%v)", early.status, early.body, early.err)
	}
}

// abandonWait sends "GET target" on a connection of its own, waits until
// the request waits for a slot, and closes the connection: the wait ends
// with its client gone.
func (w *slotWaitBox) abandonWait(t *testing.T, target string) {
	t.Helper()
	c := dialRaw(t, w.h.addr)
	io.WriteString(c, "GET "+target+" HTTP/1.1\r\nHost: "+slotWaitHost+"\r\n\r\n")
	testenv.WaitFor(t, 10*time.Second, "the request to wait for a slot", func() bool { return w.h.proxy.limitWaiting.Load() == 1 })
	c.Close()
	testenv.WaitFor(t, 10*time.Second, "the wait to end with its client gone", func() bool { return w.h.proxy.limitWaiting.Load() == 0 })
}

// waits checks cubeproxy_stream_limit_waits_total by outcome: slot and
// refused as given, and state (the sandbox paused, killed or forgotten
// during the wait) state[0], or 0.
func (w *slotWaitBox) waits(t *testing.T, slot, refused float64, state ...float64) {
	t.Helper()
	s := scrapeMetrics(t, w.admin)
	gotSlot, _ := metricValue(s, "cubeproxy_stream_limit_waits_total", map[string]string{"outcome": "slot"})
	gotRefused, _ := metricValue(s, "cubeproxy_stream_limit_waits_total", map[string]string{"outcome": "refused"})
	gotState, _ := metricValue(s, "cubeproxy_stream_limit_waits_total", map[string]string{"outcome": "state"})
	wantState := 0.0
	if len(state) > 0 {
		wantState = state[0]
	}
	if gotSlot != slot || gotRefused != refused || gotState != wantState {
		t.Errorf("cubeproxy_stream_limit_waits_total: slot %v, refused %v, state %v; want %v, %v, %v", gotSlot, gotRefused, gotState, slot, refused, wantState)
	}
}

// wantRefused fails unless a is the limit's 429.
func wantRefused(t *testing.T, a slotAnswer) {
	t.Helper()
	if a.err != nil || a.status != http.StatusTooManyRequests || !strings.Contains(a.body, CodeTooManyStreams) {
		t.Fatalf("got %d %q (%v), want 429 %s", a.status, a.body, a.err, CodeTooManyStreams)
	}
}

// A sequential client's next request, sent once it has read the event of
// an SSE answer whose stream the sandbox has not ended yet, waits for that
// stream's slot and reaches the sandbox when the stream ends, instead of
// a 429. The wait is long here, so that nothing but the stream's end
// decides; a GET, a POST of a call whose body fasthttp holds already
// (judged a request at the limit, and judged again after the wait), and
// one over 8 KiB refused unread (with MaxHeldBody -1, none is read to be
// judged), whose body still reaches the sandbox whole.
func TestStreamLimitWaitsForSlot(t *testing.T) {
	for _, tc := range []struct {
		name, method, body string
		maxHeld            int64
	}{
		{"GET", "GET", "", 0},
		{"POST call", "POST", `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"x"}}`, 0},
		{"POST over 8 KiB unread", "POST", sizedCall(20 << 10), -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newSlotWaitBox(t, time.Minute, func(o *harnessOpts) { o.cfg.MaxHeldBody = tc.maxHeld })
			a := w.openSSE(t)
			var body io.Reader
			if tc.body != "" {
				body = strings.NewReader(tc.body)
			}
			answer := w.send(w.h.req(tc.method, slotWaitHost, "/next", body))
			w.waiting(t, answer)
			w.releaseOnce()
			if _, err := io.Copy(io.Discard, a); err != nil {
				t.Fatalf("the SSE stream's end: %v", err)
			}
			b := <-answer
			if want := fmt.Sprintf("sandbox: %s %d", tc.method, len(tc.body)); b.err != nil || b.status != 200 || b.body != want {
				t.Fatalf("the next request once the stream ended: %d %q (%v), want 200 %q", b.status, b.body, b.err, want)
			}
			w.waits(t, 1, 0)
			// The route is looked up again after the wait, but counted
			// once: the SSE request's lookup and this one's.
			if n, _ := metricValue(scrapeMetrics(t, w.admin), "cubeproxy_route_cache_lookups_total", nil); n != 2 {
				t.Errorf("cubeproxy_route_cache_lookups_total %v after two requests, want 2", n)
			}
			testenv.WaitFor(t, 5*time.Second, "no slot taken", func() bool { return w.sb.inFlight() == 0 })
			if n := w.h.proxy.limitWaiting.Load(); n != 0 {
				t.Fatalf("%d requests still counted waiting", n)
			}
		})
	}
}

// With no slot freed within StreamLimitWait, the request gets the 429
// after it; its slot count is back where it was.
func TestStreamLimitWaitEndsRefused(t *testing.T) {
	const wait = 50 * time.Millisecond
	w := newSlotWaitBox(t, wait)
	w.openSSE(t)
	start := time.Now()
	b := <-w.send(w.h.req("GET", slotWaitHost, "/next", nil))
	wantRefused(t, b)
	if d := time.Since(start); d < wait {
		t.Fatalf("refused after %v, before the %v wait was over", d, wait)
	}
	w.waits(t, 0, 1)
	if n := w.sb.inFlight(); n != 1 {
		t.Fatalf("%d requests in flight after the refusal, want the SSE stream's 1", n)
	}
}

// A drain that begins while a request waits for a slot ends the wait: the
// 429 is answered at once, not at the wait's end (a minute here).
func TestStreamLimitWaitEndsAtDrain(t *testing.T) {
	w := newSlotWaitBox(t, time.Minute, func(o *harnessOpts) { o.srv.DrainTimeout = 30 * time.Second })
	w.openSSE(t)
	answer := w.send(w.h.req("GET", slotWaitHost, "/next", nil))
	w.waiting(t, answer)
	shutdown := make(chan error, 1)
	go func() { shutdown <- w.h.server.Shutdown(context.Background()) }()
	wantRefused(t, <-answer)
	w.waits(t, 0, 1)
	w.releaseOnce()
	drainEnds(t, shutdown, 40*time.Second, "the drain outlived its deadline (30 s) after the SSE stream's release")
}

// A POST body over 8 KiB read whole at the limit and found to be a call
// is gone from the connection: it gets the 429 at once, without a wait
// (a minute here), and so does every refusal with StreamLimitWait
// negative.
func TestStreamLimitNoWait(t *testing.T) {
	t.Run("held body judged a request", func(t *testing.T) {
		w := newSlotWaitBox(t, time.Minute)
		w.openSSE(t)
		b := <-w.send(w.h.req("POST", slotWaitHost, "/mcp", strings.NewReader(sizedCall(20<<10))))
		wantRefused(t, b)
		w.waits(t, 0, 0)
	})
	t.Run("StreamLimitWait negative", func(t *testing.T) {
		w := newSlotWaitBox(t, -1)
		w.openSSE(t)
		for _, r := range []*http.Request{
			w.h.req("GET", slotWaitHost, "/next", nil),
			w.h.req("POST", slotWaitHost, "/mcp", strings.NewReader(`{"jsonrpc":"2.0","id":2,"method":"tools/call"}`)),
		} {
			wantRefused(t, <-w.send(r))
		}
		w.waits(t, 0, 0)
	})
}

// StreamLimitWait is 100 ms unless set; negative stays the "no wait" it
// is documented as.
func TestStreamLimitWaitDefault(t *testing.T) {
	if got := (Config{}).WithDefaults().StreamLimitWait; got != 100*time.Millisecond {
		t.Errorf("default StreamLimitWait %v, want 100ms", got)
	}
	if got := (Config{StreamLimitWait: -1}).WithDefaults().StreamLimitWait; got != -1 {
		t.Errorf("StreamLimitWait -1 became %v", got)
	}
}

// At max_streams_per_sandbox 1 a lone go-sdk agent connects every time:
// the client opens its standalone GET as soon as the initialize result's
// event arrives, before that answer's stream has ended, and the GET waits
// for the initialize's slot (without the wait, 2 of 10 runs of 20
// connects under -race got the 429). Its session's close (the DELETE)
// gives the GET's slot back. The wait is long here: the stream's end
// frees the slot within a millisecond or so, but a loaded test machine
// may take longer than the default's 100 ms, and the test is of the
// wait, not of the machine.
func TestMCPConnectAtStreamLimitOne(t *testing.T) {
	h := newHarness(t, func(o *harnessOpts) {
		o.cfg.MaxStreamsPerSandbox = 1
		o.cfg.StreamLimitWait = 10 * time.Second
	})
	host := agentGateway(t, h, "onebox", newAgentServer(), nil, nil)
	sb := h.proxy.sandboxes.get([]byte("onebox"))
	ctx, cancel := context.WithTimeout(context.Background(), bulkMCPTimeout)
	defer cancel()
	for i := range 20 {
		tr := &mcp.StreamableClientTransport{Endpoint: "http://" + h.addr + "/mcp", MaxRetries: -1,
			HTTPClient: &http.Client{Transport: hostTransport{host: host, base: h.client.Transport}}}
		cs, err := mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "v1"}, nil).Connect(ctx, tr, nil)
		if err != nil {
			t.Fatalf("connect %d at a limit of 1: %v", i, err)
		}
		testenv.WaitFor(t, 10*time.Second, "the session's GET stream to hold the slot", func() bool {
			s, _ := h.proxy.streams.open()
			return s == 1 && sb.inFlight() == 1
		})
		if err := cs.Close(); err != nil {
			t.Fatalf("close %d: %v", i, err)
		}
		testenv.WaitFor(t, 10*time.Second, "the session's slot freed", func() bool { return sb.inFlight() == 0 })
	}
}

// A request that waited for a slot looks its route up again after the
// wait, as a new request would: the route it looked up before may have
// been deleted or moved meanwhile (the admin API), and its address may
// already be another sandbox's. Deleted: 404, not a request to the old
// address; moved to another port mapping: the new one.
func TestStreamLimitWaitLooksRouteUpAgain(t *testing.T) {
	t.Run("deleted", func(t *testing.T) {
		w := newSlotWaitBox(t, time.Minute)
		a := w.openSSE(t)
		answer := w.send(w.h.req("GET", slotWaitHost, "/next", nil))
		w.waiting(t, answer)
		if st, body := w.h.adminDo("DELETE", "/admin/routes/waitbox", "", ""); st != 200 || !strings.Contains(body, `"deleted":true`) {
			t.Fatalf("delete the route: %d %s", st, body)
		}
		// The stream's slot keeps the entry (forget spares one in use):
		// the wait ends when the stream does, which the delete cut
		// (rejudge: its route is gone).
		if _, err := io.Copy(io.Discard, a); err == nil {
			t.Fatal("the SSE stream ended cleanly: want it cut by its route's delete")
		}
		b := <-answer
		if b.err != nil || b.status != http.StatusNotFound {
			t.Fatalf("the waiting request after its route's delete: %d %q (%v), want 404", b.status, b.body, b.err)
		}
	})
	t.Run("moved", func(t *testing.T) {
		w := newSlotWaitBox(t, time.Minute)
		moved := backend(t, "127.0.0.1", http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
			fmt.Fprintf(rw, "moved: %s", r.Method)
		}))
		a := w.openSSE(t)
		answer := w.send(w.h.req("GET", slotWaitHost, "/next", nil))
		w.waiting(t, answer)
		if st, body := w.h.adminDo("PUT", "/admin/routes/waitbox", `{"HostIP":"127.0.0.1","CreatedAt":"1","8080":"`+itoa(moved)+`"}`, ""); st != 200 {
			t.Fatalf("move the route: %d %s", st, body)
		}
		// The move cut the stream, which went to the old address
		// (rejudge): its slot is the one the wait gets.
		if _, err := io.Copy(io.Discard, a); err == nil {
			t.Fatal("the SSE stream ended cleanly: want it cut by its route's move")
		}
		b := <-answer
		if b.err != nil || b.status != 200 || b.body != "moved: GET" {
			t.Fatalf("the waiting request after its route moved: %d %q (%v), want 200 %q", b.status, b.body, b.err, "moved: GET")
		}
		w.waits(t, 1, 0)
	})
}

// A client that closes its connection while its request waits for a slot
// ends the wait: the request is not sent to the sandbox when a slot
// frees, as late as stream_limit_wait (a minute here) after its client
// gave up on it, and it is logged 499.
func TestStreamLimitWaitClientGone(t *testing.T) {
	w := newSlotWaitBox(t, time.Minute)
	a := w.openSSE(t)
	w.abandonWait(t, "/next")
	w.waits(t, 0, 1)
	if n := w.sb.inFlight(); n != 1 {
		t.Fatalf("%d requests in flight, want the SSE stream's 1", n)
	}
	w.releaseOnce()
	io.Copy(io.Discard, a)
}

// A request that saw a slot free but lost it to another before it counted
// itself in again waits on for the rest of its StreamLimitWait, rather
// than getting the 429 at once: A's stream holds the one slot, B waits,
// and as A ends C takes the slot in the moment between B's sight of it
// and B's count (afterSlotWait: microseconds, not to be hit from
// outside). B reaches the sandbox once C ends.
func TestStreamLimitWaitAfterSlotLost(t *testing.T) {
	w := newSlotWaitBox(t, time.Minute)
	b, c := w.loseSlot(t, nil)
	// B saw the slot free and lost it to C: it waits again (its first
	// wait was no longer counted when the hook ran).
	w.waiting(t, b)
	w.unhold()
	if got := <-c; got.err != nil || got.status != 200 || got.body != "held" {
		t.Fatalf("C: %d %q (%v), want 200 held", got.status, got.body, got.err)
	}
	if got := <-b; got.err != nil || got.status != 200 || got.body != "sandbox: GET 0" {
		t.Fatalf("B after losing the slot it saw free, once C ended: %d %q (%v), want 200", got.status, got.body, got.err)
	}
	// Each end of a wait in a free slot counts: the one lost, and the one
	// B took.
	w.waits(t, 2, 0)
}

// The wait after a lost slot ends where the first one would have: a
// request that loses the slot with its StreamLimitWait over gets the 429
// at once, so that however often it loses, it waits StreamLimitWait at
// most in all. The wait is long enough here for A's end to come within
// it on a loaded machine; B is held past its end before it is judged
// again.
func TestStreamLimitWaitAfterSlotLostBounded(t *testing.T) {
	t.Parallel()
	const wait = 2 * time.Second
	w := newSlotWaitBox(t, wait)
	b, c := w.loseSlot(t, func(waiting time.Time) {
		// B's wait began before waiting: it ends within wait of it.
		testenv.WaitFor(t, 2*wait, "B's wait to be over", func() bool { return time.Since(waiting) > wait })
	})
	judged := time.Now()
	wantRefused(t, <-b)
	if d := time.Since(judged); d >= wait {
		t.Fatalf("refused %v after it lost the slot, want at once (a wait of its own would be %v)", d, wait)
	}
	w.waits(t, 1, 1)
	if n := w.sb.inFlight(); n != 1 {
		t.Fatalf("%d requests in flight after B's refusal, want C's 1", n)
	}
	w.unhold()
	<-c
}

// loseSlot sends request B while A's SSE stream holds the one slot, waits
// until B waits for it, and ends A's stream; when B's wait ends in the
// freed slot, before B is judged again, request C (a GET of /hold) takes
// that slot, and then pause, if any, runs, given a time after B began to
// wait. It returns B's and C's answers, once B goes on to be judged.
func (w *slotWaitBox) loseSlot(t *testing.T, pause func(waiting time.Time)) (b, c <-chan slotAnswer) {
	t.Helper()
	a := w.openSSE(t)
	cAnswer := make(chan (<-chan slotAnswer), 1)
	var fired atomic.Bool
	cIn := make(chan struct{}) // closed once C holds the slot, and B goes on
	var waiting time.Time
	w.h.proxy.afterSlotWait = func() {
		if !fired.CompareAndSwap(false, true) {
			return
		}
		defer close(cIn)
		cAnswer <- w.send(w.h.req("GET", slotWaitHost, "/hold", nil))
		select {
		case <-w.arrived:
		case <-time.After(10 * time.Second):
			t.Error("C never reached the sandbox")
		}
		if pause != nil {
			pause(waiting)
		}
	}
	b = w.send(w.h.req("GET", slotWaitHost, "/next", nil))
	w.waiting(t, b)
	waiting = time.Now() // read by the hook only after A's end, below
	w.releaseOnce()
	if _, err := io.Copy(io.Discard, a); err != nil {
		t.Fatalf("the SSE stream's end: %v", err)
	}
	testenv.Recv(t, cIn, 10*time.Second, "B's second judgement (the afterSlotWait hook) once A's slot was free")
	return b, <-cAnswer
}

// A wait that ends because the sandbox was paused during it is counted
// as such (outcome "state"), and the request is answered as a new one
// would be: the 503 of a paused sandbox, not the 429.
func TestStreamLimitWaitEndsAtPause(t *testing.T) {
	w := newSlotWaitBox(t, time.Minute)
	w.openSSE(t)
	answer := w.send(w.h.req("GET", slotWaitHost, "/next", nil))
	w.waiting(t, answer)
	if st, body := w.h.adminDo("POST", "/admin/state", `{"sandbox_id":"waitbox","state":"paused"}`, ""); st != 200 {
		t.Fatalf("pause: %d %s", st, body)
	}
	if b := <-answer; b.err != nil || b.status != http.StatusServiceUnavailable || !strings.Contains(b.body, CodeSandboxPausing) {
		t.Fatalf("the waiting request once the sandbox paused: %d %q (%v), want 503 %s", b.status, b.body, b.err, CodeSandboxPausing)
	}
	w.waits(t, 0, 0, 1)
}

// A JSON-RPC notification that finds its sandbox at twice the limit
// (above what overLimit lets notifications and responses pass at) gets
// the plain 429's refusal, and so waits for a slot like any intact
// request: A's stream holds the one slot and a notification D, let past
// it, holds the second; E, a notification too, waits, and reaches the
// sandbox once they end.
func TestStreamLimitWaitNotificationOverTwiceLimit(t *testing.T) {
	const note = `{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":2}}`
	w := newSlotWaitBox(t, time.Minute)
	a := w.openSSE(t)
	resp, err := w.h.client.Do(w.h.req("POST", slotWaitHost, "/sse", strings.NewReader(note)))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("notification D, past the limit: %d", resp.StatusCode)
	}
	if n := w.sb.inFlight(); n != 2 {
		t.Fatalf("%d requests in flight with A's and D's streams open, want 2", n)
	}
	answer := w.send(w.h.req("POST", slotWaitHost, "/next", strings.NewReader(note)))
	w.waiting(t, answer)
	w.releaseOnce()
	for _, r := range []io.Reader{a, resp.Body} {
		if _, err := io.Copy(io.Discard, r); err != nil {
			t.Fatalf("a stream's end: %v", err)
		}
	}
	if b, want := <-answer, fmt.Sprintf("sandbox: POST %d", len(note)); b.err != nil || b.status != 200 || b.body != want {
		t.Fatalf("notification E once the streams ended: %d %q (%v), want 200 %q", b.status, b.body, b.err, want)
	}
	w.waits(t, 1, 0)
}

// An "Expect: 100-continue" request is one request, whose head and body
// are judged in turn: a head that waited for a slot gives its body's run
// what is left of that wait, not a wait of its own, so that the request
// waits StreamLimitWait at most in all. Here the head (a PUT: it frames a
// body overLimit does not let past a full limit) waits while A's stream
// holds the one slot, is admitted once A ends, and sends its body only
// after its wait is over, with C in the slot meanwhile: the body's run
// gets the 429 at once, not after a wait of its own.
func TestStreamLimitWaitExpectBodyKeepsHeadsWait(t *testing.T) {
	const wait = time.Second
	w := newSlotWaitBox(t, wait)
	a := w.openSSE(t)
	c := dialRaw(t, w.h.addr)
	br := bufio.NewReader(c)
	fmt.Fprintf(c, "PUT /next HTTP/1.1\r\nHost: %s\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n", slotWaitHost)
	testenv.WaitFor(t, 10*time.Second, "the head to wait for a slot", func() bool { return w.h.proxy.limitWaiting.Load() == 1 })
	waiting := time.Now() // the head's wait began before
	w.releaseOnce()
	if _, err := io.Copy(io.Discard, a); err != nil {
		t.Fatalf("the SSE stream's end: %v", err)
	}
	if resp, b := readExpectAnswer(t, br); resp.StatusCode != http.StatusContinue {
		t.Fatalf("the head once A ended: %d %q, want 100", resp.StatusCode, b)
	}
	testenv.WaitFor(t, 2*wait+10*time.Second, "the head's wait to be over", func() bool { return time.Since(waiting) > wait })
	cAnswer := w.send(w.h.req("GET", slotWaitHost, "/hold", nil))
	select {
	case <-w.arrived:
	case <-time.After(10 * time.Second):
		t.Fatal("C never reached the sandbox")
	}
	io.WriteString(c, "hello")
	sent := time.Now()
	resp, b := readExpectAnswer(t, br)
	if d := time.Since(sent); resp.StatusCode != http.StatusTooManyRequests || d >= wait {
		t.Fatalf("the body's run, with the head's wait over: %d %q after %v, want the 429 at once (a wait of its own is %v)", resp.StatusCode, b, d, wait)
	}
	// The head's wait ended in the slot; the body's run is refused with
	// no wait left.
	w.waits(t, 1, 1)
	w.unhold()
	<-cAnswer
}
