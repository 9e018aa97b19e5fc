// Package sandbox is a stand-in for what runs inside a real sandbox: an MCP
// gateway (the official go-sdk server over streamable HTTP, behind a bearer
// token) and an SSE ticker. `cubeproxy demo` serves them, and the tests use
// them as real backends.
package sandbox

import (
	"context"
	"crypto/subtle"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// MCPOptions configures the demo MCP gateway.
type MCPOptions struct {
	// Token is the bearer token the gateway requires ("" = none).
	Token string
	// BeforeProgress, when set, runs before each progress notification of
	// the "count" tool after the first; tests make it wait for the client's
	// acknowledgement of the previous one. The default waits Step.
	BeforeProgress func(ctx context.Context, i int) error
	// Step is the pause between progress notifications when BeforeProgress is nil (default 300ms).
	Step time.Duration
	// OnRequest sees every HTTP request that reaches the gateway (after
	// the bearer check passed or failed), for tests that assert on headers.
	OnRequest func(r *http.Request, authorized bool)
}

// CountInput is the input of the "count" tool.
type CountInput struct {
	N int `json:"n" jsonschema:"how many progress notifications to send (1-100)"`
}

// CountOutput is the output of the "count" tool.
type CountOutput struct {
	Counted int `json:"counted"` // notifications sent
}

// NewMCPServer returns the demo MCP server: tools "echo" and "count" (the
// latter streams progress notifications before it returns).
func NewMCPServer(opts MCPOptions) *mcp.Server {
	if opts.Step == 0 {
		opts.Step = 300 * time.Millisecond
	}
	s := mcp.NewServer(&mcp.Implementation{Name: "cubeproxy-demo-sandbox", Version: "v1"}, nil)
	mcp.AddTool(s, &mcp.Tool{Name: "echo", Description: "returns its input text"},
		func(_ context.Context, _ *mcp.CallToolRequest, in struct {
			Text string `json:"text"`
		}) (*mcp.CallToolResult, struct {
			Text string `json:"text"`
		}, error) {
			return nil, in, nil
		})
	mcp.AddTool(s, &mcp.Tool{Name: "count", Description: "counts to n, sending a progress notification per step"},
		func(ctx context.Context, req *mcp.CallToolRequest, in CountInput) (*mcp.CallToolResult, CountOutput, error) {
			if in.N < 1 || in.N > 100 {
				return nil, CountOutput{}, fmt.Errorf("n must be 1..100")
			}
			token := req.Params.GetProgressToken()
			for i := 1; i <= in.N; i++ {
				if i > 1 {
					if opts.BeforeProgress != nil {
						if err := opts.BeforeProgress(ctx, i); err != nil {
							return nil, CountOutput{}, err
						}
					} else {
						select {
						case <-ctx.Done():
							return nil, CountOutput{}, ctx.Err()
						case <-time.After(opts.Step):
						}
					}
				}
				if token != nil {
					err := req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{
						ProgressToken: token, Progress: float64(i), Total: float64(in.N),
						Message: "step " + strconv.Itoa(i),
					})
					if err != nil {
						return nil, CountOutput{}, err
					}
				}
			}
			return nil, CountOutput{Counted: in.N}, nil
		})
	return s
}

// MCPHandler serves the demo MCP server over streamable HTTP behind the
// bearer token, as the sandbox's MCP gateway does on port 50005.
func MCPHandler(opts MCPOptions) http.Handler {
	srv := NewMCPServer(opts)
	// Behind the proxy the gateway sees the sandbox's public Host, which
	// the SDK's DNS-rebinding guard for loopback listeners would refuse
	// (a route's MaskRequestHost "localhost:${PORT}" is the other way out).
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv },
		&mcp.StreamableHTTPOptions{DisableLocalhostProtection: true})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ok := opts.Token == "" || subtle.ConstantTimeCompare([]byte(r.Header.Get("Authorization")), []byte("Bearer "+opts.Token)) == 1
		if opts.OnRequest != nil {
			opts.OnRequest(r, ok)
		}
		if !ok {
			w.Header().Set("WWW-Authenticate", `Bearer realm="mcp"`)
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusUnauthorized)
			_, _ = w.Write([]byte(`{"error":"invalid_token","error_description":"missing or wrong bearer token"}` + "\n"))
			return
		}
		h.ServeHTTP(w, r)
	})
}

// TickerHandler serves an SSE stream at any path: one "tick" event per
// interval, n events (0 = until the client leaves).
func TickerHandler(interval time.Duration, n int) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("Cache-Control", "no-cache")
		fl, _ := w.(http.Flusher)
		t := time.NewTicker(interval)
		defer t.Stop()
		for i := 1; n == 0 || i <= n; i++ {
			if _, err := fmt.Fprintf(w, "id: %d\nevent: tick\ndata: {\"n\":%d,\"time\":%q}\n\n", i, i, time.Now().UTC().Format(time.RFC3339Nano)); err != nil {
				return
			}
			if fl != nil {
				fl.Flush()
			}
			select {
			case <-r.Context().Done():
				return
			case <-t.C:
			}
		}
	})
}
