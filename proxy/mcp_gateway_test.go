//lint:file-ignore SA1019 roots and sampling, deprecated by MCP 2026-07-28 (SEP-2577), stay in use for its deprecation window of at least a year, and the proxy must relay them.

package proxy

import (
	"bufio"
	"bytes"
	"context"
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

// More of what an agent developer relies on through the proxy, each
// compared with a direct connection to the gateway where that tells more.

// A tool call that runs longer than upstream.response_header_timeout
// without a word (a build, a test suite: no progress token). The go-sdk
// gateway sends the head of its answer with the result (no event store:
// no priming event; JSON mode: always), so the proxy waits for the head as
// long as the call runs. Direct, and through the platform's proxy
// (proxy_read_timeout 7206s), such a call succeeds.
func TestMCPLongSilentToolCall(t *testing.T) {
	t.Parallel()
	const headerTimeout = 200 * time.Millisecond
	for _, jsonResp := range []bool{false, true} {
		t.Run(fmt.Sprintf("json=%v", jsonResp), func(t *testing.T) {
			h := newHarness(t, func(o *harnessOpts) { o.cfg.ResponseHeaderTimeout = headerTimeout })
			srv := newAgentServer()
			started := make(chan struct{})
			release := make(chan struct{})
			mcp.AddTool(srv, &mcp.Tool{Name: "build"}, func(ctx context.Context, _ *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, any, error) {
				started <- struct{}{}
				select {
				case <-release:
				case <-ctx.Done():
					return nil, nil, ctx.Err()
				}
				return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "built"}}}, nil, nil
			})
			host := agentGateway(t, h, "buildbox", srv, &mcp.StreamableHTTPOptions{JSONResponse: jsonResp}, nil)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			cs := agentConnect(t, ctx, h, host, nil, &mcp.StreamableClientTransport{DisableStandaloneSSE: true})
			done := make(chan error, 1)
			go func() {
				res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "build"})
				if err == nil && (res.IsError || res.Content[0].(*mcp.TextContent).Text != "built") {
					err = fmt.Errorf("result %+v", res.Content)
				}
				done <- err
			}()
			testenv.Recv(t, started, 10*time.Second, "the build tool's start")
			// The call outlives the header timeout several times over.
			select {
			case err := <-done:
				t.Fatalf("the call ended before the tool did: %v", err)
			case <-time.After(5 * headerTimeout):
			}
			close(release)
			if err := <-done; err != nil {
				t.Fatalf("a tool call longer than response_header_timeout: %v", err)
			}
		})
	}
	// The wait is bounded all the same: a sandbox that never answers gets
	// the 504 after upstream.idle_timeout.
	t.Run("hung", func(t *testing.T) {
		const idle = 600 * time.Millisecond
		h := newHarness(t, func(o *harnessOpts) { o.cfg.ResponseHeaderTimeout = headerTimeout; o.cfg.IdleStreamTimeout = idle })
		hold := make(chan struct{})
		defer close(hold)
		port := backend(t, "127.0.0.1", http.HandlerFunc(func(http.ResponseWriter, *http.Request) { <-hold }))
		h.put("hungbox", map[string]string{"HostIP": "127.0.0.1", "CreatedAt": "1", "50005": itoa(port)})
		r := h.req("POST", "50005-hungbox.cube.test", "/mcp", strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`))
		r.Header.Set("Content-Type", "application/json")
		r.Header.Set("Accept", "application/json, text/event-stream")
		start := time.Now()
		resp := h.do(r)
		resp.Body.Close()
		if el := time.Since(start); resp.StatusCode != 504 || el < idle-idle/4 {
			t.Fatalf("%d after %v, want 504 after upstream.idle_timeout (%v)", resp.StatusCode, el, idle)
		}
	})
}

// rawMCP speaks to the proxy on one client connection of its own, so a
// test decides which requests share it and when it closes.
type rawMCP struct {
	t    *testing.T
	conn net.Conn
	br   *bufio.Reader
	host string
	cs   *mcp.ClientSession
}

func dialMCP(t *testing.T, addr, host string, cs *mcp.ClientSession) *rawMCP {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	t.Cleanup(func() { c.Close() })
	return &rawMCP{t: t, conn: c, br: bufio.NewReader(c), host: host, cs: cs}
}

// post sends a JSON-RPC message on the connection and reads the answer's head.
func (r *rawMCP) post(body string) *http.Response {
	r.t.Helper()
	req, _ := http.NewRequest("POST", "http://"+r.host+"/mcp", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Mcp-Session-Id", r.cs.ID())
	req.Header.Set("Mcp-Protocol-Version", r.cs.InitializeResult().ProtocolVersion)
	if err := req.Write(r.conn); err != nil {
		r.t.Fatal(err)
	}
	resp, err := http.ReadResponse(r.br, req)
	if err != nil {
		r.t.Fatal(err)
	}
	return resp
}

// sseUntil reads events from br until one contains want; it returns the id
// of the last event read.
func sseUntil(t *testing.T, br *bufio.Reader, want string) (lastID string) {
	t.Helper()
	for {
		ev, err := readEvent(br)
		if err != nil {
			t.Fatalf("waiting for %q: %v", want, err)
		}
		for _, l := range strings.Split(ev, "\n") {
			if id, ok := strings.CutPrefix(l, "id: "); ok {
				lastID = id
			}
		}
		if strings.Contains(ev, want) {
			return lastID
		}
	}
}

// The agent's connection drops while a tool call's SSE answer is open (its
// process restarts, its network changes) and it resumes the answer with
// Last-Event-ID. The gateway must see the POST end at once, not at the
// next heartbeat, and that on a keep-alive connection that already carried
// an SSE answer too; the resumed stream then brings what was missed.
func TestMCPResumeCallAnswerAfterClientCut(t *testing.T) {
	h := newHarness(t, func(o *harnessOpts) { o.cfg.HeartbeatInterval = time.Hour })
	srv := newAgentServer()
	release := make(chan struct{})
	mcp.AddTool(srv, &mcp.Tool{Name: "slow"}, func(ctx context.Context, req *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, any, error) {
		tok := req.Params.GetProgressToken()
		_ = req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: tok, Progress: 1, Message: "first"})
		<-release
		_ = req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: tok, Progress: 2, Message: "second"})
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "slow done"}}}, nil, nil
	})
	postEnded := make(chan string, 8)
	host := agentGateway(t, h, "cutpostbox", srv, &mcp.StreamableHTTPOptions{EventStore: mcp.NewMemoryEventStore(nil)},
		func(next http.Handler) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				body, _ := io.ReadAll(r.Body)
				r.Body = io.NopCloser(bytes.NewReader(body))
				next.ServeHTTP(w, r)
				if r.Method == "POST" && bytes.Contains(body, []byte(`"tools/call"`)) {
					postEnded <- r.Header.Get("X-Test-Call")
				}
			})
		})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cs := agentConnect(t, ctx, h, host, nil, &mcp.StreamableClientTransport{DisableStandaloneSSE: true})

	raw := dialMCP(t, h.addr, host, cs)
	// A first, short call whose SSE answer ends normally: the connection
	// stays open and carries the next call.
	resp := raw.post(`{"jsonrpc":"2.0","id":101,"method":"tools/call","params":{"name":"big","arguments":{"n":3}}}`)
	if ct := resp.Header.Get("Content-Type"); resp.StatusCode != 200 || !strings.HasPrefix(ct, "text/event-stream") {
		t.Fatalf("short call: %d %s", resp.StatusCode, ct)
	}
	if b, err := io.ReadAll(resp.Body); err != nil || !strings.Contains(string(b), `"abc"`) {
		t.Fatalf("short call's answer %q: %v", b, err)
	}
	<-postEnded
	resp = raw.post(`{"jsonrpc":"2.0","id":102,"method":"tools/call","params":{"name":"slow","_meta":{"progressToken":"p"}}}`)
	if resp.StatusCode != 200 {
		t.Fatalf("slow call: %d", resp.StatusCode)
	}
	lastID := sseUntil(t, bufio.NewReader(resp.Body), `"first"`)
	if lastID == "" {
		t.Fatal("no event id to resume from")
	}
	raw.conn.Close() // FIN, while the call runs
	select {
	case <-postEnded:
	case <-time.After(10 * time.Second):
		t.Fatal("the gateway's POST handler still runs 10s after the client closed its connection")
	}
	testenv.WaitFor(t, 10*time.Second, "the call's stream released at the proxy", func() bool {
		s, _ := h.proxy.streams.open()
		return s == 0
	})
	close(release)

	// Resume: GET with Last-Event-ID replays the rest of the call's answer.
	r := h.req("GET", host, "/mcp", nil)
	r.Header.Set("Accept", "text/event-stream")
	r.Header.Set("Mcp-Session-Id", cs.ID())
	r.Header.Set("Mcp-Protocol-Version", cs.InitializeResult().ProtocolVersion)
	r.Header.Set("Last-Event-ID", lastID)
	resp = h.do(r)
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("resume with Last-Event-ID %q: %d %s", lastID, resp.StatusCode, b)
	}
	br := bufio.NewReader(resp.Body)
	sseUntil(t, br, `"second"`)
	sseUntil(t, br, `"slow done"`)
	if _, err := cs.ListTools(ctx, nil); err != nil {
		t.Fatalf("session after the resumed call: %v", err)
	}
}

// viaBoth runs an agent scenario against the gateway directly and through
// the proxy: what works direct must work the same through the proxy.
// connect opens a go-sdk session with the given client options and
// transport (Endpoint and HTTPClient are filled in).
func viaBoth(t *testing.T, id string, srv *mcp.Server, opts *mcp.StreamableHTTPOptions,
	run func(t *testing.T, connect func(copts *mcp.ClientOptions, tr *mcp.StreamableClientTransport) *mcp.ClientSession)) {
	for _, via := range []string{"direct", "proxy"} {
		t.Run(via, func(t *testing.T) {
			h := newHarness(t)
			o := mcp.StreamableHTTPOptions{}
			if opts != nil {
				o = *opts
			}
			o.DisableLocalhostProtection = true
			port := backend(t, "127.0.0.1", mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, &o))
			h.put(id, map[string]string{"HostIP": "127.0.0.1", "CreatedAt": "1", "50005": itoa(port)})
			ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
			defer cancel()
			run(t, func(copts *mcp.ClientOptions, tr *mcp.StreamableClientTransport) *mcp.ClientSession {
				t.Helper()
				if tr == nil {
					tr = &mcp.StreamableClientTransport{}
				}
				tr.MaxRetries = -1
				if via == "direct" {
					tr.Endpoint = fmt.Sprintf("http://127.0.0.1:%d/mcp", port)
					tr.HTTPClient = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 100}}
				} else {
					tr.Endpoint = "http://" + h.addr + "/mcp"
					tr.HTTPClient = &http.Client{Transport: hostTransport{host: "50005-" + id + ".cube.test", base: h.client.Transport}}
				}
				client := mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "v1"}, copts)
				client.AddRoots(&mcp.Root{URI: "file:///work"})
				cs, err := client.Connect(ctx, tr, nil)
				if err != nil {
					t.Fatalf("connect %s: %v", via, err)
				}
				t.Cleanup(func() { _ = cs.Close() })
				return cs
			})
			if via == "proxy" {
				testenv.WaitFor(t, 10*time.Second, "every call's stream released", func() bool {
					_ = ctx
					s, _ := h.proxy.streams.open()
					return s <= 1 // the standalone GET stream, if any
				})
			}
		})
	}
}

// Many calls in flight on one session, each with its own progress: every
// answer and every notification reaches the call it belongs to, and each
// notification reaches the agent while its call is still open (the tool
// sends the next only once the agent has seen the previous one).
func TestMCPConcurrentCallsOneSession(t *testing.T) {
	const calls, steps = 16, 4
	var mu sync.Mutex
	acks := map[string]chan float64{}
	ackFor := func(tok string) chan float64 {
		mu.Lock()
		defer mu.Unlock()
		if acks[tok] == nil {
			acks[tok] = make(chan float64, 1)
		}
		return acks[tok]
	}
	srv := newAgentServer()
	mcp.AddTool(srv, &mcp.Tool{Name: "tag"}, func(ctx context.Context, req *mcp.CallToolRequest, in struct {
		I int `json:"i"`
	}) (*mcp.CallToolResult, any, error) {
		tok := req.Params.GetProgressToken().(string)
		for k := 1; k <= steps; k++ {
			if err := req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: tok, Progress: float64(k), Total: steps + 1}); err != nil {
				return nil, nil, err
			}
			select {
			case got := <-ackFor(tok):
				if got != float64(k) {
					return nil, nil, fmt.Errorf("%s: agent acknowledged %v, want %d", tok, got, k)
				}
			case <-time.After(5 * time.Second):
				return nil, nil, fmt.Errorf("%s: progress %d never reached the agent while the call was open", tok, k)
			case <-ctx.Done():
				return nil, nil, ctx.Err()
			}
		}
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: fmt.Sprint(in.I)}}}, nil, nil
	})
	viaBoth(t, "concbox", srv, nil, func(t *testing.T, connect func(*mcp.ClientOptions, *mcp.StreamableClientTransport) *mcp.ClientSession) {
		mu.Lock()
		clear(acks)
		mu.Unlock()
		cs := connect(&mcp.ClientOptions{
			ProgressNotificationHandler: func(_ context.Context, req *mcp.ProgressNotificationClientRequest) {
				ackFor(req.Params.ProgressToken.(string)) <- req.Params.Progress
			},
		}, nil)
		var wg sync.WaitGroup
		errs := make(chan error, calls)
		for i := range calls {
			wg.Go(func() {
				tok := fmt.Sprintf("tok-%d", i)
				res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "tag", Arguments: map[string]any{"i": i}, Meta: mcp.Meta{"progressToken": tok}})
				switch {
				case err != nil:
					errs <- fmt.Errorf("call %d: %v", i, err)
				case res.IsError:
					errs <- fmt.Errorf("call %d: %v", i, res.Content[0].(*mcp.TextContent).Text)
				case res.Content[0].(*mcp.TextContent).Text != fmt.Sprint(i):
					errs <- fmt.Errorf("call %d got the answer of call %s", i, res.Content[0].(*mcp.TextContent).Text)
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
	})
}

// A burst of notifications, sent back to back, arrives whole and in order.
func TestMCPNotificationBurstInOrder(t *testing.T) {
	const n = 2000
	srv := newAgentServer()
	mcp.AddTool(srv, &mcp.Tool{Name: "burst"}, func(ctx context.Context, req *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, any, error) {
		tok := req.Params.GetProgressToken()
		for k := 1; k <= n; k++ {
			if err := req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: tok, Progress: float64(k), Message: strings.Repeat("x", k%97)}); err != nil {
				return nil, nil, err
			}
		}
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "done"}}}, nil, nil
	})
	viaBoth(t, "burstbox", srv, nil, func(t *testing.T, connect func(*mcp.ClientOptions, *mcp.StreamableClientTransport) *mcp.ClientSession) {
		var mu sync.Mutex
		var got []float64
		cs := connect(&mcp.ClientOptions{
			ProgressNotificationHandler: func(_ context.Context, req *mcp.ProgressNotificationClientRequest) {
				mu.Lock()
				got = append(got, req.Params.Progress)
				mu.Unlock()
			},
		}, &mcp.StreamableClientTransport{DisableStandaloneSSE: true})
		if _, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "burst", Meta: mcp.Meta{"progressToken": "b"}}); err != nil {
			t.Fatal(err)
		}
		testenv.WaitFor(t, 5*time.Second, "every notification handled", func() bool {
			mu.Lock()
			defer mu.Unlock()
			return len(got) >= n
		})
		mu.Lock()
		defer mu.Unlock()
		for i, p := range got {
			if p != float64(i+1) {
				t.Fatalf("notification %d carries progress %v", i, p)
			}
		}
	})
}

// Server-initiated requests during a call (roots/list, sampling,
// elicitation) travel to the agent on the call's stream and its answers
// come back as POSTs, several calls at once.
func TestMCPServerInitiatedRequests(t *testing.T) {
	srv := newAgentServer()
	mcp.AddTool(srv, &mcp.Tool{Name: "ask"}, func(ctx context.Context, req *mcp.CallToolRequest, in struct {
		I int `json:"i"`
	}) (*mcp.CallToolResult, any, error) {
		roots, err := req.Session.ListRoots(ctx, nil)
		if err != nil || len(roots.Roots) != 1 {
			return nil, nil, fmt.Errorf("roots/list: %v %v", roots, err)
		}
		msg, err := req.Session.CreateMessage(ctx, &mcp.CreateMessageParams{MaxTokens: 10, Messages: []*mcp.SamplingMessage{{Role: "user", Content: &mcp.TextContent{Text: fmt.Sprint(in.I)}}}})
		if err != nil {
			return nil, nil, fmt.Errorf("sampling: %w", err)
		}
		el, err := req.Session.Elicit(ctx, &mcp.ElicitParams{Message: fmt.Sprint(in.I), RequestedSchema: map[string]any{"type": "object", "properties": map[string]any{"v": map[string]any{"type": "string"}}}})
		if err != nil {
			return nil, nil, fmt.Errorf("elicitation: %w", err)
		}
		out := fmt.Sprintf("%s|%s|%v", roots.Roots[0].URI, msg.Content.(*mcp.TextContent).Text, el.Content["v"])
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: out}}}, nil, nil
	})
	for _, jsonResp := range []bool{false, true} {
		t.Run(fmt.Sprintf("json=%v", jsonResp), func(t *testing.T) {
			viaBoth(t, "askbox", srv, &mcp.StreamableHTTPOptions{JSONResponse: jsonResp}, func(t *testing.T, connect func(*mcp.ClientOptions, *mcp.StreamableClientTransport) *mcp.ClientSession) {
				c := &mcp.ClientOptions{
					CreateMessageHandler: func(_ context.Context, req *mcp.CreateMessageRequest) (*mcp.CreateMessageResult, error) {
						return &mcp.CreateMessageResult{Model: "m", Role: "assistant", Content: &mcp.TextContent{Text: "s" + req.Params.Messages[0].Content.(*mcp.TextContent).Text}}, nil
					},
					ElicitationHandler: func(_ context.Context, req *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
						return &mcp.ElicitResult{Action: "accept", Content: map[string]any{"v": "e" + req.Params.Message}}, nil
					},
				}
				cs := connect(c, nil)
				var wg sync.WaitGroup
				for i := range 8 {
					wg.Go(func() {
						res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "ask", Arguments: map[string]any{"i": i}})
						if err != nil {
							t.Errorf("call %d: %v", i, err)
							return
						}
						want := fmt.Sprintf("file:///work|s%d|e%d", i, i)
						if got := res.Content[0].(*mcp.TextContent).Text; res.IsError || got != want {
							t.Errorf("call %d: %q, want %q", i, got, want)
						}
					})
				}
				wg.Wait()
			})
		})
	}
}

// The gateway's own answers on the MCP endpoint (202 to a notification,
// 204 to a DELETE, 400 to bad JSON, 404 to an unknown session, 405 to a
// method it does not serve) reach the agent as the gateway gave them:
// status, body and the headers the go-sdk client reads.
func TestMCPGatewayAnswersRelayed(t *testing.T) {
	for _, stateless := range []bool{false, true} {
		t.Run(fmt.Sprintf("stateless=%v", stateless), func(t *testing.T) {
			h := newHarness(t)
			srv := newAgentServer()
			port := backend(t, "127.0.0.1", mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv },
				&mcp.StreamableHTTPOptions{Stateless: stateless, DisableLocalhostProtection: true}))
			h.put("statusbox", map[string]string{"HostIP": "127.0.0.1", "CreatedAt": "1", "50005": itoa(port)})
			host := "50005-statusbox.cube.test"
			direct := &http.Client{Transport: &http.Transport{}}
			defer direct.CloseIdleConnections()

			type answer struct {
				status int
				body   string
				header http.Header
			}
			send := func(viaProxy bool, method, session, body string, hdr map[string]string) answer {
				t.Helper()
				url := fmt.Sprintf("http://127.0.0.1:%d/mcp", port)
				if viaProxy {
					url = "http://" + h.addr + "/mcp"
				}
				r, _ := http.NewRequest(method, url, strings.NewReader(body))
				if viaProxy {
					r.Host = host
				}
				if body != "" {
					r.Header.Set("Content-Type", "application/json")
				}
				r.Header.Set("Accept", "application/json, text/event-stream")
				r.Header.Set("Mcp-Protocol-Version", "2025-11-25")
				if session != "" {
					r.Header.Set("Mcp-Session-Id", session)
				}
				for k, v := range hdr {
					r.Header.Set(k, v)
				}
				c := direct
				if viaProxy {
					c = h.client
				}
				resp, err := c.Do(r)
				if err != nil {
					t.Fatal(err)
				}
				defer resp.Body.Close()
				b, _ := io.ReadAll(resp.Body)
				return answer{resp.StatusCode, string(b), resp.Header}
			}
			// Each side gets its own session, so ids are compared by presence.
			initialize := func(viaProxy bool) string {
				a := send(viaProxy, "POST", "", `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`, nil)
				if a.status != 200 {
					t.Fatalf("initialize (proxy %v): %d %s", viaProxy, a.status, a.body)
				}
				return a.header.Get("Mcp-Session-Id")
			}
			sessions := map[bool]string{false: initialize(false), true: initialize(true)}
			if (sessions[false] == "") != stateless || (sessions[true] == "") != stateless {
				t.Fatalf("session ids %q (direct) %q (proxy)", sessions[false], sessions[true])
			}
			cases := []struct {
				name, method, body string
				noSession          bool
				hdr                map[string]string
			}{
				{name: "notification", method: "POST", body: `{"jsonrpc":"2.0","method":"notifications/initialized"}`},
				{name: "bad json", method: "POST", body: `{"jsonrpc":`},
				{name: "no accept", method: "POST", body: `{"jsonrpc":"2.0","id":2,"method":"tools/list"}`, hdr: map[string]string{"Accept": "application/json"}},
				{name: "unknown session", method: "POST", body: `{"jsonrpc":"2.0","id":3,"method":"tools/list"}`, hdr: map[string]string{"Mcp-Session-Id": "NOSUCHSESSION"}},
				{name: "missing session", method: "POST", body: `{"jsonrpc":"2.0","id":4,"method":"tools/list"}`, noSession: true},
				{name: "put", method: "PUT", body: `{}`},
				{name: "get", method: "GET", hdr: map[string]string{"Accept": "text/event-stream"}},
				{name: "delete", method: "DELETE"},
				{name: "after delete", method: "POST", body: `{"jsonrpc":"2.0","id":5,"method":"tools/list"}`},
			}
			for _, tc := range cases {
				if tc.name == "get" && !stateless {
					continue // a live stream, covered elsewhere
				}
				var got [2]answer
				for i, viaProxy := range []bool{false, true} {
					sid := sessions[viaProxy]
					if tc.noSession {
						sid = ""
					}
					got[i] = send(viaProxy, tc.method, sid, tc.body, tc.hdr)
				}
				d, p := got[0], got[1]
				if d.status != p.status || d.body != p.body {
					t.Errorf("%s: direct %d %q, proxy %d %q", tc.name, d.status, d.body, p.status, p.body)
				}
				for _, k := range []string{"Content-Type", "Allow", "Www-Authenticate", "Content-Length"} {
					if d.header.Get(k) != p.header.Get(k) {
						t.Errorf("%s: %s direct %q, proxy %q", tc.name, k, d.header.Get(k), p.header.Get(k))
					}
				}
				if p.header.Get("X-Cube-Request-Id") == "" {
					t.Errorf("%s: no X-Cube-Request-Id", tc.name)
				}
				t.Logf("%s: %d %q", tc.name, p.status, strings.TrimSpace(p.body))
			}
		})
	}
}

// Stateless gateways (no session, no standalone stream: every POST
// stands alone) serve a go-sdk agent through the proxy as direct.
func TestMCPStatelessGateway(t *testing.T) {
	t.Parallel()
	for _, jsonResp := range []bool{false, true} {
		t.Run(fmt.Sprintf("json=%v", jsonResp), func(t *testing.T) {
			viaBoth(t, "statelessbox", newAgentServer(), &mcp.StreamableHTTPOptions{Stateless: true, JSONResponse: jsonResp},
				func(t *testing.T, connect func(*mcp.ClientOptions, *mcp.StreamableClientTransport) *mcp.ClientSession) {
					cs := connect(nil, nil)
					if cs.ID() != "" {
						t.Fatalf("stateless gateway gave session id %q", cs.ID())
					}
					for _, n := range []int{10, 200 << 10} {
						res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "big", Arguments: map[string]any{"n": n}})
						if err != nil {
							t.Fatalf("tools/call: %v", err)
						}
						if got := res.Content[0].(*mcp.TextContent).Text; got != bigText(n) {
							t.Fatalf("result of %d bytes, want %d", len(got), n)
						}
					}
				})
		})
	}
}

// A restricted sandbox's gateway: the agent sends the proxy's traffic token
// and the gateway's own Bearer on every request (initialize, the standalone
// GET stream, calls, DELETE). The proxy checks and removes the first; the
// gateway alone checks the second. Either missing fails where it belongs.
func TestMCPRestrictedGatewayWithBearer(t *testing.T) {
	const traffic = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	const bearer = "Bearer gw-token/with+odd=chars"
	signer := testSigner(t)
	h := newHarness(t, func(o *harnessOpts) { o.cfg.Signer = signer })
	srv := newAgentServer()
	var mu sync.Mutex
	seen := map[string]int{}
	o := &mcp.StreamableHTTPOptions{DisableLocalhostProtection: true}
	gw := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, o)
	port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Cube-Traffic-Access-Token") != "" || r.Header.Get("E2b-Traffic-Access-Token") != "" || r.URL.Query().Has("cube_token") {
			t.Errorf("%s reached the gateway with the proxy's credential", r.Method)
		}
		if r.Header.Get("Authorization") != bearer {
			w.Header().Set("WWW-Authenticate", `Bearer realm="mcp"`)
			http.Error(w, "gateway says no", http.StatusUnauthorized)
			return
		}
		mu.Lock()
		seen[r.Method]++
		mu.Unlock()
		gw.ServeHTTP(w, r)
	}))
	h.put("lockedmcp", map[string]string{"HostIP": "127.0.0.1", "CreatedAt": "1", "50005": itoa(port),
		"AllowPublicTraffic": "false", "TrafficAccessToken": traffic})
	host := "50005-lockedmcp.cube.test"
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	connect := func(query string, hdr map[string]string) (*mcp.ClientSession, error) {
		tr := &mcp.StreamableClientTransport{
			Endpoint:   "http://" + h.addr + "/mcp" + query,
			HTTPClient: &http.Client{Transport: hostTransport{host: host, headers: hdr, base: h.client.Transport}},
			MaxRetries: -1,
		}
		return mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "v1"}, nil).Connect(ctx, tr, nil)
	}
	// A client configured with a URL alone (no header of the proxy's) gets
	// a signed one: its POSTs, SSE GET and DELETE must all be let through,
	// not answered with the 302 a browser's page load gets.
	signed, err := signer.Sign("lockedmcp", 50005, time.Now().Add(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"Cube-Traffic-Access-Token", "E2b-Traffic-Access-Token", "signed URL"} {
		hdr, query := map[string]string{name: traffic, "Authorization": bearer}, ""
		if name == "signed URL" {
			hdr, query = map[string]string{"Authorization": bearer}, "?cube_token="+signed
		}
		cs, err := connect(query, hdr)
		if err != nil {
			t.Fatalf("%s: connect with both credentials: %v", name, err)
		}
		testenv.WaitFor(t, 10*time.Second, "the standalone GET stream reached the gateway", func() bool {
			mu.Lock()
			defer mu.Unlock()
			return seen["GET"] > 0
		})
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "big", Arguments: map[string]any{"n": 100 << 10}})
		if err != nil || res.Content[0].(*mcp.TextContent).Text != bigText(100<<10) {
			t.Fatalf("%s: tools/call: %v", name, err)
		}
		if err := cs.Close(); err != nil {
			t.Fatalf("%s: close: %v", name, err)
		}
		mu.Lock()
		if seen["DELETE"] == 0 {
			t.Errorf("%s: the session's DELETE never reached the gateway", name)
		}
		clear(seen)
		mu.Unlock()
	}

	// The proxy's credential missing or wrong: the proxy's 403, nothing reaches the gateway.
	for _, tok := range []string{"", strings.Repeat("0", 64)} {
		r := h.req("POST", host, "/mcp", strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`))
		r.Header.Set("Content-Type", "application/json")
		r.Header.Set("Accept", "application/json, text/event-stream")
		r.Header.Set("Authorization", bearer)
		if tok != "" {
			r.Header.Set("Cube-Traffic-Access-Token", tok)
		}
		resp := h.do(r)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 403 || !strings.Contains(string(b), `"sandbox_id":"lockedmcp"`) {
			t.Fatalf("traffic token %q: %d %s, want the proxy's 403", tok, resp.StatusCode, b)
		}
	}
	if _, err := connect("", map[string]string{"Authorization": bearer}); err == nil {
		t.Fatal("connected without the traffic token")
	}
	// The gateway's credential missing: the gateway's own 401, relayed.
	r := h.req("POST", host, "/mcp", strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`))
	r.Header.Set("Content-Type", "application/json")
	r.Header.Set("Cube-Traffic-Access-Token", traffic)
	resp := h.do(r)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 401 || resp.Header.Get("Www-Authenticate") != `Bearer realm="mcp"` || string(b) != "gateway says no\n" {
		t.Fatalf("without the Bearer: %d %q %q, want the gateway's 401", resp.StatusCode, resp.Header.Get("Www-Authenticate"), b)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != 0 {
		t.Fatalf("requests without the traffic token reached the gateway: %v", seen)
	}
}

// heartbeatSpy wraps an agent's transport and reports each heartbeat
// comment the proxy wrote into the answer to a POST (a call's stream).
type heartbeatSpy struct {
	base  http.RoundTripper
	beats chan struct{}
}

func (s heartbeatSpy) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := s.base.RoundTrip(r)
	if err == nil && r.Method == "POST" {
		resp.Body = &spyBody{ReadCloser: resp.Body, beats: s.beats}
	}
	return resp, err
}

// spyBody reports on beats each time mark (the heartbeat line when nil)
// passes through its reads, whatever pieces they cut it into.
type spyBody struct {
	io.ReadCloser
	beats chan struct{}
	mark  []byte
	tail  []byte
}

func (b *spyBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	mark := b.mark
	if mark == nil {
		mark = heartbeatLine
	}
	buf := append(b.tail, p[:n]...)
	for {
		i := bytes.Index(buf, mark)
		if i < 0 {
			break
		}
		select {
		case b.beats <- struct{}{}:
		default:
		}
		buf = buf[i+len(mark):]
	}
	b.tail = append([]byte(nil), buf[max(0, len(buf)-len(mark)):]...)
	return n, err
}

// A long call that reports progress rarely: the proxy's heartbeats go
// between its events (on the call's answer and on the standalone stream),
// and the go-sdk agent takes them in stride. The tool goes on only once the
// agent has read a heartbeat, so the call spans several.
func TestMCPHeartbeatsBetweenProgress(t *testing.T) {
	h := newHarness(t, func(o *harnessOpts) { o.cfg.HeartbeatInterval = 50 * time.Millisecond })
	beats := make(chan struct{}, 1)
	acks := make(chan float64)
	srv := newAgentServer()
	mcp.AddTool(srv, &mcp.Tool{Name: "long"}, func(ctx context.Context, req *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, any, error) {
		tok := req.Params.GetProgressToken()
		for k := 1; k <= 3; k++ {
			// A large event: a heartbeat must never land inside one.
			if err := req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: tok, Progress: float64(k), Message: bigText(100 << 10)}); err != nil {
				return nil, nil, err
			}
			for _, wait := range []string{"ack", "heartbeat", "heartbeat"} {
				var ch <-chan struct{}
				var ack <-chan float64
				if wait == "ack" {
					ack = acks
				} else {
					ch = beats
				}
				select {
				case <-ch:
				case got := <-ack:
					if got != float64(k) {
						return nil, nil, fmt.Errorf("agent acknowledged %v, want %d", got, k)
					}
				case <-time.After(5 * time.Second):
					return nil, nil, fmt.Errorf("step %d: no %s reached the agent", k, wait)
				case <-ctx.Done():
					return nil, nil, ctx.Err()
				}
			}
		}
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "long done"}}}, nil, nil
	})
	host := agentGateway(t, h, "longbox", srv, nil, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	changed := make(chan struct{}, 1)
	cs := agentConnect(t, ctx, h, host, &mcp.ClientOptions{
		ProgressNotificationHandler: func(_ context.Context, req *mcp.ProgressNotificationClientRequest) {
			if req.Params.Message != bigText(100<<10) {
				t.Errorf("progress %v: message of %d bytes", req.Params.Progress, len(req.Params.Message))
			}
			acks <- req.Params.Progress
		},
		ToolListChangedHandler: func(context.Context, *mcp.ToolListChangedRequest) { changed <- struct{}{} },
	}, &mcp.StreamableClientTransport{HTTPClient: &http.Client{Transport: heartbeatSpy{
		base:  hostTransport{host: host, base: h.client.Transport},
		beats: beats,
	}}})
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "long", Meta: mcp.Meta{"progressToken": "l"}})
	if err != nil || res.IsError || res.Content[0].(*mcp.TextContent).Text != "long done" {
		t.Fatalf("long call: %v %+v", err, res)
	}
	// The standalone stream, silent all along, still delivers.
	mcp.AddTool(srv, &mcp.Tool{Name: "late"}, func(context.Context, *mcp.CallToolRequest, struct{}) (*mcp.CallToolResult, any, error) {
		return &mcp.CallToolResult{}, nil, nil
	})
	select {
	case <-changed:
	case <-ctx.Done():
		t.Fatal("tools/list_changed never arrived on the heartbeating standalone stream")
	}
}

// The proxy drains (a rolling deploy) while an agent's tool call is in
// flight on a gateway without an event store: the call's SSE answer has no
// event id, so a client cannot resume it anywhere. Ended at once, the call
// fails ("request terminated without response") though it finishes well
// within drain_timeout; the answer must get the drain time, as nginx's
// graceful shutdown gives every request in flight.
func TestMCPCallInFlightFinishesDuringDrain(t *testing.T) {
	h := newHarness(t, func(o *harnessOpts) { o.srv.DrainTimeout = 5 * time.Second })
	srv := newAgentServer()
	release := addFinishTool(srv)
	host := agentGateway(t, h, "drainmcp", srv, nil, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	progressed := make(chan struct{}, 1)
	cs := agentConnect(t, ctx, h, host, &mcp.ClientOptions{
		ProgressNotificationHandler: func(context.Context, *mcp.ProgressNotificationClientRequest) { progressed <- struct{}{} },
	}, &mcp.StreamableClientTransport{DisableStandaloneSSE: true})
	done := callFinish(ctx, cs)
	waitProgress(t, ctx, progressed, done) // the call's SSE answer is open at the proxy
	shutdownDone := make(chan error, 1)
	go func() { shutdownDone <- h.server.Shutdown(context.Background()) }()
	h.waitListenerClosed(10 * time.Second)
	select {
	case err := <-done:
		t.Fatalf("the call ended as the drain began, before the tool finished: %v", err)
	default:
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatalf("tool call in flight during the drain: %v", err)
	}
	drainEnds(t, shutdownDone, 15*time.Second, "the drain outlived its deadline (5 s) after the tool call ended")
}

// The older HTTP+SSE transport (still shipped by the TypeScript and Go SDKs)
// carries every answer on its GET stream, and its session lives and dies
// with that stream: its events have no ids, and a reconnect opens a new,
// uninitialized session. Ended at once by the drain, as GET event streams
// are, the stream took every call in flight with it: the TS SDK's client
// reconnected and waited for its answer until its request timeout (lab run).
// Like a WebSocket, such a stream must get the drain time.
func TestMCPLegacySSECallFinishesDuringDrain(t *testing.T) {
	h := newHarness(t, func(o *harnessOpts) { o.srv.DrainTimeout = 10 * time.Second })
	srv := newAgentServer()
	release := addFinishTool(srv)
	hd := mcp.NewSSEHandler(func(*http.Request) *mcp.Server { return srv }, &mcp.SSEOptions{DisableLocalhostProtection: true})
	port := backend(t, "127.0.0.1", hd)
	h.put("legacydrain", map[string]string{"HostIP": "127.0.0.1", "CreatedAt": "1", "50005": itoa(port)})
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	progressed := make(chan struct{}, 1)
	tr := &mcp.SSEClientTransport{
		Endpoint:   "http://" + h.addr + "/sse",
		HTTPClient: &http.Client{Transport: hostTransport{host: "50005-legacydrain.cube.test", base: h.client.Transport}},
	}
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "v1"}, &mcp.ClientOptions{
		ProgressNotificationHandler: func(context.Context, *mcp.ProgressNotificationClientRequest) { progressed <- struct{}{} },
	}).Connect(ctx, tr, nil)
	if err != nil {
		t.Fatalf("connect over HTTP+SSE: %v", err)
	}
	done := callFinish(ctx, cs)
	waitProgress(t, ctx, progressed, done) // the call is in flight, its answer due on the GET stream
	shutdownDone := startDrain(t, h)
	close(release)
	if err := <-done; err != nil {
		t.Fatalf("tool call in flight over HTTP+SSE during the drain: %v", err)
	}
	// The drain ends when the agent leaves, not at its deadline.
	_ = cs.Close()
	drainEnds(t, shutdownDone, 20*time.Second, "the drain outlived its deadline (10 s) after the agent left")
}

// addFinishTool adds the tool "finish" to srv: it reports progress once,
// then answers "finished" when the returned channel is closed.
func addFinishTool(srv *mcp.Server) chan struct{} {
	release := make(chan struct{})
	mcp.AddTool(srv, &mcp.Tool{Name: "finish"}, func(ctx context.Context, req *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, any, error) {
		_ = req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: req.Params.GetProgressToken(), Progress: 1})
		select {
		case <-release:
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		}
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "finished"}}}, nil, nil
	})
	return release
}

// waitProgress waits for the progress of the call whose result done
// delivers. A call that fails first, or never reports, fails the test
// at once or at ctx's deadline, not the package at go test's timeout.
func waitProgress(t *testing.T, ctx context.Context, progressed <-chan struct{}, done <-chan error) {
	t.Helper()
	select {
	case <-progressed:
	case err := <-done:
		t.Fatalf("the call ended before it reported progress: %v", err)
	case <-ctx.Done():
		t.Fatal("the call reported no progress before the test's deadline")
	}
}

// callFinish calls "finish" (with a progress token) in the background and
// delivers nil once it answered "finished", else what went wrong.
func callFinish(ctx context.Context, cs *mcp.ClientSession) <-chan error {
	return callTool(ctx, cs, "finish", "finished")
}

// callTool calls the tool name (with a progress token) in the background
// and delivers nil once it answered the text want, else what went wrong.
func callTool(ctx context.Context, cs *mcp.ClientSession, name, want string) <-chan error {
	done := make(chan error, 1)
	go func() {
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: name, Meta: mcp.Meta{"progressToken": name}})
		if err == nil && (res.IsError || res.Content[0].(*mcp.TextContent).Text != want) {
			err = fmt.Errorf("result %+v", res.Content)
		}
		done <- err
	}()
	return done
}

// A request accepts an event stream whatever the case of the media type
// (RFC 9110 §8.3.1: "Text/Event-Stream" is text/event-stream) and on
// whichever of its Accept lines it names it: such a request waits for the
// head as long as a stream may be silent, as upstream.response_header_timeout
// documents; one that does not accept it still gets the 504.
func TestAcceptsEventStreamAnyCaseAnyLine(t *testing.T) {
	t.Parallel()
	const headerTimeout = 200 * time.Millisecond
	h := newHarness(t, func(o *harnessOpts) { o.cfg.ResponseHeaderTimeout = headerTimeout })
	release := make(chan struct{})
	port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
			io.WriteString(w, "done")
		case <-r.Context().Done(): // the proxy gave up on it
		}
	}))
	host := h.route("slowhead", port)
	for _, tc := range []struct {
		name   string
		accept []string
		waits  bool // for the head past headerTimeout
	}{
		{"mixed case", []string{"application/json, Text/Event-Stream"}, true},
		{"second line", []string{"application/json", "text/event-stream"}, true},
		{"not accepted", []string{"application/json"}, false},
		{"refused by weight", []string{"text/event-stream;q=0, application/json"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := h.req("POST", host, "/mcp", strings.NewReader(`{}`))
			r.Header["Accept"] = tc.accept
			done := make(chan *http.Response, 1)
			go func() { done <- h.do(r) }()
			if !tc.waits {
				var resp *http.Response
				select {
				case resp = <-done:
				case <-time.After(20 * headerTimeout):
					// Let the exchange end: a handler of an earlier
					// case may still hold out for a release too.
					for resp == nil {
						select {
						case release <- struct{}{}:
						case resp = <-done:
						}
					}
					resp.Body.Close()
					t.Fatal("no 504 at upstream.response_header_timeout: the request waited as a stream's")
				}
				resp.Body.Close()
				if resp.StatusCode != 504 {
					t.Fatalf("status %d, want 504 after upstream.response_header_timeout", resp.StatusCode)
				}
				return
			}
			select {
			case resp := <-done:
				resp.Body.Close()
				t.Fatalf("answered %d before the sandbox did: the header timeout applied", resp.StatusCode)
			case <-time.After(5 * headerTimeout):
			}
			select {
			case release <- struct{}{}:
			case resp := <-done:
				resp.Body.Close()
				t.Fatalf("answered %d with the sandbox's handler gone, before its release", resp.StatusCode)
			case <-time.After(10 * time.Second):
				t.Fatal("the sandbox's handler gave up before its release: the proxy dropped the request")
			}
			resp := <-done
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 || string(b) != "done" {
				t.Fatalf("%d %q, want the sandbox's 200", resp.StatusCode, b)
			}
		})
	}
}

// startDrain starts h's server's Shutdown and waits until the drain has
// ended the open GET event streams; the channel gets Shutdown's result.
func startDrain(t *testing.T, h *harness) <-chan error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- h.server.Shutdown(context.Background()) }()
	testenv.WaitFor(t, 10*time.Second, "the drain to end GET event streams", func() bool {
		h.proxy.streams.mu.Lock()
		defer h.proxy.streams.mu.Unlock()
		return h.proxy.streams.draining
	})
	return done
}
