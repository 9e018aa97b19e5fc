package proxy

import (
	"context"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// What the README says of the go-sdk's other transports and protocols
// beside a Streamable HTTP session: the HTTP+SSE client with a signed URL,
// and protocol 2026-07-28's subscriptions/listen stream during a drain.

// tokenInURL puts the signed URL's cube_token back on every request that
// lacks it, as the README tells HTTP+SSE clients to.
type tokenInURL struct {
	token string
	base  http.RoundTripper
}

func (t tokenInURL) RoundTrip(r *http.Request) (*http.Response, error) {
	if !r.URL.Query().Has("cube_token") {
		r = r.Clone(r.Context())
		q := r.URL.Query()
		q.Set("cube_token", t.token)
		r.URL.RawQuery = q.Encode()
	}
	return t.base.RoundTrip(r)
}

// postStatuses records the status of every POST that goes through it.
type postStatuses struct {
	base     http.RoundTripper
	mu       sync.Mutex
	statuses []int
}

func (p *postStatuses) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := p.base.RoundTrip(r)
	if err == nil && r.Method == http.MethodPost {
		p.mu.Lock()
		p.statuses = append(p.statuses, resp.StatusCode)
		p.mu.Unlock()
	}
	return resp, err
}

func (p *postStatuses) get() []int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.statuses)
}

func (p *postStatuses) saw(status int) bool { return slices.Contains(p.get(), status) }

// The go-sdk's HTTP+SSE client resolves the endpoint the gateway announces
// (/sse?sessionid=…) against the URL it was given, query replaced, as the
// TypeScript SDK does: with a signed URL its first POST carries no token
// and connect fails with the proxy's 403. A transport that puts the token
// back on every URL works.
func TestMCPLegacySSESignedURL(t *testing.T) {
	signer := testSigner(t)
	h := newHarness(t, func(o *harnessOpts) { o.cfg.Signer = signer })
	srv := newAgentServer()
	port := backend(t, "127.0.0.1", mcp.NewSSEHandler(func(*http.Request) *mcp.Server { return srv }, &mcp.SSEOptions{DisableLocalhostProtection: true}))
	h.put("legacysigned", map[string]string{"HostIP": "127.0.0.1", "CreatedAt": "1", "50005": itoa(port),
		"AllowPublicTraffic": "false", "TrafficAccessToken": strings.Repeat("a", 64)})
	tok, err := signer.Sign("legacysigned", 50005, time.Now().Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	base := hostTransport{host: "50005-legacysigned.cube.test", base: h.client.Transport}
	// The client's error does not always name the 403: its close of the
	// event stream on the failed POST can win ("client is closing: EOF").
	// What the proxy answered the POST is read off the wire.
	rec := &postStatuses{base: base}
	tr := &mcp.SSEClientTransport{Endpoint: "http://" + h.addr + "/sse?cube_token=" + tok, HTTPClient: &http.Client{Transport: rec}}
	if _, err := mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "v1"}, nil).Connect(ctx, tr, nil); err == nil || !rec.saw(http.StatusForbidden) {
		t.Fatalf("connect over HTTP+SSE with a signed URL: %v, POSTs answered %v; want a failed connect and the proxy's 403", err, rec.get())
	}
	tr = &mcp.SSEClientTransport{Endpoint: "http://" + h.addr + "/sse?cube_token=" + tok, HTTPClient: &http.Client{Transport: tokenInURL{token: tok, base: base}}}
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "v1"}, nil).Connect(ctx, tr, nil)
	if err != nil {
		t.Fatalf("connect with the token put back on every URL: %v", err)
	}
	defer cs.Close()
	if _, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "big", Arguments: map[string]any{"n": 3}}); err != nil {
		t.Fatalf("call: %v", err)
	}
}

// Protocol 2026-07-28 (the go-sdk against a Stateless gateway) has no GET
// stream: an agent with a list-changed handler subscribes with a
// subscriptions/listen POST whose event stream lasts the agent's life. A
// drain ends GET event streams at once, but gives a POST's answer the
// drain time: the listen stream keeps carrying notifications during the
// drain (so such an agent holds the drain until its deadline or until it
// leaves), and is ended only then.
func TestMCPListenStreamGetsDrainTime(t *testing.T) {
	t.Parallel()
	h := newHarness(t, func(o *harnessOpts) { o.srv.DrainTimeout = 2 * time.Second })
	srv := newAgentServer()
	host := agentGateway(t, h, "listendrain", srv, &mcp.StreamableHTTPOptions{Stateless: true}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	changed := make(chan struct{}, 4)
	cs := agentConnect(t, ctx, h, host, &mcp.ClientOptions{
		ToolListChangedHandler: func(context.Context, *mcp.ToolListChangedRequest) { changed <- struct{}{} },
	}, nil)
	if v := cs.InitializeResult().ProtocolVersion; v < "2026-07-28" {
		t.Fatalf("protocol %s: want 2026-07-28 or later", v)
	}
	testenv.WaitFor(t, 10*time.Second, "the listen stream open at the proxy", func() bool {
		s, _ := h.proxy.streams.open()
		return s == 1
	})
	shutdownDone := startDrain(t, h)
	listChangedArrives(t, ctx, h, srv, changed, "listen stream during the drain")
	select {
	case err := <-shutdownDone:
		if err != nil {
			t.Fatalf("Shutdown: %v", err)
		}
	case <-ctx.Done():
		t.Fatal("the drain did not end at its deadline")
	}
	testenv.WaitFor(t, 10*time.Second, "the listen stream ended by the drain's deadline", func() bool {
		s, _ := h.proxy.streams.open()
		return s == 0
	})
}
