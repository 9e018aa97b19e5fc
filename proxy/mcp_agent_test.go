package proxy

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// What an agent developer relies on when a go-sdk client talks to a go-sdk
// server (the sandbox's MCP gateway) through the proxy.

// agentGateway serves srv over streamable HTTP on a new backend and routes
// sandbox id's port 50005 to it. It returns the sandbox host.
func agentGateway(t *testing.T, h *harness, id string, srv *mcp.Server, opts *mcp.StreamableHTTPOptions, wrap func(http.Handler) http.Handler) string {
	t.Helper()
	if opts == nil {
		opts = &mcp.StreamableHTTPOptions{}
	}
	opts.DisableLocalhostProtection = true
	var hd http.Handler = mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, opts)
	if wrap != nil {
		hd = wrap(hd)
	}
	port := backend(t, "127.0.0.1", hd)
	h.put(id, map[string]string{"HostIP": "127.0.0.1", "SandboxIP": "127.0.0.1", "CreatedAt": "1", "50005": itoa(port)})
	return "50005-" + id + ".cube.test"
}

// listChangedArrives waits until the agent's one notification stream is
// open at the proxy, then changes the gateway's tool list and waits for the
// agent's tools/list_changed: with nothing in flight, it can only travel on
// that stream.
func listChangedArrives(t *testing.T, ctx context.Context, h *harness, srv *mcp.Server, changed <-chan struct{}, stream string) {
	t.Helper()
	testenv.WaitFor(t, 10*time.Second, "the "+stream+" is open at the proxy", func() bool {
		s, _ := h.proxy.streams.open()
		return s == 1
	})
	mcp.AddTool(srv, &mcp.Tool{Name: "late"}, func(context.Context, *mcp.CallToolRequest, struct{}) (*mcp.CallToolResult, any, error) {
		return &mcp.CallToolResult{}, nil, nil
	})
	select {
	case <-changed:
	case <-ctx.Done():
		t.Fatal("tools/list_changed never arrived on the " + stream)
	}
}

// cancelCall makes the call, cancels it once the tool runs (started), and
// wants the call to return context.Canceled and the tool's context to be
// cancelled (toolDone) within within.
func cancelCall(t *testing.T, ctx context.Context, cs *mcp.ClientSession, params *mcp.CallToolParams, started <-chan struct{}, toolDone <-chan error, within time.Duration) {
	t.Helper()
	callCtx, callCancel := context.WithCancel(ctx)
	callErr := make(chan error, 1)
	go func() {
		_, err := cs.CallTool(callCtx, params)
		callErr <- err
	}()
	testenv.Recv(t, started, 10*time.Second, "the tool's start")
	callCancel()
	if err := <-callErr; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled call returned %v", err)
	}
	select {
	case err := <-toolDone:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("tool ended with %v", err)
		}
	case <-time.After(within):
		t.Fatalf("the tool's context was not cancelled within %v of the call's", within)
	}
}

// agentConnect connects a go-sdk client through the proxy.
func agentConnect(t *testing.T, ctx context.Context, h *harness, host string, copts *mcp.ClientOptions, tr *mcp.StreamableClientTransport) *mcp.ClientSession {
	t.Helper()
	if tr == nil {
		tr = &mcp.StreamableClientTransport{}
	}
	tr.Endpoint = "http://" + h.addr + "/mcp"
	if tr.HTTPClient == nil {
		tr.HTTPClient = &http.Client{Transport: hostTransport{host: host, base: h.client.Transport}}
	}
	if tr.MaxRetries == 0 {
		tr.MaxRetries = -1 // no silent reconnects unless the test wants them
	}
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "v1"}, copts).Connect(ctx, tr, nil)
	if err != nil {
		t.Fatalf("connect through the proxy: %v", err)
	}
	t.Cleanup(func() { _ = cs.Close() })
	return cs
}

// bulkMCPTimeout bounds an MCP test that moves several MiB, or runs many
// sessions, through the go-sdk under -race: a hang guard, not a speed test.
// Encoding, copying and decoding the JSON is where the time goes (the same
// tests take 1-3 s without -race). In a full run at load averages of 10-12
// on 2 cores, one subtest of TestMCPLargeArguments (6 MiB arguments, then
// a 5 MiB result) took 38 s and one of TestMCPOverTLS 29 s, against the
// 60 s they had; helpers have seen loads of 15-22.
const bulkMCPTimeout = 3 * time.Minute

func newAgentServer() *mcp.Server {
	s := mcp.NewServer(&mcp.Implementation{Name: "gateway", Version: "v1"}, nil)
	mcp.AddTool(s, &mcp.Tool{Name: "big", Description: "returns n bytes of text"},
		func(_ context.Context, _ *mcp.CallToolRequest, in struct {
			N int `json:"n"`
		}) (*mcp.CallToolResult, any, error) {
			b := make([]byte, in.N)
			for i := range b {
				b[i] = 'a' + byte(i%26)
			}
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: string(b)}}}, nil, nil
		})
	return s
}

func bigText(n int) string {
	b := make([]byte, n)
	for i := range b {
		b[i] = 'a' + byte(i%26)
	}
	return string(b)
}

// Large tool results, as a JSON answer (Content-Length) and as one SSE event.
func TestMCPLargeToolResults(t *testing.T) {
	for _, jsonResp := range []bool{true, false} {
		t.Run(fmt.Sprintf("json=%v", jsonResp), func(t *testing.T) {
			t.Parallel()
			h := newHarness(t)
			var ct sync.Map
			host := agentGateway(t, h, "bigbox", newAgentServer(), &mcp.StreamableHTTPOptions{JSONResponse: jsonResp},
				func(next http.Handler) http.Handler {
					return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
						next.ServeHTTP(w, r)
						if r.Method == "POST" {
							ct.Store(w.Header().Get("Content-Type"), true)
						}
					})
				})
			ctx, cancel := context.WithTimeout(context.Background(), bulkMCPTimeout)
			defer cancel()
			cs := agentConnect(t, ctx, h, host, nil, &mcp.StreamableClientTransport{DisableStandaloneSSE: true})
			const n = 4 << 20
			res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "big", Arguments: map[string]any{"n": n}})
			if err != nil {
				t.Fatalf("tools/call: %v", err)
			}
			if got := res.Content[0].(*mcp.TextContent).Text; got != bigText(n) {
				t.Fatalf("result: %d bytes, want %d, equal prefix %v", len(got), n, strings.HasPrefix(bigText(n), got[:min(len(got), 100)]))
			}
			want := "text/event-stream"
			if jsonResp {
				want = "application/json"
			}
			if _, ok := ct.Load(want); !ok {
				t.Fatalf("the gateway never answered %s", want)
			}
			// The session keeps working on the same connections.
			if _, err := cs.ListTools(ctx, nil); err != nil {
				t.Fatalf("tools/list after a large result: %v", err)
			}
		})
	}
}

// The standalone GET stream carries server-initiated notifications while no
// request is open, and DELETE ends the session at the gateway.
func TestMCPStandaloneStreamAndDelete(t *testing.T) {
	h := newHarness(t)
	srv := newAgentServer()
	gets := make(chan struct{}, 4)
	host := agentGateway(t, h, "pushbox", srv, nil, func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method == "GET" {
				gets <- struct{}{}
			}
			next.ServeHTTP(w, r)
		})
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	changed := make(chan struct{}, 4)
	cs := agentConnect(t, ctx, h, host, &mcp.ClientOptions{
		ToolListChangedHandler: func(context.Context, *mcp.ToolListChangedRequest) { changed <- struct{}{} },
	}, nil)
	select {
	case <-gets:
	case <-ctx.Done():
		t.Fatal("the standalone GET stream never reached the gateway")
	}
	listChangedArrives(t, ctx, h, srv, changed, "standalone GET stream")
	sid := cs.ID()
	if err := cs.Close(); err != nil {
		t.Fatalf("close (DELETE): %v", err)
	}
	// The session is gone at the gateway: its id now answers 404.
	r := h.req("POST", host, "/mcp", strings.NewReader(`{"jsonrpc":"2.0","id":9,"method":"tools/list"}`))
	r.Header.Set("Content-Type", "application/json")
	r.Header.Set("Accept", "application/json, text/event-stream")
	r.Header.Set("Mcp-Session-Id", sid)
	resp := h.do(r)
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 404 {
		t.Fatalf("request on a deleted session: %d, want 404", resp.StatusCode)
	}
	testenv.WaitFor(t, 10*time.Second, "proxy streams released", func() bool {
		s, _ := h.proxy.streams.open()
		return s == 0
	})
}

// An agent that cuts its standalone GET stream (its HTTP client's timeout,
// a restart of its event loop) resumes it with Last-Event-ID. The gateway
// must have seen the old stream end, or it refuses the resumption with 409
// ("stream ID conflicts with ongoing stream"), which fails the go-sdk
// client's session. The proxy ends the old stream at the client's FIN, not
// at its next heartbeat (an hour here).
func TestMCPResumeStandaloneStreamAfterClientCut(t *testing.T) {
	h := newHarness(t, func(o *harnessOpts) { o.cfg.HeartbeatInterval = time.Hour })
	srv := newAgentServer()
	ended := make(chan struct{}, 4)
	host := agentGateway(t, h, "resumebox", srv, &mcp.StreamableHTTPOptions{EventStore: mcp.NewMemoryEventStore(nil)},
		func(next http.Handler) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				next.ServeHTTP(w, r)
				if r.Method == "GET" {
					ended <- struct{}{}
				}
			})
		})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cs := agentConnect(t, ctx, h, host, nil, &mcp.StreamableClientTransport{DisableStandaloneSSE: true})

	get := func(lastEventID string) (*http.Response, *http.Transport) {
		tr := &http.Transport{DisableCompression: true}
		r := h.req("GET", host, "/mcp", nil)
		r.Header.Set("Accept", "text/event-stream")
		r.Header.Set("Mcp-Session-Id", cs.ID())
		r.Header.Set("Mcp-Protocol-Version", cs.InitializeResult().ProtocolVersion)
		if lastEventID != "" {
			r.Header.Set("Last-Event-ID", lastEventID)
		}
		resp, err := tr.RoundTrip(r)
		if err != nil {
			t.Fatal(err)
		}
		return resp, tr
	}
	resp, tr := get("")
	if resp.StatusCode != 200 {
		t.Fatalf("GET stream: %d", resp.StatusCode)
	}
	br := bufio.NewReader(resp.Body)
	var lastID string
	// The priming event (protocol 2025-11-25) or the notification below
	// carries the id to resume from.
	mcp.AddTool(srv, &mcp.Tool{Name: "late"}, func(context.Context, *mcp.CallToolRequest, struct{}) (*mcp.CallToolResult, any, error) {
		return &mcp.CallToolResult{}, nil, nil
	})
	for !strings.Contains(lastID, "|notified") {
		ev, err := readEvent(br)
		if err != nil {
			t.Fatalf("GET stream: %v", err)
		}
		for _, l := range strings.Split(ev, "\n") {
			if id, ok := strings.CutPrefix(l, "id: "); ok {
				lastID = id
			}
		}
		if strings.Contains(ev, "notifications/tools/list_changed") {
			lastID += "|notified"
		}
	}
	lastID = strings.TrimSuffix(lastID, "|notified")
	// The agent cuts its stream (FIN) and comes back at once.
	resp.Body.Close()
	tr.CloseIdleConnections()
	select {
	case <-ended:
	case <-time.After(10 * time.Second):
		t.Fatal("the gateway's GET handler still runs 10s after the client closed its stream")
	}
	resp2, tr2 := get(lastID)
	defer tr2.CloseIdleConnections()
	defer resp2.Body.Close()
	if resp2.StatusCode != 200 {
		b, _ := io.ReadAll(resp2.Body)
		t.Fatalf("resume with Last-Event-ID %q: %d %s", lastID, resp2.StatusCode, b)
	}
}

// A stream cut by the sandbox (its connection reset) makes the go-sdk client
// reconnect with Last-Event-ID and get what it missed.
func TestMCPResumeStandaloneStreamAfterSandboxCut(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	srv := newAgentServer()
	var mu sync.Mutex
	var getConn net.Conn
	resumed := make(chan string, 4)
	opts := &mcp.StreamableHTTPOptions{EventStore: mcp.NewMemoryEventStore(nil), DisableLocalhostProtection: true}
	hd := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, opts)
	ln := listen(t, "127.0.0.1:0")
	bs := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method == "GET" {
				if id := r.Header.Get("Last-Event-ID"); id != "" {
					resumed <- id
				}
				mu.Lock()
				getConn = r.Context().Value(connKey{}).(net.Conn)
				mu.Unlock()
			}
			hd.ServeHTTP(w, r)
		}),
		ConnContext: func(ctx context.Context, c net.Conn) context.Context { return context.WithValue(ctx, connKey{}, c) },
	}
	go bs.Serve(ln)
	t.Cleanup(func() { bs.Close() })
	port := uint16(ln.Addr().(*net.TCPAddr).Port)
	h.put("cutbox", map[string]string{"HostIP": "127.0.0.1", "CreatedAt": "1", "50005": itoa(port)})
	host := "50005-cutbox.cube.test"

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	changed := make(chan struct{}, 4)
	cs := agentConnect(t, ctx, h, host, &mcp.ClientOptions{
		ToolListChangedHandler: func(context.Context, *mcp.ToolListChangedRequest) { changed <- struct{}{} },
	}, &mcp.StreamableClientTransport{MaxRetries: 5})
	testenv.WaitFor(t, 10*time.Second, "the GET stream is open", func() bool {
		mu.Lock()
		defer mu.Unlock()
		s, _ := h.proxy.streams.open()
		return getConn != nil && s == 1
	})
	addNoopTool(srv, "one")
	select {
	case <-changed:
	case <-ctx.Done():
		t.Fatal("first notification never arrived")
	}
	mu.Lock()
	getConn.Close()
	mu.Unlock()
	select {
	case id := <-resumed:
		if id == "" {
			t.Fatal("resumed without Last-Event-ID")
		}
	case <-ctx.Done():
		t.Fatal("the client never resumed its GET stream")
	}
	addNoopTool(srv, "two")
	select {
	case <-changed:
	case <-ctx.Done():
		t.Fatal("notification after resumption never arrived")
	}
	if _, err := cs.ListTools(ctx, nil); err != nil {
		t.Fatalf("session after resumption: %v", err)
	}
}

type connKey struct{}

// The agent cancels a long call: the tool sees the cancellation, and the
// proxy lets go of the call's upstream connection and stream at once.
func TestMCPCancelledCallIsReleased(t *testing.T) {
	for _, jsonResp := range []bool{false, true} {
		t.Run(fmt.Sprintf("json=%v", jsonResp), func(t *testing.T) {
			h := newHarness(t)
			srv := newAgentServer()
			started := make(chan struct{})
			toolDone := make(chan error, 1)
			mcp.AddTool(srv, &mcp.Tool{Name: "wait"}, func(ctx context.Context, req *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, any, error) {
				if tok := req.Params.GetProgressToken(); tok != nil {
					_ = req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: tok, Progress: 1})
				}
				close(started)
				<-ctx.Done()
				toolDone <- ctx.Err()
				return nil, nil, ctx.Err()
			})
			postEnded := make(chan struct{}, 8)
			host := agentGateway(t, h, "cancelbox", srv, &mcp.StreamableHTTPOptions{JSONResponse: jsonResp}, func(next http.Handler) http.Handler {
				return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					next.ServeHTTP(w, r)
					if r.Method == "POST" {
						postEnded <- struct{}{}
					}
				})
			})
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			cs := agentConnect(t, ctx, h, host, nil, &mcp.StreamableClientTransport{DisableStandaloneSSE: true})
			for len(postEnded) > 0 {
				<-postEnded
			}
			cancelCall(t, ctx, cs, &mcp.CallToolParams{Name: "wait", Meta: mcp.Meta{"progressToken": "t"}}, started, toolDone, 2*time.Second)
			// The call's POST and the notifications/cancelled POST both end at the gateway.
			for i := 0; i < 2; i++ {
				select {
				case <-postEnded:
				case <-time.After(10 * time.Second):
					t.Fatalf("%d of the 2 POSTs ended at the gateway after the cancellation", i)
				}
			}
			testenv.WaitFor(t, 10*time.Second, "the call's stream released at the proxy", func() bool {
				s, _ := h.proxy.streams.open()
				return s == 0 && h.proxy.sandboxes.get([]byte("cancelbox")).inFlight() == 0
			})
			if _, err := cs.ListTools(ctx, nil); err != nil {
				t.Fatalf("session after a cancelled call: %v", err)
			}
		})
	}
}

// Many agents, one proxy: every session keeps its own id and its own results.
func TestMCPManyConcurrentSessions(t *testing.T) {
	h := newHarness(t)
	srv := newAgentServer()
	mcp.AddTool(srv, &mcp.Tool{Name: "whoami"}, func(_ context.Context, req *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, any, error) {
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: req.Session.ID()}}}, nil, nil
	})
	host := agentGateway(t, h, "manybox", srv, nil, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	const n = 24
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tr := &mcp.StreamableClientTransport{
				Endpoint:   "http://" + h.addr + "/mcp",
				HTTPClient: &http.Client{Transport: hostTransport{host: host, base: h.client.Transport}},
				MaxRetries: -1,
			}
			cs, err := mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "v1"}, nil).Connect(ctx, tr, nil)
			if err != nil {
				errs <- err
				return
			}
			defer cs.Close()
			for j := 0; j < 5; j++ {
				res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "whoami"})
				if err != nil {
					errs <- err
					return
				}
				if got := res.Content[0].(*mcp.TextContent).Text; got != cs.ID() {
					errs <- fmt.Errorf("session %s got the answer of %s", cs.ID(), got)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	testenv.WaitFor(t, 10*time.Second, "every stream released", func() bool {
		s, _ := h.proxy.streams.open()
		return s == 0 && h.proxy.sandboxes.get([]byte("manybox")).inFlight() == 0
	})
}

// The sandbox is recreated on the same IP:port (new CreatedAt): the agent's
// old session is unknown there (404, which the go-sdk reports as
// ErrSessionMissing) and a new session works; no request reaches the new
// sandbox on a connection opened to the old one.
func TestMCPSandboxRestartMidSession(t *testing.T) {
	h := newHarness(t)
	serve := func(ln net.Listener, gen string, conns *sync.Map) *http.Server {
		srv := newAgentServer()
		mcp.AddTool(srv, &mcp.Tool{Name: "gen"}, func(context.Context, *mcp.CallToolRequest, struct{}) (*mcp.CallToolResult, any, error) {
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: gen}}}, nil, nil
		})
		hd := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, &mcp.StreamableHTTPOptions{DisableLocalhostProtection: true})
		bs := &http.Server{Handler: hd, ConnState: func(c net.Conn, s http.ConnState) {
			if s == http.StateNew {
				conns.Store(c, true)
			}
		}}
		go bs.Serve(ln)
		return bs
	}
	// Both sandboxes' listeners share the port (SO_REUSEPORT), and the
	// new one binds before the old one closes: a port closed and bound
	// again could be taken by another socket of the machine in between.
	ln, err := reusePort.Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	port := uint16(ln.Addr().(*net.TCPAddr).Port)
	var oldConns, newConns sync.Map
	old := serve(ln, "old", &oldConns)
	h.put("restartbox", map[string]string{"HostIP": "127.0.0.1", "CreatedAt": "100", "50005": itoa(port)})
	host := "50005-restartbox.cube.test"
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cs := agentConnect(t, ctx, h, host, nil, &mcp.StreamableClientTransport{DisableStandaloneSSE: true})
	if res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "gen"}); err != nil || res.Content[0].(*mcp.TextContent).Text != "old" {
		t.Fatalf("call on the first sandbox: %v", err)
	}

	// Recreate: the new sandbox listens on the same port, the old one
	// goes away (its idle connections close). No request is made while
	// both listen.
	ln2, err := reusePort.Listen(context.Background(), "tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	old.Close()
	nb := serve(ln2, "new", &newConns)
	t.Cleanup(func() { nb.Close() })
	h.put("restartbox", map[string]string{"HostIP": "127.0.0.1", "CreatedAt": "200", "50005": itoa(port)})

	_, err = cs.CallTool(ctx, &mcp.CallToolParams{Name: "gen"})
	if !errors.Is(err, mcp.ErrSessionMissing) {
		t.Fatalf("call on the recreated sandbox with the old session: %v, want ErrSessionMissing", err)
	}
	cs2 := agentConnect(t, ctx, h, host, nil, &mcp.StreamableClientTransport{DisableStandaloneSSE: true})
	if res, err := cs2.CallTool(ctx, &mcp.CallToolParams{Name: "gen"}); err != nil || res.Content[0].(*mcp.TextContent).Text != "new" {
		t.Fatalf("call on the recreated sandbox: %v", err)
	}
}

// The older HTTP+SSE transport: GET /sse holds the stream that carries every
// answer, POST /messages?sessionid= carries the calls.
func TestMCPLegacySSETransport(t *testing.T) {
	// The client's close of its silent GET stream is noticed at once.
	h := newHarness(t, func(o *harnessOpts) { o.cfg.HeartbeatInterval = time.Hour })
	srv := newAgentServer()
	hd := mcp.NewSSEHandler(func(*http.Request) *mcp.Server { return srv }, &mcp.SSEOptions{DisableLocalhostProtection: true})
	port := backend(t, "127.0.0.1", hd)
	h.put("ssebox", map[string]string{"HostIP": "127.0.0.1", "CreatedAt": "1", "50005": itoa(port)})
	host := "50005-ssebox.cube.test"
	ctx, cancel := context.WithTimeout(context.Background(), bulkMCPTimeout)
	defer cancel()
	tr := &mcp.SSEClientTransport{
		Endpoint:   "http://" + h.addr + "/sse",
		HTTPClient: &http.Client{Transport: hostTransport{host: host, base: h.client.Transport}},
	}
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "v1"}, nil).Connect(ctx, tr, nil)
	if err != nil {
		t.Fatalf("connect over HTTP+SSE: %v", err)
	}
	// 1 MiB, sixteen of the proxy's 64 KiB pieces on the GET stream that
	// carries every answer. It was 3 MiB, at 2-3 s a MiB under -race in
	// the go-sdk's JSON on both ends (TestMCPLargeToolResults moves 4 MiB).
	const n = 1 << 20
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "big", Arguments: map[string]any{"n": n}})
	if err != nil {
		t.Fatalf("tools/call over HTTP+SSE: %v", err)
	}
	if got := res.Content[0].(*mcp.TextContent).Text; got != bigText(n) {
		t.Fatalf("result of %d bytes, want %d", len(got), n)
	}
	if err := cs.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	testenv.WaitFor(t, 10*time.Second, "the SSE stream released", func() bool {
		s, _ := h.proxy.streams.open()
		return s == 0
	})
}

// The go-sdk's newest protocol (2026-07-28) against a stateless gateway:
// no session and no standalone GET stream. The agent discovers the server
// with one POST and gets server-initiated notifications on a
// subscriptions/listen POST whose SSE answer lasts as long as the
// subscription. Cancelling is hanging up: a stateless gateway knows no
// request that a later notifications/cancelled could name, so a call (its
// answer's head not sent yet) and the listen stream end at the gateway only
// when the proxy closes their sandbox connections after the agent leaves.
func TestMCPStatelessListenAndCancel(t *testing.T) {
	h := newHarness(t)
	srv := newAgentServer()
	started := make(chan struct{}, 1)
	toolDone := make(chan error, 1)
	mcp.AddTool(srv, &mcp.Tool{Name: "wait"}, func(ctx context.Context, _ *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, any, error) {
		started <- struct{}{}
		<-ctx.Done()
		toolDone <- ctx.Err()
		return nil, nil, ctx.Err()
	})
	listenEnded := make(chan struct{}, 1)
	host := agentGateway(t, h, "listenbox", srv, &mcp.StreamableHTTPOptions{Stateless: true, PropagateRequestCancellation: true},
		func(next http.Handler) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				next.ServeHTTP(w, r)
				if r.Header.Get("Mcp-Method") == "subscriptions/listen" {
					listenEnded <- struct{}{}
				}
			})
		})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	changed := make(chan struct{}, 4)
	cs := agentConnect(t, ctx, h, host, &mcp.ClientOptions{
		ToolListChangedHandler: func(context.Context, *mcp.ToolListChangedRequest) { changed <- struct{}{} },
	}, nil)
	if v := cs.InitializeResult().ProtocolVersion; v < "2026-07-28" || cs.ID() != "" {
		t.Fatalf("protocol %s, session %q: want the stateless protocol", v, cs.ID())
	}
	sb := h.proxy.sandboxes.get([]byte("listenbox"))
	// The gateway subscribes the agent before it acknowledges, in the
	// listen stream's first event: with the stream's head at the proxy,
	// a change reaches the agent.
	listChangedArrives(t, ctx, h, srv, changed, "listen stream")

	// A call's client that leaves is found at once (the hang-up watch), or
	// within clientCheck where the watch is not available.
	cancelCall(t, ctx, cs, &mcp.CallToolParams{Name: "wait"}, started, toolDone, 5*time.Second)
	testenv.WaitFor(t, 10*time.Second, "the call's slot released, the listen stream kept", func() bool {
		s, _ := h.proxy.streams.open()
		return s == 1 && sb.inFlight() == 1
	})

	if err := cs.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	select {
	case <-listenEnded:
	case <-time.After(10 * time.Second):
		t.Fatal("the gateway's listen handler still runs 10s after the agent closed")
	}
	testenv.WaitFor(t, 10*time.Second, "the listen stream released at the proxy", func() bool {
		s, _ := h.proxy.streams.open()
		return s == 0 && sb.inFlight() == 0
	})
}

// addNoopTool adds a tool that does nothing to srv: adding one makes the
// server send notifications/tools/list_changed on its sessions' streams.
func addNoopTool(srv *mcp.Server, name string) {
	mcp.AddTool(srv, &mcp.Tool{Name: name}, func(context.Context, *mcp.CallToolRequest, struct{}) (*mcp.CallToolResult, any, error) {
		return &mcp.CallToolResult{}, nil, nil
	})
}
