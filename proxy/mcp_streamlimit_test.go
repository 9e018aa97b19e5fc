package proxy

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// At max_streams_per_sandbox an agent must still reach its gateway with
// what frees the slots it holds: notifications/cancelled for a running
// call, and its answer to the gateway's elicitation. Everything that opens
// a stream is still refused.

// addHoldTool adds "hold": it reports progress (so that the call's answer
// stream is open at the client), says it started, and returns when its
// context is cancelled (sending ctx.Err() on ended) or, at the test's end,
// when released.
func addHoldTool(t *testing.T, srv *mcp.Server) (started <-chan struct{}, ended <-chan error) {
	st, en, release := make(chan struct{}, 4), make(chan error, 4), make(chan struct{})
	t.Cleanup(func() { close(release) })
	mcp.AddTool(srv, &mcp.Tool{Name: "hold"}, func(ctx context.Context, req *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, any, error) {
		_ = req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: req.Params.GetProgressToken(), Progress: 1})
		st <- struct{}{}
		select {
		case <-ctx.Done():
			en <- ctx.Err()
			return nil, nil, ctx.Err()
		case <-release:
			en <- nil
			return &mcp.CallToolResult{}, nil, nil
		}
	})
	return st, en
}

// callHold starts a call of the hold tool (addHoldTool) on cs, which takes
// one of the sandbox's slots, and returns once the tool runs: cancel ends
// the call, and done says how it ended.
func callHold(t *testing.T, ctx context.Context, cs *mcp.ClientSession, started <-chan struct{}) (cancel context.CancelFunc, done <-chan error) {
	t.Helper()
	holdCtx, holdCancel := context.WithCancel(ctx)
	holdErr := make(chan error, 1)
	go func() {
		_, err := cs.CallTool(holdCtx, &mcp.CallToolParams{Name: "hold", Meta: mcp.Meta{"progressToken": "p"}})
		holdErr <- err
	}()
	select {
	case <-started:
	case err := <-holdErr:
		holdCancel()
		t.Fatalf("hold call ended before its tool started: %v", err)
	}
	return holdCancel, holdErr
}

// agentWire sits between the go-sdk client and the proxy: it records the
// status of every POST whose body contains one of the watched strings (and
// of every DELETE, under "DELETE"), and
// sends tools/call POSTs on a context the agent's cancellation does not
// reach. The call's connection then stays open after the agent gives up on
// it, as it does until the proxy sees the client leave (and for as long as
// a client or a proxy in front keeps it): the call's slot stays held, and
// the only way to end the tool is the agent's notifications/cancelled.
type agentWire struct {
	base  http.RoundTripper
	watch []string

	mu   sync.Mutex
	seen map[string][]int
}

func (w *agentWire) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Method == http.MethodDelete {
		resp, err := w.base.RoundTrip(r)
		if err == nil {
			w.note(http.MethodDelete, resp.StatusCode)
		}
		return resp, err
	}
	if r.Method != http.MethodPost || r.Body == nil {
		return w.base.RoundTrip(r)
	}
	body, err := io.ReadAll(r.Body)
	r.Body.Close()
	if err != nil {
		return nil, err
	}
	ctx := r.Context()
	if bytes.Contains(body, []byte(`"method":"tools/call"`)) {
		ctx = context.WithoutCancel(ctx)
	}
	r = r.Clone(ctx)
	r.Body = io.NopCloser(bytes.NewReader(body))
	resp, err := w.base.RoundTrip(r)
	for _, s := range w.watch {
		if err == nil && bytes.Contains(body, []byte(s)) {
			w.note(s, resp.StatusCode)
		}
	}
	return resp, err
}

// note records status for the requests keyed s.
func (w *agentWire) note(s string, status int) {
	w.mu.Lock()
	w.seen[s] = append(w.seen[s], status)
	w.mu.Unlock()
}

// statuses returns the statuses the POSTs containing s (or the DELETEs)
// got.
func (w *agentWire) statuses(s string) []int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]int(nil), w.seen[s]...)
}

// streamLimitAgent connects an agent (without the standalone GET stream,
// so that a connect needs at most two slots) through the proxy with
// max_streams_per_sandbox 2, to a gateway serving srv.
func streamLimitAgent(t *testing.T, ctx context.Context, id string, srv *mcp.Server, copts *mcp.ClientOptions, watch ...string) (*harness, *sandboxState, *mcp.ClientSession, *agentWire) {
	h := newHarness(t, func(o *harnessOpts) { o.cfg.MaxStreamsPerSandbox = 2 })
	host := agentGateway(t, h, id, srv, nil, nil)
	wire := &agentWire{base: hostTransport{host: host, base: h.client.Transport}, watch: watch, seen: map[string][]int{}}
	sb := h.proxy.sandboxes.get([]byte(id))
	return h, sb, wiredAgent(t, ctx, h, sb, wire, copts), wire
}

// wiredAgent connects an agent as streamLimitAgent does, through wire, to
// the sandbox sb whose gateway wire reaches: another session beside the
// first.
func wiredAgent(t *testing.T, ctx context.Context, h *harness, sb *sandboxState, wire *agentWire, copts *mcp.ClientOptions) *mcp.ClientSession {
	t.Helper()
	cs := agentConnect(t, ctx, h, "", copts, &mcp.StreamableClientTransport{DisableStandaloneSSE: true, HTTPClient: &http.Client{Transport: wire}})
	// The go-sdk client takes the initialize result from its answer's
	// event stream and goes on before the gateway has ended that stream,
	// so under load its next request can find the connect's still
	// counted, and the tests' first calls at the limit of 2 got 429.
	// They are about the limit with calls running, not about that window.
	testenv.WaitFor(t, 10*time.Second, "the connect's requests counted out", func() bool { return sb.inFlight() == 0 })
	return cs
}

// The sandbox is at its limit because of two long tool calls of the
// agent. A new call is refused (429), but the agent's cancellation of one
// call reaches the gateway: the tool sees its context cancelled, and its
// slot is free once the gateway ends the call's answer.
func TestMCPCancelAtStreamLimit(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	srv := newAgentServer()
	started, ended := addHoldTool(t, srv)
	_, sb, cs, wire := streamLimitAgent(t, ctx, "cancelbox", srv, nil, "notifications/cancelled")

	type call struct {
		cancel context.CancelFunc
		err    chan error
	}
	hold := func() call {
		callCtx, callCancel := context.WithCancel(ctx)
		c := call{callCancel, make(chan error, 1)}
		go func() {
			_, err := cs.CallTool(callCtx, &mcp.CallToolParams{Name: "hold", Meta: mcp.Meta{"progressToken": "p"}})
			c.err <- err
		}()
		select {
		case <-started:
		case err := <-c.err:
			t.Fatalf("hold call ended before its tool started: %v", err)
		case <-ctx.Done():
			t.Fatal("the hold tool never started")
		}
		return c
	}
	first, second := hold(), hold()
	if n := sb.inFlight(); n != 2 {
		t.Fatalf("%d requests in flight with two calls running, want 2", n)
	}
	if _, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "big", Arguments: map[string]any{"n": 3}}); err == nil ||
		!strings.HasSuffix(err.Error(), "Too Many Requests") {
		t.Fatalf("a third call at the limit: %v, want Too Many Requests", err)
	}

	for i, c := range []call{first, second} {
		c.cancel()
		if err := <-c.err; !errors.Is(err, context.Canceled) {
			t.Fatalf("call %d: cancelled call returned %v", i, err)
		}
		select {
		case err := <-ended:
			if !errors.Is(err, context.Canceled) {
				t.Fatalf("call %d: the tool ended with %v, want its context cancelled", i, err)
			}
		case <-ctx.Done():
			t.Fatalf("call %d: the tool never saw the cancellation (notifications/cancelled got %v)", i, wire.statuses("notifications/cancelled"))
		}
	}
	// The gateway handles a notification before it answers the POST.
	testenv.WaitFor(t, 10*time.Second, "both notifications/cancelled answered", func() bool { return len(wire.statuses("notifications/cancelled")) == 2 })
	if got := wire.statuses("notifications/cancelled"); got[0] != http.StatusAccepted || got[1] != http.StatusAccepted {
		t.Fatalf("notifications/cancelled answered %v, want the gateway's 202 twice", got)
	}
	testenv.WaitFor(t, 10*time.Second, "the calls' slots freed", func() bool { return sb.inFlight() == 0 })
	if _, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "big", Arguments: map[string]any{"n": 3}}); err != nil {
		t.Fatalf("a call once the slots are free: %v", err)
	}
}

// The call that holds the last slot asks the agent a question
// (elicitation): the agent's answer, a JSON-RPC response POSTed to the
// gateway, passes the limit, and the call completes with it.
func TestMCPElicitationAnswerAtStreamLimit(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	srv := newAgentServer()
	started, ended := addHoldTool(t, srv)
	mcp.AddTool(srv, &mcp.Tool{Name: "ask"}, func(ctx context.Context, req *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, any, error) {
		el, err := req.Session.Elicit(ctx, &mcp.ElicitParams{Message: "colour?", RequestedSchema: map[string]any{"type": "object", "properties": map[string]any{"v": map[string]any{"type": "string"}}}})
		if err != nil {
			return nil, nil, err
		}
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "answer " + el.Content["v"].(string)}}}, nil, nil
	})
	copts := &mcp.ClientOptions{ElicitationHandler: func(context.Context, *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
		return &mcp.ElicitResult{Action: "accept", Content: map[string]any{"v": "blue"}}, nil
	}}
	_, sb, cs, wire := streamLimitAgent(t, ctx, "askbox2", srv, copts, `"action":"accept"`)

	holdCancel, holdErr := callHold(t, ctx, cs, started)
	// The ask call takes the second slot; its tool waits for the answer.
	askCtx, askCancel := context.WithTimeout(ctx, 5*time.Second)
	defer askCancel()
	res, err := cs.CallTool(askCtx, &mcp.CallToolParams{Name: "ask"})
	if err != nil {
		t.Fatalf("the call that elicits at the limit: %v (the answer's POST got %v)", err, wire.statuses(`"action":"accept"`))
	}
	if got := res.Content[0].(*mcp.TextContent).Text; res.IsError || got != "answer blue" {
		t.Fatalf("the call that elicits answered %q", got)
	}
	// The gateway handles the answer before it answers its POST.
	testenv.WaitFor(t, 10*time.Second, "the elicitation answer's POST answered", func() bool { return len(wire.statuses(`"action":"accept"`)) == 1 })
	if got := wire.statuses(`"action":"accept"`); got[0] != http.StatusAccepted {
		t.Fatalf("the elicitation answer's POST got %v, want the gateway's 202", got)
	}
	holdCancel()
	<-holdErr
	if err := testenv.Recv(t, ended, 10*time.Second, "the hold tool's end after its call's cancellation"); !errors.Is(err, context.Canceled) {
		t.Fatalf("the hold tool ended with %v", err)
	}
	testenv.WaitFor(t, 10*time.Second, "the calls' slots freed", func() bool { return sb.inFlight() == 0 })
}

// The sandbox is at its limit because of another session's two running
// tool calls. An agent closes its idle session: the go-sdk's DELETE passes
// the limit and the gateway ends the session. Refused, it would leave the
// session, and whatever it holds, to the gateway's own timeout.
func TestMCPCloseAtStreamLimit(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	srv := newAgentServer()
	started, ended := addHoldTool(t, srv)
	h, sb, closing, wire := streamLimitAgent(t, ctx, "closebox", srv, nil)
	holder := wiredAgent(t, ctx, h, sb, wire, nil)
	holdCtx, holdCancel := context.WithCancel(ctx)
	defer holdCancel()
	for range 2 {
		go func() {
			_, _ = holder.CallTool(holdCtx, &mcp.CallToolParams{Name: "hold", Meta: mcp.Meta{"progressToken": "p"}})
		}()
		select {
		case <-started:
		case <-ctx.Done():
			t.Fatal("the hold tool never started")
		}
	}
	if n := sb.inFlight(); n != 2 {
		t.Fatalf("%d requests in flight with two calls running, want 2", n)
	}
	gatewayHas := func(id string) bool {
		for ss := range srv.Sessions() {
			if ss.ID() == id {
				return true
			}
		}
		return false
	}
	id := closing.ID()
	if !gatewayHas(id) {
		t.Fatalf("the gateway has no session %q", id)
	}

	if err := closing.Close(); err != nil {
		t.Fatalf("close (DELETE) at the limit: %v", err)
	}
	if got := wire.statuses(http.MethodDelete); len(got) != 1 || got[0] != http.StatusNoContent {
		t.Fatalf("the session's DELETE at the limit got %v, want the gateway's 204", got)
	}
	testenv.WaitFor(t, 10*time.Second, "the gateway's session ended", func() bool { return !gatewayHas(id) })
	if !gatewayHas(holder.ID()) {
		t.Fatal("the other session ended too")
	}
	testenv.WaitFor(t, 10*time.Second, "the DELETE's slot freed", func() bool { return sb.inFlight() == 2 })

	// A go-sdk gateway closes a session (and answers its DELETE) only once
	// the session's running tools have returned: the other session's
	// calls are ended here by their cancellation, not left to its Close.
	holdCancel()
	for i := range 2 {
		select {
		case err := <-ended:
			if !errors.Is(err, context.Canceled) {
				t.Fatalf("call %d: the tool ended with %v, want its context cancelled", i, err)
			}
		case <-ctx.Done():
			t.Fatalf("call %d: the tool never saw the cancellation", i)
		}
	}
	testenv.WaitFor(t, 10*time.Second, "the calls' slots freed", func() bool { return sb.inFlight() == 0 })
}
