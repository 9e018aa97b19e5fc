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
			<-started
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
	case <-time.After(2 * time.Second):
		t.Fatal("the gateway's POST handler still runs 2s after the client closed its connection")
	}
	testenv.WaitFor(t, 2*time.Second, "the call's stream released at the proxy", func() bool {
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
