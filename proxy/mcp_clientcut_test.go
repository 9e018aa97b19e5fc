package proxy

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// connCutter dials the proxy for an agent and can cut every connection it
// made, as an agent's network change or a NAT that forgets it does.
type connCutter struct {
	mu    sync.Mutex
	conns []net.Conn
}

func (c *connCutter) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	conn, err := (&net.Dialer{}).DialContext(ctx, network, addr)
	if err == nil {
		c.mu.Lock()
		c.conns = append(c.conns, conn)
		c.mu.Unlock()
	}
	return conn, err
}

func (c *connCutter) cutAll() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, conn := range c.conns {
		conn.Close()
	}
	c.conns = nil
}

// gatewaySaw is what a gateway observed of one request.
type gatewaySaw struct {
	method, session, version, auth, lastEventID string
	proxyCredential                             bool
}

// The go-sdk agent's own connection to the proxy is cut while a tool call's
// answer streams (the TypeScript SDK's case is in mcp_tsclient_test.go; the
// raw resumption in TestMCPResumeCallAnswerAfterClientCut): the SDK itself
// resumes the call with Last-Event-ID through the proxy, and gets the
// progress the tool sent meanwhile and the result. On a restricted route,
// with the gateway's own Bearer: every request, the resumption GET and the
// session's DELETE included, passes the proxy's check (the traffic token,
// removed) and reaches the gateway with its Authorization untouched and
// the session's Mcp-Session-Id and MCP-Protocol-Version, and the gateway's
// Mcp-Session-Id comes back to the agent.
func TestMCPGoSDKResumesCallAfterClientCut(t *testing.T) {
	const traffic = "fedcba9876543210fedcba9876543210fedcba9876543210fedcba9876543210"
	const bearer = "Bearer gw/resume+token="
	h := newHarness(t, func(o *harnessOpts) { o.cfg.HeartbeatInterval = time.Hour })
	srv := newAgentServer()
	release := make(chan struct{})
	mcp.AddTool(srv, &mcp.Tool{Name: "steps"}, func(ctx context.Context, req *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, any, error) {
		tok := req.Params.GetProgressToken()
		_ = req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: tok, Progress: 1, Message: "first"})
		select {
		case <-release:
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		}
		// The agent is away: these wait in the gateway's event store.
		_ = req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: tok, Progress: 2, Message: "second"})
		_ = req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: tok, Progress: 3, Message: "third"})
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "steps done"}}}, nil, nil
	})
	var mu sync.Mutex
	var saw []gatewaySaw
	callEnded := make(chan struct{}, 4)
	gw := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv },
		&mcp.StreamableHTTPOptions{EventStore: mcp.NewMemoryEventStore(nil), DisableLocalhostProtection: true})
	port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		saw = append(saw, gatewaySaw{
			method: r.Method, session: r.Header.Get("Mcp-Session-Id"), version: r.Header.Get("Mcp-Protocol-Version"),
			auth: r.Header.Get("Authorization"), lastEventID: r.Header.Get("Last-Event-ID"),
			proxyCredential: r.Header.Get("Cube-Traffic-Access-Token") != "" || r.Header.Get("E2b-Traffic-Access-Token") != "",
		})
		mu.Unlock()
		if r.Header.Get("Authorization") != bearer {
			http.Error(w, "gateway says no", http.StatusUnauthorized)
			return
		}
		body, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(body))
		gw.ServeHTTP(w, r)
		if r.Method == "POST" && bytes.Contains(body, []byte(`"steps"`)) {
			callEnded <- struct{}{}
		}
	}))
	h.put("resumecut", map[string]string{"HostIP": "127.0.0.1", "CreatedAt": "1", "50005": itoa(port),
		"AllowPublicTraffic": "false", "TrafficAccessToken": traffic})
	host := "50005-resumecut.cube.test"

	var cutter connCutter
	var respMu sync.Mutex
	var respSessions []string // Mcp-Session-Id of each answer the agent got
	base := &http.Transport{DialContext: cutter.dial, DisableCompression: true}
	t.Cleanup(base.CloseIdleConnections)
	rt := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		resp, err := hostTransport{host: host, headers: map[string]string{"Cube-Traffic-Access-Token": traffic, "Authorization": bearer}, base: base}.RoundTrip(r)
		if err == nil {
			respMu.Lock()
			respSessions = append(respSessions, r.Method+" "+resp.Header.Get("Mcp-Session-Id"))
			respMu.Unlock()
		}
		return resp, err
	})
	progress := make(chan string, 8)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cs := agentConnect(t, ctx, h, host, &mcp.ClientOptions{
		ProgressNotificationHandler: func(_ context.Context, req *mcp.ProgressNotificationClientRequest) {
			progress <- req.Params.Message
		},
	}, &mcp.StreamableClientTransport{HTTPClient: &http.Client{Transport: rt}, DisableStandaloneSSE: true, MaxRetries: 3})
	sid, version := cs.ID(), cs.InitializeResult().ProtocolVersion

	done := callTool(ctx, cs, "steps", "steps done")
	var got []string
	select {
	case m := <-progress:
		got = append(got, m)
	case err := <-done:
		t.Fatalf("the call ended before its first progress: %v", err)
	case <-ctx.Done():
		t.Fatal("no first progress")
	}
	cutter.cutAll()
	// The proxy must end the gateway's POST at the agent's cut: a gateway
	// that thinks the stream open refuses its resumption.
	testenv.Recv(t, callEnded, 10*time.Second, "the call's POST ended at the gateway after the agent's cut")
	close(release)
	if err := testenv.Recv(t, done, 20*time.Second, "the resumed call's result"); err != nil {
		t.Fatalf("the call after the cut: %v", err)
	}
	for len(got) < 3 {
		got = append(got, testenv.Recv(t, progress, 5*time.Second, "the progress sent while the agent was away"))
	}
	if want := []string{"first", "second", "third"}; !slices.Equal(got, want) {
		t.Fatalf("progress %q, want %q", got, want)
	}
	if _, err := cs.ListTools(ctx, nil); err != nil {
		t.Fatalf("the session after the resumed call: %v", err)
	}
	if err := cs.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}

	mu.Lock()
	defer mu.Unlock()
	var resumed, deleted, inSession bool
	for _, s := range saw {
		if s.auth != bearer || s.proxyCredential {
			t.Errorf("%s reached the gateway with Authorization %q, the proxy's credential %v", s.method, s.auth, s.proxyCredential)
		}
		// The SDK's connect sends a request or two before the session
		// exists (a discovery probe, initialize).
		if inSession = inSession || s.session != ""; !inSession {
			continue
		}
		if s.session != sid || s.version != version {
			t.Errorf("%s reached the gateway with Mcp-Session-Id %q, MCP-Protocol-Version %q; want %q, %q", s.method, s.session, s.version, sid, version)
		}
		resumed = resumed || s.method == "GET" && s.lastEventID != ""
		deleted = deleted || s.method == "DELETE"
	}
	if !resumed {
		t.Errorf("no GET with Last-Event-ID reached the gateway: %+v", saw)
	}
	if !deleted {
		t.Errorf("the session's DELETE never reached the gateway: %+v", saw)
	}
	respMu.Lock()
	defer respMu.Unlock()
	if !slices.Contains(respSessions, "POST "+sid) {
		t.Errorf("the initialize answer's Mcp-Session-Id did not reach the agent: %q", respSessions)
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// A session's standalone GET stream is quiet for long stretches: the
// proxy's client timeouts (client.read_timeout, write_timeout,
// idle_timeout) and upstream.response_header_timeout, all far shorter here
// than the quiet spell, must not end it (README: only upstream.idle_timeout
// ends a quiet one, and heartbeats, an hour apart here, keep the hops in
// front). The gateway's notification after the spell reaches the agent on
// the stream it opened first, which the gateway saw only once.
func TestMCPStandaloneStreamOutlastsClientTimeouts(t *testing.T) {
	// Short, but not so short that a loaded machine's pause between the
	// connect's requests meets client.idle_timeout (the go-sdk's POSTs are
	// not retried on a keep-alive connection closed under them).
	const short = 300 * time.Millisecond
	h := newHarness(t, func(o *harnessOpts) {
		o.cfg.HeartbeatInterval = time.Hour
		o.cfg.ResponseHeaderTimeout = short
		o.srv.ClientReadTimeout, o.srv.ClientWriteTimeout, o.srv.ClientIdleTimeout = short, short, short
	})
	srv := newAgentServer()
	var mu sync.Mutex
	gets := 0
	host := agentGateway(t, h, "quietget", srv, nil, func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method == "GET" {
				mu.Lock()
				gets++
				mu.Unlock()
			}
			next.ServeHTTP(w, r)
		})
	})
	changed := make(chan struct{}, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cs := agentConnect(t, ctx, h, host, &mcp.ClientOptions{
		ToolListChangedHandler: func(context.Context, *mcp.ToolListChangedRequest) { changed <- struct{}{} },
	}, nil)
	testenv.WaitFor(t, 10*time.Second, "the standalone GET stream open at the proxy", func() bool {
		s, _ := h.proxy.streams.open()
		return s == 1
	})
	// The quiet spell: what is proved is that nothing happens, so it takes
	// its time (six of each timeout).
	time.Sleep(6 * short)
	listChangedArrives(t, ctx, h, srv, changed, "standalone GET stream")
	if _, err := cs.ListTools(ctx, nil); err != nil {
		t.Fatalf("a call after the quiet spell: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if gets != 1 {
		t.Fatalf("the gateway saw %d GET streams: the first was cut and the agent reconnected", gets)
	}
}
