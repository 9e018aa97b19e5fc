package proxy

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// addPollTool adds "poll": it reports progress 1, waits for the agent to
// acknowledge it, closes the call's answer stream (SEP-1699, protocol
// 2025-11-25: the gateway may end a long call's stream and the agent
// resumes it with a GET and Last-Event-ID), reports progress 2 into the
// event store, waits for that acknowledgement (which can only come through
// the resumption GET), and returns its result.
func addPollTool(srv *mcp.Server, acks <-chan float64) {
	mcp.AddTool(srv, &mcp.Tool{Name: "poll"}, func(ctx context.Context, req *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, any, error) {
		tok := req.Params.GetProgressToken()
		for i := 1; i <= 2; i++ {
			if err := req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: tok, Progress: float64(i), Total: 3}); err != nil {
				return nil, nil, fmt.Errorf("progress %d: %w", i, err)
			}
			select {
			case got := <-acks:
				if got != float64(i) {
					return nil, nil, fmt.Errorf("agent acknowledged %v, want %d", got, i)
				}
			case <-ctx.Done():
				return nil, nil, ctx.Err()
			}
			if i == 1 {
				req.Extra.CloseSSEStream(mcp.CloseSSEStreamArgs{RetryAfter: 5 * time.Millisecond})
			}
		}
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "polled"}}}, nil, nil
	})
}

// A gateway that ends a long call's answer stream mid-call (SSE polling):
// the agent resumes the call with a GET carrying Last-Event-ID through the
// proxy, gets the progress sent meanwhile while the tool still waits for
// it, and the result; at max_streams_per_sandbox 2 (the standalone GET and
// the call) the resumption GET finds the ended POST's slot free. Every slot
// is given back.
func TestMCPCallStreamPolledThroughProxy(t *testing.T) {
	for _, limit := range []int{0, 2} {
		t.Run(fmt.Sprintf("limit=%d", limit), func(t *testing.T) {
			h := newHarness(t, func(o *harnessOpts) { o.cfg.MaxStreamsPerSandbox = limit })
			srv := newAgentServer()
			acks := make(chan float64)
			addPollTool(srv, acks)
			var mu sync.Mutex
			var gets []string
			host := agentGateway(t, h, "pollbox", srv, &mcp.StreamableHTTPOptions{EventStore: mcp.NewMemoryEventStore(nil)}, func(next http.Handler) http.Handler {
				return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					if r.Method == http.MethodGet {
						mu.Lock()
						gets = append(gets, r.Header.Get("Last-Event-Id"))
						mu.Unlock()
					}
					next.ServeHTTP(w, r)
				})
			})
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			cs := agentConnect(t, ctx, h, host, &mcp.ClientOptions{
				ProgressNotificationHandler: func(_ context.Context, req *mcp.ProgressNotificationClientRequest) {
					select {
					case acks <- req.Params.Progress:
					case <-ctx.Done():
					}
				},
			}, &mcp.StreamableClientTransport{MaxRetries: 3})
			sb := h.proxy.sandboxes.get([]byte("pollbox"))
			testenv.WaitFor(t, 10*time.Second, "the standalone GET alone is open", func() bool {
				s, _ := h.proxy.streams.open()
				return s == 1 && sb.inFlight() == 1
			})
			res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "poll", Meta: mcp.Meta{"progressToken": "pp"}})
			if err != nil {
				t.Fatalf("a polled call through the proxy: %v", err)
			}
			if got := res.Content[0].(*mcp.TextContent).Text; res.IsError || got != "polled" {
				t.Fatalf("the polled call answered %q", got)
			}
			mu.Lock()
			resumed := 0
			for _, id := range gets {
				if id != "" {
					resumed++
				}
			}
			mu.Unlock()
			if resumed == 0 {
				t.Fatalf("no GET with Last-Event-ID reached the gateway (GETs: %q)", gets)
			}
			testenv.WaitFor(t, 10*time.Second, "the call's streams released", func() bool {
				s, _ := h.proxy.streams.open()
				return s == 1 && sb.inFlight() == 1
			})
			if _, err := cs.ListTools(ctx, nil); err != nil {
				t.Fatalf("the session after a polled call: %v", err)
			}
		})
	}
}

// A sandbox paused while an agent's session is live: the standalone GET
// stream is left open and still delivers what the gateway sends; what the
// agent sends meanwhile (a resumption GET with Last-Event-ID, a call, the
// DELETE) gets the proxy's 503 with Retry-After and its JSON, none of it
// reaching the gateway; once running again the same session works, its
// stream included.
func TestMCPPausedSessionKeepsItsStream(t *testing.T) {
	h := newHarness(t)
	srv := newAgentServer()
	var mu sync.Mutex
	reached := map[string]int{}
	host := agentGateway(t, h, "pausedsess", srv, &mcp.StreamableHTTPOptions{EventStore: mcp.NewMemoryEventStore(nil)}, func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			reached[r.Method]++
			mu.Unlock()
			next.ServeHTTP(w, r)
		})
	})
	count := func(m string) int {
		mu.Lock()
		defer mu.Unlock()
		return reached[m]
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	changed := make(chan struct{}, 4)
	cs := agentConnect(t, ctx, h, host, &mcp.ClientOptions{
		ToolListChangedHandler: func(context.Context, *mcp.ToolListChangedRequest) { changed <- struct{}{} },
	}, nil)
	testenv.WaitFor(t, 10*time.Second, "the standalone GET is open", func() bool {
		s, _ := h.proxy.streams.open()
		return s == 1 && count("GET") == 1
	})
	if st, body := h.adminDo("POST", "/admin/state", `{"sandbox_id":"pausedsess","state":"paused"}`, ""); st != 200 {
		t.Fatalf("pause: %d %s", st, body)
	}
	addNoopTool(srv, "while-paused")
	select {
	case <-changed:
	case <-ctx.Done():
		t.Fatal("tools/list_changed sent while paused never reached the agent on its open stream")
	}
	before := map[string]int{"GET": count("GET"), "POST": count("POST"), "DELETE": count("DELETE")}
	for _, tc := range []struct{ method, body string }{
		{"GET", ""},
		{"POST", `{"jsonrpc":"2.0","id":7,"method":"tools/list"}`},
		{"DELETE", ""},
	} {
		var rd io.Reader
		if tc.body != "" {
			rd = strings.NewReader(tc.body)
		}
		r := h.req(tc.method, host, "/mcp", rd)
		r.Header.Set("Mcp-Session-Id", cs.ID())
		r.Header.Set("Mcp-Protocol-Version", "2025-11-25")
		r.Header.Set("Accept", "application/json, text/event-stream")
		if tc.method == "GET" {
			r.Header.Set("Accept", "text/event-stream")
			r.Header.Set("Last-Event-ID", "0_0")
		}
		if tc.body != "" {
			r.Header.Set("Content-Type", "application/json")
		}
		resp := h.do(r)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 503 || resp.Header.Get("Retry-After") != "1" ||
			!strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") || !strings.Contains(string(b), `"code":"sandbox_pausing"`) {
			t.Errorf("%s while paused: %d Retry-After %q %q %s, want the proxy's 503 JSON", tc.method, resp.StatusCode,
				resp.Header.Get("Retry-After"), resp.Header.Get("Content-Type"), b)
		}
	}
	for m, n := range before {
		if got := count(m); got != n {
			t.Errorf("%d %s requests reached the paused sandbox's gateway", got-n, m)
		}
	}
	if st, body := h.adminDo("POST", "/admin/state", `{"sandbox_id":"pausedsess","state":"running"}`, ""); st != 200 {
		t.Fatalf("resume: %d %s", st, body)
	}
	if _, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "big", Arguments: map[string]any{"n": 3}}); err != nil {
		t.Fatalf("a call once running again: %v", err)
	}
	addNoopTool(srv, "after-resume")
	select {
	case <-changed:
	case <-ctx.Done():
		t.Fatal("tools/list_changed after the resume never reached the agent")
	}
	if n := count("GET"); n != 1 {
		t.Errorf("%d GETs reached the gateway, want the one standalone stream, never cut", n)
	}
}

// An agent that ends its session with a DELETE but leaves its GET stream
// to the gateway (the TypeScript SDK's terminateSession without close):
// the DELETE reaches the gateway, which ends the session's GET stream, and
// the proxy relays that end to the agent (a clean end of the body) and
// releases the stream and its slot; the DELETE is the gateway's answer.
func TestMCPDeleteEndsTheSessionStream(t *testing.T) {
	h := newHarness(t, func(o *harnessOpts) { o.cfg.MaxStreamsPerSandbox = 4; o.cfg.HeartbeatInterval = time.Hour })
	srv := newAgentServer()
	deletes := make(chan int, 1)
	host := agentGateway(t, h, "delbox", srv, nil, func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			next.ServeHTTP(w, r)
			if r.Method == http.MethodDelete {
				deletes <- 1
			}
		})
	})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cs := agentConnect(t, ctx, h, host, nil, &mcp.StreamableClientTransport{DisableStandaloneSSE: true})
	sb := h.proxy.sandboxes.get([]byte("delbox"))
	testenv.WaitFor(t, 10*time.Second, "the connect's requests counted out", func() bool { return sb.inFlight() == 0 })

	get := h.req("GET", host, "/mcp", nil)
	get.Header.Set("Mcp-Session-Id", cs.ID())
	get.Header.Set("Mcp-Protocol-Version", "2025-11-25")
	get.Header.Set("Accept", "text/event-stream")
	resp := h.do(get)
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("standalone GET: %d", resp.StatusCode)
	}
	testenv.WaitFor(t, 10*time.Second, "the GET stream open", func() bool { return sb.inFlight() == 1 })
	bodyEnd := make(chan error, 1)
	go func() {
		_, err := io.Copy(io.Discard, resp.Body)
		bodyEnd <- err
	}()

	del := h.req("DELETE", host, "/mcp", nil)
	del.Header.Set("Mcp-Session-Id", cs.ID())
	del.Header.Set("Mcp-Protocol-Version", "2025-11-25")
	dresp := h.do(del)
	io.Copy(io.Discard, dresp.Body)
	dresp.Body.Close()
	select {
	case <-deletes:
	case <-ctx.Done():
		t.Fatal("the DELETE never reached the gateway")
	}
	if dresp.StatusCode >= 300 || dresp.Header.Get("X-Cube-Error") != "" {
		t.Fatalf("DELETE answered %d, want the gateway's 2xx", dresp.StatusCode)
	}
	select {
	case err := <-bodyEnd:
		if err != nil {
			t.Fatalf("the GET stream ended with %v, want its clean end", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the GET stream is still open 10s after the DELETE")
	}
	testenv.WaitFor(t, 10*time.Second, "every stream and slot released", func() bool {
		s, _ := h.proxy.streams.open()
		return s == 0 && sb.inFlight() == 0
	})
}

// getBeats reports each heartbeat the proxy wrote into the answer to a GET
// (the standalone stream), as heartbeatSpy does for POSTs.
type getBeats struct {
	base  http.RoundTripper
	beats chan struct{}
}

func (s getBeats) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := s.base.RoundTrip(r)
	if err == nil && r.Method == http.MethodGet {
		resp.Body = &spyBody{ReadCloser: resp.Body, beats: s.beats}
	}
	return resp, err
}

// A live session whose standalone GET stream stays quiet (its gateway
// sends nothing on it) while its calls go on: upstream.idle_timeout ends
// that stream all the same, heartbeats or not (they are the proxy's own
// bytes, not the sandbox's), and the go-sdk, which reconnects it, counts
// each such cut as a retry without progress, as a drain's: the
// MaxRetries+1-th fails the session, calls and all (README, What an MCP
// agent sees). Pinned so that the README's numbers stay true.
func TestMCPQuietStandaloneStreamIdleCut(t *testing.T) {
	t.Parallel() // it waits out three idle timeouts
	const maxRetries = 2
	h := newHarness(t, func(o *harnessOpts) {
		o.cfg.HeartbeatInterval = 50 * time.Millisecond
		o.cfg.IdleStreamTimeout = 400 * time.Millisecond
	})
	srv := newAgentServer()
	var mu sync.Mutex
	gets := 0
	host := agentGateway(t, h, "quietbox", srv, nil, func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method == http.MethodGet {
				mu.Lock()
				gets++
				mu.Unlock()
			}
			next.ServeHTTP(w, r)
		})
	})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	beats := make(chan struct{}, 1)
	cs := agentConnect(t, ctx, h, host, nil, &mcp.StreamableClientTransport{MaxRetries: maxRetries,
		HTTPClient: &http.Client{Transport: getBeats{base: hostTransport{host: host, base: h.client.Transport}, beats: beats}}})
	select {
	case <-beats:
	case <-ctx.Done():
		t.Fatal("no heartbeat reached the agent on its quiet GET stream")
	}
	calls := 0
	for {
		_, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "big", Arguments: map[string]any{"n": 3}})
		if err == nil {
			calls++
			continue
		}
		mu.Lock()
		n := gets
		mu.Unlock()
		t.Logf("after %d calls and %d GETs: %v", calls, n, err)
		if want := fmt.Sprintf("standalone SSE stream: exceeded %d retries without progress", maxRetries); !strings.Contains(err.Error(), want) {
			t.Fatalf("the session ended with %v, want %q", err, want)
		}
		if n != maxRetries+1 || calls == 0 {
			t.Fatalf("%d GETs and %d calls before the session failed, want %d GETs (a reconnect after each of the first %d cuts) and calls meanwhile", n, calls, maxRetries+1, maxRetries)
		}
		return
	}
}

// A sandbox paused for longer than upstream.idle_timeout while an agent's
// session is open: a paused VM is silent by nature, and its open streams
// are left for it to resume (README, What an MCP agent sees). The
// session's GET stream stays open through the pause, the proxy's
// heartbeats going on, and so does the answer stream of a call in flight
// (its progress out, its result to come); once the sandbox runs again the
// call completes, the same session works and its stream delivers. Cut at
// idle_timeout, the go-sdk reconnected the GET stream, got the paused
// sandbox's 503, and failed the session: nothing worked after the resume
// ("standalone SSE stream: Service Unavailable"), and the call's cut
// answer, with no event store to resume it from, was lost.
func TestMCPPauseOutlastsIdleTimeout(t *testing.T) {
	// Parallel: it waits out 100 heartbeats (6 s of a loaded machine's
	// sequential run, 0.3 s of CPU) on a harness of its own.
	t.Parallel()
	// The session's connect, the call and the pause must come within one
	// idle timeout of the GET stream's opening (it is silent from then
	// on): 1 s was close to what a loaded 2-core machine takes for them.
	const idle = 2 * time.Second
	h := newHarness(t, func(o *harnessOpts) {
		o.cfg.HeartbeatInterval = 50 * time.Millisecond
		o.cfg.IdleStreamTimeout = idle
	})
	srv := newAgentServer()
	release := addFinishTool(srv)
	var mu sync.Mutex
	gets := 0
	getEnded := make(chan struct{}, 4)
	host := agentGateway(t, h, "longpause", srv, nil, func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method != http.MethodGet {
				next.ServeHTTP(w, r)
				return
			}
			mu.Lock()
			gets++
			mu.Unlock()
			next.ServeHTTP(w, r)
			getEnded <- struct{}{}
		})
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	beats := make(chan struct{}, 1)
	changed := make(chan struct{}, 4)
	progressed := make(chan struct{}, 1)
	cs := agentConnect(t, ctx, h, host, &mcp.ClientOptions{
		ToolListChangedHandler:      func(context.Context, *mcp.ToolListChangedRequest) { changed <- struct{}{} },
		ProgressNotificationHandler: func(context.Context, *mcp.ProgressNotificationClientRequest) { progressed <- struct{}{} },
	}, &mcp.StreamableClientTransport{MaxRetries: 3,
		HTTPClient: &http.Client{Transport: getBeats{base: hostTransport{host: host, base: h.client.Transport}, beats: beats}}})
	done := callFinish(ctx, cs)
	waitProgress(t, ctx, progressed, done) // the call's answer stream is open at the agent
	testenv.WaitFor(t, 10*time.Second, "the standalone GET and the call's stream are open", func() bool {
		s, _ := h.proxy.streams.open()
		return s == 2
	})
	if st, body := h.adminDo("POST", "/admin/state", `{"sandbox_id":"longpause","state":"paused"}`, ""); st != 200 {
		t.Fatalf("pause: %d %s", st, body)
	}
	// Heartbeats come at least 7/8 of their interval apart: 100 of them
	// span more than twice the idle timeout.
	for n := 0; n < 100; {
		select {
		case <-beats:
			n++
		case <-getEnded:
			t.Fatalf("the paused sandbox's GET stream was cut after %d heartbeats (upstream.idle_timeout %v)", n, idle)
		case err := <-done:
			t.Fatalf("the call in flight ended during the pause, after %d heartbeats: %v", n, err)
		case <-ctx.Done():
			t.Fatalf("%d heartbeats on the paused sandbox's GET stream", n)
		}
	}
	if st, body := h.adminDo("POST", "/admin/state", `{"sandbox_id":"longpause","state":"running"}`, ""); st != 200 {
		t.Fatalf("resume: %d %s", st, body)
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatalf("the call in flight through the pause: %v", err)
	}
	if _, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "big", Arguments: map[string]any{"n": 3}}); err != nil {
		t.Fatalf("the session after a pause longer than upstream.idle_timeout: %v", err)
	}
	mcp.AddTool(srv, &mcp.Tool{Name: "after-long-pause"}, func(context.Context, *mcp.CallToolRequest, struct{}) (*mcp.CallToolResult, any, error) {
		return &mcp.CallToolResult{}, nil, nil
	})
	select {
	case <-changed:
	case <-ctx.Done():
		t.Fatal("tools/list_changed after the resume never reached the agent")
	}
	mu.Lock()
	defer mu.Unlock()
	if gets != 1 {
		t.Fatalf("%d GETs reached the gateway, want the one stream, kept through the pause", gets)
	}
}
