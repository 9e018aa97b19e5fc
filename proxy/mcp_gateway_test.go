package proxy

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
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
