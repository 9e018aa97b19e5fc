package proxy

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// What a go-sdk agent sees when the sandbox behind its session changes
// (paused, killed), when the proxy refuses it, and what many agents on
// several sandboxes, large arguments and HTTPS do to a session.

// addWaitTool adds "wait": it reports progress once when the call has a
// progress token, says it started, and returns only when cancelled, which
// it says on ended.
func addWaitTool(srv *mcp.Server) (started, ended <-chan struct{}) {
	st, en := make(chan struct{}, 4), make(chan struct{}, 4)
	mcp.AddTool(srv, &mcp.Tool{Name: "wait"}, func(ctx context.Context, req *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, any, error) {
		if tok := req.Params.GetProgressToken(); tok != nil {
			_ = req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: tok, Progress: 1})
		}
		st <- struct{}{}
		<-ctx.Done()
		en <- struct{}{}
		return nil, nil, ctx.Err()
	})
	return st, en
}

// The proxy's refusals, as the go-sdk client reports them: it decodes an
// error body only when it is a JSON-RPC response, so the proxy's
// {"error","code","sandbox_id"} reaches the agent as the status text alone
// (the README says how to read the code). None of them reaches the
// gateway, and each fails at once.
func TestMCPRefusalsAsTheGoSDKReportsThem(t *testing.T) {
	const traffic = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	h := newHarness(t)
	var reached atomic.Int64
	srv := newAgentServer()
	gw := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, &mcp.StreamableHTTPOptions{DisableLocalhostProtection: true})
	port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reached.Add(1)
		gw.ServeHTTP(w, r)
	}))
	h.put("locked", map[string]string{"HostIP": "127.0.0.1", "CreatedAt": "1", "50005": itoa(port), "AllowPublicTraffic": "false", "TrafficAccessToken": traffic})
	h.put("pausedbox", map[string]string{"HostIP": "127.0.0.1", "CreatedAt": "1", "50005": itoa(port)})
	h.put("killedbox", map[string]string{"HostIP": "127.0.0.1", "CreatedAt": "1", "50005": itoa(port)})
	if st, body := h.adminDo("POST", "/admin/state", `{"sandbox_id":"pausedbox","state":"paused"}`, ""); st != 200 {
		t.Fatalf("pause: %d %s", st, body)
	}
	if st, body := h.adminDo("POST", "/admin/meta/delete", `{"sandbox_id":"killedbox"}`, ""); st != 200 {
		t.Fatalf("kill: %d %s", st, body)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, tc := range []struct {
		name, host, token, want string
	}{
		{"unknown sandbox", "50005-nosuch.cube.test", "", "Not Found"},
		{"port not mapped", "9999-locked.cube.test", traffic, "Not Found"},
		{"traffic token missing", "50005-locked.cube.test", "", "Forbidden"},
		{"traffic token wrong", "50005-locked.cube.test", strings.Repeat("0", 64), "Forbidden"},
		{"bad host", "bad_host!.cube.test", "", "Bad Request"},
		{"paused", "50005-pausedbox.cube.test", "", "Service Unavailable"},
		{"killed", "50005-killedbox.cube.test", "", "Gone"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hdr := map[string]string{"Authorization": "Bearer gateway-token"}
			if tc.token != "" {
				hdr["Cube-Traffic-Access-Token"] = tc.token
			}
			tr := &mcp.StreamableClientTransport{Endpoint: "http://" + h.addr + "/mcp", MaxRetries: -1,
				HTTPClient: &http.Client{Transport: hostTransport{host: tc.host, headers: hdr, base: h.client.Transport}}}
			start := time.Now()
			_, err := mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "v1"}, nil).Connect(ctx, tr, nil)
			if err == nil || !strings.HasSuffix(err.Error(), tc.want) {
				t.Fatalf("connect: %v, want an error ending in %q", err, tc.want)
			}
			if el := time.Since(start); el > 2*time.Second {
				t.Fatalf("refusal took %v", el)
			}
		})
	}
	if n := reached.Load(); n != 0 {
		t.Fatalf("%d refused requests reached the gateway", n)
	}
}

// A sandbox paused mid-session: a new call fails at once with the 503
// (which the go-sdk treats as transient: the session survives), and once
// the control plane says running again the same session works. A call
// already in flight is left alone: a paused VM's connections resume with it.
func TestMCPPauseMidSession(t *testing.T) {
	h := newHarness(t)
	srv := newAgentServer()
	started, ended := addWaitTool(srv)
	host := agentGateway(t, h, "pausebox", srv, nil, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cs := agentConnect(t, ctx, h, host, nil, nil)
	callCtx, callCancel := context.WithCancel(ctx)
	inFlight := make(chan error, 1)
	go func() {
		_, err := cs.CallTool(callCtx, &mcp.CallToolParams{Name: "wait"})
		inFlight <- err
	}()
	testenv.Recv(t, started, 10*time.Second, "the wait tool's start")
	if st, body := h.adminDo("POST", "/admin/state", `{"sandbox_id":"pausebox","state":"paused"}`, ""); st != 200 {
		t.Fatalf("pause: %d %s", st, body)
	}
	start := time.Now()
	_, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "big", Arguments: map[string]any{"n": 3}})
	if err == nil || !strings.HasSuffix(err.Error(), "Service Unavailable") || time.Since(start) > 2*time.Second {
		t.Fatalf("call to a paused sandbox: %v after %v, want Service Unavailable at once", err, time.Since(start))
	}
	select {
	case err := <-inFlight:
		t.Fatalf("the call in flight ended with the pause: %v", err)
	default:
	}
	if st, body := h.adminDo("POST", "/admin/state", `{"sandbox_id":"pausebox","state":"running"}`, ""); st != 200 {
		t.Fatalf("resume: %d %s", st, body)
	}
	if res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "big", Arguments: map[string]any{"n": 3}}); err != nil || res.IsError {
		t.Fatalf("the same session after resume: %v", err)
	}
	callCancel()
	if err := <-inFlight; !errors.Is(err, context.Canceled) {
		t.Fatalf("in-flight call: %v", err)
	}
	// The cancellation reaches the tool through the proxy, on the same
	// session. Waited for, not only for what it proves: the go-sdk sends
	// notifications/cancelled on a goroutine of its own after CallTool has
	// returned, and ClientSession.Close (the cleanup) holds the connection
	// while its DELETE is answered, which the gateway does only once the
	// session's tools have returned. A Close that overtook the notification
	// waited out the client's 5 s DELETE timeout (the test took 5.2 s one
	// run in two).
	select {
	case <-ended:
	case <-ctx.Done():
		t.Fatal("the in-flight call's cancellation never reached the tool")
	}
}

// A sandbox killed (POST /admin/meta/delete) while a call is in flight:
// whether the answer's head went out (progress sent) or not, with or
// without the standalone stream and an event store, the agent's call ends
// with an error instead of waiting for an answer that cannot come: the 410
// ("Gone"), or the go-sdk's "request terminated without response" for an
// answer stream cut with no event id to resume from. The session ends too,
// at the latest with the next request, which gets the 410 (README, What an
// MCP agent sees).
func TestMCPKillMidCall(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		progress, standalone, store bool
	}{
		{false, true, false}, {false, false, false},
		{true, true, false}, {true, false, false},
		{true, true, true}, {true, false, true},
	} {
		t.Run(fmt.Sprintf("progress=%v,standalone=%v,store=%v", tc.progress, tc.standalone, tc.store), func(t *testing.T) {
			h := newHarness(t)
			srv := newAgentServer()
			started, _ := addWaitTool(srv)
			opts := &mcp.StreamableHTTPOptions{}
			if tc.store {
				opts.EventStore = mcp.NewMemoryEventStore(nil)
			}
			host := agentGateway(t, h, "killbox", srv, opts, nil)
			ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
			defer cancel()
			progressed := make(chan struct{}, 1)
			cs := agentConnect(t, ctx, h, host, &mcp.ClientOptions{
				ProgressNotificationHandler: func(context.Context, *mcp.ProgressNotificationClientRequest) { progressed <- struct{}{} },
			}, &mcp.StreamableClientTransport{DisableStandaloneSSE: !tc.standalone, MaxRetries: 3})
			done := make(chan error, 1)
			go func() {
				p := &mcp.CallToolParams{Name: "wait"}
				if tc.progress {
					p.Meta = mcp.Meta{"progressToken": "k"}
				}
				_, err := cs.CallTool(ctx, p)
				done <- err
			}()
			testenv.Recv(t, started, 10*time.Second, "the wait tool's start")
			if tc.progress {
				waitProgress(t, ctx, progressed, done) // the answer's head is at the agent
			}
			if st, body := h.adminDo("POST", "/admin/meta/delete", `{"sandbox_id":"killbox"}`, ""); st != 200 {
				t.Fatalf("kill: %d %s", st, body)
			}
			start := time.Now()
			select {
			case err := <-done:
				if err == nil {
					t.Fatal("the call succeeded on a killed sandbox")
				}
				t.Logf("call ended after %v: %v", time.Since(start), err)
				if msg := err.Error(); !strings.HasSuffix(msg, ": Gone") && !strings.HasSuffix(msg, "request terminated without response") {
					t.Fatalf("the call ended with %q, want Gone or request terminated without response", msg)
				}
			case <-time.After(8 * time.Second):
				t.Fatal("the call still waits 8s after its sandbox was killed")
			}
			// A cut answer stream leaves the session to its next request;
			// by the one after, it is over whatever ended the call.
			for i := range 2 {
				_, err := cs.ListTools(ctx, nil)
				if err == nil || !strings.HasSuffix(err.Error(), ": Gone") {
					t.Fatalf("request %d after the kill: %v, want Gone", i+1, err)
				}
				if i == 1 && !strings.Contains(err.Error(), "connection closed") {
					t.Fatalf("request 2 after the kill: %v, want the session closed", err)
				}
			}
		})
	}
}

// Many agents on several sandboxes at once, each session with its
// standalone stream and progress on every call: every answer comes from
// the session's own sandbox and session, and everything is released.
func TestMCPSessionsAcrossSandboxes(t *testing.T) {
	const boxes, perBox, calls = 4, 12, 8
	h := newHarness(t)
	hosts := make([]string, boxes)
	for b := range boxes {
		srv := newAgentServer()
		id := fmt.Sprintf("fleet%d", b)
		mcp.AddTool(srv, &mcp.Tool{Name: "whoami"}, func(ctx context.Context, req *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, any, error) {
			_ = req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: req.Params.GetProgressToken(), Progress: 1})
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: id + "/" + req.Session.ID()}}}, nil, nil
		})
		hosts[b] = agentGateway(t, h, id, srv, nil, nil)
	}
	ctx, cancel := context.WithTimeout(context.Background(), bulkMCPTimeout)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, boxes*perBox)
	for b := range boxes {
		for range perBox {
			wg.Go(func() {
				var progress atomic.Int64
				tr := &mcp.StreamableClientTransport{Endpoint: "http://" + h.addr + "/mcp", MaxRetries: -1,
					HTTPClient: &http.Client{Transport: hostTransport{host: hosts[b], base: h.client.Transport}}}
				cs, err := mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "v1"}, &mcp.ClientOptions{
					ProgressNotificationHandler: func(context.Context, *mcp.ProgressNotificationClientRequest) { progress.Add(1) },
				}).Connect(ctx, tr, nil)
				if err != nil {
					errs <- err
					return
				}
				defer cs.Close()
				want := fmt.Sprintf("fleet%d/%s", b, cs.ID())
				for range calls {
					res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "whoami", Meta: mcp.Meta{"progressToken": "p"}})
					if err != nil {
						errs <- err
						return
					}
					if got := res.Content[0].(*mcp.TextContent).Text; got != want {
						errs <- fmt.Errorf("session %s got the answer for %s", want, got)
						return
					}
				}
				// The client runs notification handlers on its own
				// goroutines: the last may still be on its way when the
				// result has been returned.
				deadline := time.Now().Add(5 * time.Second)
				for progress.Load() < calls && time.Now().Before(deadline) {
					time.Sleep(10 * time.Millisecond)
				}
				if n := progress.Load(); n != calls {
					errs <- fmt.Errorf("session %s: %d progress notifications, want %d", want, n, calls)
				}
			})
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	testenv.WaitFor(t, 10*time.Second, "every stream and slot released", func() bool {
		s, _ := h.proxy.streams.open()
		for b := range boxes {
			if h.proxy.sandboxes.get(fmt.Appendf(nil, "fleet%d", b)).inFlight() != 0 {
				return false
			}
		}
		return s == 0
	})
}

// Large tool arguments (the request body of the call, streamed to the
// gateway) and a large result on the same session, in both answer modes.
// The go-sdk gateway refuses bodies over 4 MiB unless told otherwise.
//
// The sizes are what the property needs, no more: under -race each MiB
// costs 2-3 s of JSON encoding and copying in the go-sdk (the proxy's part
// is a small share), and 6 MiB arguments with a 5 MiB result took 40 s.
// The arguments are just past 4 MiB, the go-sdk gateway's default limit
// and the proxy's max_held_body, so the raised limit is seen to pass
// through the proxy; the result, 1 MiB, spans sixteen of the proxy's
// 64 KiB pieces, enough to show the session still carries a large answer
// after them (TestMCPLargeToolResults covers 4 MiB results alone).
const (
	largeArgumentBytes = 4<<20 + 64<<10
	resultAfterArgs    = 1 << 20
)

func TestMCPLargeArguments(t *testing.T) {
	for _, jsonResp := range []bool{false, true} {
		t.Run(fmt.Sprintf("json=%v", jsonResp), func(t *testing.T) {
			t.Parallel()
			h := newHarness(t)
			srv := newAgentServer()
			mcp.AddTool(srv, &mcp.Tool{Name: "check"}, func(_ context.Context, _ *mcp.CallToolRequest, in struct {
				S string `json:"s"`
			}) (*mcp.CallToolResult, any, error) {
				return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: fmt.Sprint(len(in.S), in.S == bigText(len(in.S)))}}}, nil, nil
			})
			host := agentGateway(t, h, "argbox", srv, &mcp.StreamableHTTPOptions{JSONResponse: jsonResp, MaxRequestBodyBytes: 64 << 20}, nil)
			ctx, cancel := context.WithTimeout(context.Background(), bulkMCPTimeout)
			defer cancel()
			cs := agentConnect(t, ctx, h, host, nil, nil)
			for _, n := range []int{largeArgumentBytes} {
				res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "check", Arguments: map[string]any{"s": bigText(n)}})
				if err != nil {
					t.Fatalf("%d-byte argument: %v", n, err)
				}
				if got := res.Content[0].(*mcp.TextContent).Text; got != fmt.Sprint(n, true) {
					t.Fatalf("%d-byte argument arrived as %s", n, got)
				}
			}
			res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "big", Arguments: map[string]any{"n": resultAfterArgs}})
			if err != nil || res.Content[0].(*mcp.TextContent).Text != bigText(resultAfterArgs) {
				t.Fatalf("%d-byte result after large arguments: %v", resultAfterArgs, err)
			}
		})
	}
}

// A server notification that is no call's (tools/list_changed) reaches the
// agent on the standalone GET stream while a call holds its POST open on
// another connection: the tool answers only once the agent has it.
func TestMCPStandaloneNotificationDuringCall(t *testing.T) {
	h := newHarness(t)
	srv := newAgentServer()
	changed := make(chan struct{}, 4)
	mcp.AddTool(srv, &mcp.Tool{Name: "hold"}, func(ctx context.Context, _ *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, any, error) {
		mcp.AddTool(srv, &mcp.Tool{Name: "late"}, func(context.Context, *mcp.CallToolRequest, struct{}) (*mcp.CallToolResult, any, error) {
			return &mcp.CallToolResult{}, nil, nil
		})
		select {
		case <-changed:
		case <-time.After(5 * time.Second):
			return nil, nil, errors.New("tools/list_changed never reached the agent while the call was open")
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		}
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "ok"}}}, nil, nil
	})
	host := agentGateway(t, h, "notebox", srv, nil, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cs := agentConnect(t, ctx, h, host, &mcp.ClientOptions{
		ToolListChangedHandler: func(context.Context, *mcp.ToolListChangedRequest) { changed <- struct{}{} },
	}, nil)
	testenv.WaitFor(t, 10*time.Second, "the standalone stream is open at the proxy", func() bool {
		s, _ := h.proxy.streams.open()
		return s == 1
	})
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "hold"})
	if err != nil {
		t.Fatal(err)
	}
	if res.IsError {
		t.Fatal(res.Content[0].(*mcp.TextContent).Text)
	}
}

// A call's answer stream cut by the sandbox side after its first event
// (the gateway's connection reset): the go-sdk agent resumes it with
// Last-Event-ID on a GET and gets the result the tool gives afterwards.
func TestMCPCallStreamResumedAfterSandboxCut(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	srv := newAgentServer()
	release := addFinishTool(srv)
	var mu sync.Mutex
	var postConn net.Conn
	resumed := make(chan string, 4)
	hd := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv },
		&mcp.StreamableHTTPOptions{EventStore: mcp.NewMemoryEventStore(nil), DisableLocalhostProtection: true})
	ln := listen(t, "127.0.0.1:0")
	bs := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if id := r.Header.Get("Last-Event-ID"); r.Method == "GET" && id != "" {
				resumed <- id
			}
			if r.Method == "POST" {
				mu.Lock()
				postConn = r.Context().Value(connKey{}).(net.Conn)
				mu.Unlock()
			}
			hd.ServeHTTP(w, r)
		}),
		ConnContext: func(ctx context.Context, c net.Conn) context.Context { return context.WithValue(ctx, connKey{}, c) },
	}
	go bs.Serve(ln)
	t.Cleanup(func() { bs.Close() })
	h.put("callcut", map[string]string{"HostIP": "127.0.0.1", "CreatedAt": "1", "50005": itoa(uint16(ln.Addr().(*net.TCPAddr).Port))})
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	progressed := make(chan struct{}, 1)
	cs := agentConnect(t, ctx, h, "50005-callcut.cube.test", &mcp.ClientOptions{
		ProgressNotificationHandler: func(context.Context, *mcp.ProgressNotificationClientRequest) { progressed <- struct{}{} },
	}, &mcp.StreamableClientTransport{DisableStandaloneSSE: true, MaxRetries: 5})
	done := callFinish(ctx, cs)
	waitProgress(t, ctx, progressed, done)
	mu.Lock()
	postConn.Close() // the call's POST is the last one the gateway got
	mu.Unlock()
	select {
	case <-resumed:
	case err := <-done:
		t.Fatalf("the call ended instead of resuming: %v", err)
	case <-ctx.Done():
		t.Fatal("the agent never resumed the cut call stream")
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatalf("call after resumption: %v", err)
	}
}

// The whole agent flow over the HTTPS listener, where the proxy finds the
// socket under tls.Conn: a large result, a stateless call cancelled by
// hanging up, and the notification stream (the standalone GET, or the
// stateless protocol's subscriptions/listen POST) ended at the gateway when
// the agent closes its session.
func TestMCPOverTLS(t *testing.T) {
	const tlsResultBytes = 1 << 20
	h := newHarness(t, func(o *harnessOpts) { o.cfg.HeartbeatInterval = time.Hour })
	tlsAddr, roots := serveTLS(t, h)
	toolDone := make(chan error, 1)
	started := make(chan struct{}, 1)
	srv := newAgentServer()
	mcp.AddTool(srv, &mcp.Tool{Name: "hang"}, func(ctx context.Context, _ *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, any, error) {
		started <- struct{}{}
		<-ctx.Done()
		toolDone <- ctx.Err()
		return nil, nil, ctx.Err()
	})
	for _, stateless := range []bool{false, true} {
		t.Run(fmt.Sprintf("stateless=%v", stateless), func(t *testing.T) {
			getEnded := make(chan struct{}, 4)
			id := fmt.Sprintf("tls%v", stateless)
			host := agentGateway(t, h, id, srv, &mcp.StreamableHTTPOptions{Stateless: stateless, PropagateRequestCancellation: true},
				func(next http.Handler) http.Handler {
					return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
						next.ServeHTTP(w, r)
						if r.Method == "GET" || r.Header.Get("Mcp-Method") == "subscriptions/listen" {
							getEnded <- struct{}{}
						}
					})
				})
			ctx, cancel := context.WithTimeout(context.Background(), bulkMCPTimeout)
			defer cancel()
			base := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots, ServerName: host}}
			defer base.CloseIdleConnections()
			tr := &mcp.StreamableClientTransport{Endpoint: "https://" + tlsAddr + "/mcp", MaxRetries: -1,
				HTTPClient: &http.Client{Transport: hostTransport{host: host, base: base}}}
			// A list_changed handler makes a stateless agent hold a
			// subscriptions/listen stream, as a stateful one holds its GET.
			cs, err := mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "v1"}, &mcp.ClientOptions{
				ToolListChangedHandler: func(context.Context, *mcp.ToolListChangedRequest) {},
			}).Connect(ctx, tr, nil)
			if err != nil {
				t.Fatalf("connect over TLS: %v", err)
			}
			// 1 MiB: sixteen of the proxy's 64 KiB pieces, 64 TLS
			// records. It was 5 MiB, at 2-3 s a MiB under -race, nearly
			// all in the go-sdk's JSON on both ends.
			res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "big", Arguments: map[string]any{"n": tlsResultBytes}})
			if err != nil || res.Content[0].(*mcp.TextContent).Text != bigText(tlsResultBytes) {
				t.Fatalf("%d-byte result over TLS: %v", tlsResultBytes, err)
			}
			if stateless {
				cancelCall(t, ctx, cs, &mcp.CallToolParams{Name: "hang"}, started, toolDone, 5*time.Second)
			}
			testenv.WaitFor(t, 10*time.Second, "the notification stream is open", func() bool {
				s, _ := h.proxy.streams.open()
				return s == 1
			})
			if err := cs.Close(); err != nil {
				t.Fatalf("close: %v", err)
			}
			select {
			case <-getEnded:
			case <-time.After(5 * time.Second):
				t.Fatal("the notification stream still runs at the gateway 5s after the agent closed")
			}
			testenv.WaitFor(t, 10*time.Second, "every stream released", func() bool {
				s, _ := h.proxy.streams.open()
				return s == 0
			})
		})
	}
}

// An agent given a signed URL instead of the traffic token keeps its
// session only as long as the token: requests that accept an event stream
// are let through without a cookie, so after the expiry each is a 403,
// which ends the go-sdk session.
func TestMCPSignedURLSessionEndsWithItsToken(t *testing.T) {
	t.Parallel()
	signer := testSigner(t)
	h := newHarness(t, func(o *harnessOpts) { o.cfg.Signer = signer })
	srv := newAgentServer()
	port := backend(t, "127.0.0.1", mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv },
		&mcp.StreamableHTTPOptions{DisableLocalhostProtection: true}))
	h.put("signedmcp", map[string]string{"HostIP": "127.0.0.1", "CreatedAt": "1", "50005": itoa(port),
		"AllowPublicTraffic": "false", "TrafficAccessToken": strings.Repeat("a", 64)})
	// Three seconds: the connect and the first call must fit before the
	// expiry under -race on a loaded machine.
	expiry := time.Now().Add(3 * time.Second)
	tok, err := signer.Sign("signedmcp", 50005, expiry)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tr := &mcp.StreamableClientTransport{Endpoint: "http://" + h.addr + "/mcp?cube_token=" + tok, MaxRetries: -1, DisableStandaloneSSE: true,
		HTTPClient: &http.Client{Transport: hostTransport{host: "50005-signedmcp.cube.test", base: h.client.Transport}}}
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "v1"}, nil).Connect(ctx, tr, nil)
	if err != nil {
		t.Fatalf("connect with a signed URL: %v", err)
	}
	defer cs.Close()
	if _, err := cs.ListTools(ctx, nil); err != nil {
		t.Fatalf("call before expiry: %v", err)
	}
	// Not synchronisation: the clock has to pass the token's expiry
	// (checked to the second).
	time.Sleep(time.Until(expiry) + 1100*time.Millisecond)
	if _, err := cs.ListTools(ctx, nil); err == nil || !strings.HasSuffix(err.Error(), "Forbidden") {
		t.Fatalf("call after the signed URL expired: %v, want Forbidden", err)
	}
	// A 403 is no transient error to the go-sdk: the session is over.
	if _, err := cs.ListTools(ctx, nil); err == nil || !strings.Contains(err.Error(), "connection closed") {
		t.Fatalf("call after the 403: %v, want the session closed", err)
	}
}

// A go-sdk gateway with its default options on a loopback socket (a
// server bound to 127.0.0.1 inside the sandbox, reached through a port
// forwarder) refuses every request whose Host is not a loopback name, as
// its DNS-rebinding guard: through the proxy, which passes the sandbox's
// public Host, the agent gets that 403 (relayed, not the proxy's). A route's
// MaskRequestHost "localhost:${PORT}" lets it through, the public Host kept
// in X-Forwarded-Host.
func TestMCPDefaultGatewayOnLoopback(t *testing.T) {
	for _, mask := range []string{"", "localhost:${PORT}"} {
		t.Run(fmt.Sprintf("mask=%q", mask), func(t *testing.T) {
			h := newHarness(t)
			srv := newAgentServer()
			var fwdHost atomic.Value
			gw := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, nil)
			port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				fwdHost.Store(r.Host + " " + r.Header.Get("X-Forwarded-Host"))
				gw.ServeHTTP(w, r)
			}))
			fields := map[string]string{"HostIP": "127.0.0.1", "CreatedAt": "1", "50005": itoa(port)}
			if mask != "" {
				fields["MaskRequestHost"] = mask
			}
			h.put("loopgw", fields)
			host := "50005-loopgw.cube.test"
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			tr := &mcp.StreamableClientTransport{Endpoint: "http://" + h.addr + "/mcp", MaxRetries: -1,
				HTTPClient: &http.Client{Transport: hostTransport{host: host, base: h.client.Transport}}}
			cs, err := mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "v1"}, nil).Connect(ctx, tr, nil)
			if mask == "" {
				if err == nil || !strings.HasSuffix(err.Error(), "Forbidden") {
					t.Fatalf("default gateway on loopback, public Host: %v, want its 403", err)
				}
				if got := fwdHost.Load(); got != host+" " {
					t.Fatalf("the gateway saw Host, X-Forwarded-Host %q", got)
				}
				return
			}
			if err != nil {
				t.Fatalf("connect with MaskRequestHost %q: %v", mask, err)
			}
			defer cs.Close()
			if _, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "big", Arguments: map[string]any{"n": 10}}); err != nil {
				t.Fatalf("call: %v", err)
			}
			if got := fwdHost.Load(); got != "localhost:50005 "+host {
				t.Fatalf("the gateway saw Host, X-Forwarded-Host %q", got)
			}
		})
	}
}

// With max_streams_per_sandbox, every agent's standalone GET stream holds
// a slot for its session's life, beside one per request in flight, so the
// limit counts sessions as well as calls. A go-sdk connect takes two at
// once: the client opens its GET as soon as the initialize result event
// arrives, before that answer's stream has ended (at 1 the GET waits for
// that stream's slot, TestMCPConnectAtStreamLimitOne; its
// notifications/initialized passes the limit, see
// TestStreamLimitAdmitsStreamlessPOSTs). At 3, one session
// with two calls in flight refuses a second agent (429) and its own further
// calls (429, transient to the go-sdk: the session survives); the calls' end
// frees their slots and the session's close the last.
func TestMCPStreamLimitCountsSessions(t *testing.T) {
	h := newHarness(t, func(o *harnessOpts) { o.cfg.MaxStreamsPerSandbox = 3 })
	srv := newAgentServer()
	release := addFinishTool(srv)
	host := agentGateway(t, h, "limitbox", srv, nil, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	first := agentConnect(t, ctx, h, host, nil, nil)
	sb := h.proxy.sandboxes.get([]byte("limitbox"))
	testenv.WaitFor(t, 10*time.Second, "the first agent's GET stream holds a slot", func() bool {
		s, _ := h.proxy.streams.open()
		return s == 1 && sb.inFlight() == 1
	})
	// The calls end by finishing (TestMCPCancelAtStreamLimit cancels at
	// the limit).
	done1, done2 := callFinish(ctx, first), callFinish(ctx, first)
	testenv.WaitFor(t, 10*time.Second, "the calls hold the other slots", func() bool { return sb.inFlight() == 3 })
	connect := func() (*mcp.ClientSession, error) {
		tr := &mcp.StreamableClientTransport{Endpoint: "http://" + h.addr + "/mcp", MaxRetries: -1,
			HTTPClient: &http.Client{Transport: hostTransport{host: host, base: h.client.Transport}}}
		return mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "v1"}, nil).Connect(ctx, tr, nil)
	}
	if _, err := connect(); err == nil || !strings.HasSuffix(err.Error(), "Too Many Requests") {
		t.Fatalf("second agent while a session and two calls are open: %v, want Too Many Requests", err)
	}
	if _, err := first.CallTool(ctx, &mcp.CallToolParams{Name: "big", Arguments: map[string]any{"n": 3}}); err == nil ||
		!strings.HasSuffix(err.Error(), "Too Many Requests") {
		t.Fatalf("third call of the session: %v, want Too Many Requests", err)
	}
	close(release)
	for _, done := range []<-chan error{done1, done2} {
		if err := <-done; err != nil {
			t.Fatalf("a call in flight: %v", err)
		}
	}
	testenv.WaitFor(t, 10*time.Second, "the calls' slots freed", func() bool { return sb.inFlight() == 1 })
	if _, err := first.CallTool(ctx, &mcp.CallToolParams{Name: "big", Arguments: map[string]any{"n": 3}}); err != nil {
		t.Fatalf("the same session once the call ended: %v", err)
	}
	if err := first.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	testenv.WaitFor(t, 10*time.Second, "the session's slot freed", func() bool { return sb.inFlight() == 0 })
}
