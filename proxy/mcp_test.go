package proxy

import (
	"context"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/cube-sandbox/cubeproxy/internal/sandbox"
)

// hostTransport sends every request to the proxy with the sandbox host in
// the Host header (a client without wildcard DNS) and the given headers.
type hostTransport struct {
	host    string
	headers map[string]string
	base    http.RoundTripper
}

func (t hostTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Host = t.host
	for k, v := range t.headers {
		r.Header.Set(k, v)
	}
	return t.base.RoundTrip(r)
}

// seenRequest is what the MCP gateway observed of one HTTP request.
type seenRequest struct {
	method, auth, session string
	proxyToken            bool
}

func TestMCPThroughProxy(t *testing.T) {
	const token = "s3cr3t-bearer.with/odd+chars=="
	h := newHarness(t)

	var mu sync.Mutex
	var seen []seenRequest
	acks := make(chan float64)
	gateway := sandbox.MCPHandler(sandbox.MCPOptions{
		Token: token,
		BeforeProgress: func(ctx context.Context, i int) error {
			// Progress i-1 must have reached the client (through the proxy)
			// before the tool goes on: the call is still running.
			select {
			case got := <-acks:
				if int(got) != i-1 {
					t.Errorf("client acknowledged progress %v, want %d", got, i-1)
				}
				return nil
			case <-time.After(10 * time.Second):
				t.Errorf("progress %d never reached the client while the call was open", i-1)
				return context.DeadlineExceeded
			case <-ctx.Done():
				return ctx.Err()
			}
		},
		OnRequest: func(r *http.Request, _ bool) {
			mu.Lock()
			defer mu.Unlock()
			seen = append(seen, seenRequest{
				method: r.Method, auth: r.Header.Get("Authorization"), session: r.Header.Get("Mcp-Session-Id"),
				proxyToken: r.Header.Get("E2b-Traffic-Access-Token") != "" || r.Header.Get("Cube-Traffic-Access-Token") != "",
			})
		},
	})
	mux := http.NewServeMux()
	mux.Handle("/mcp", gateway)
	port := backend(t, "127.0.0.1", mux)
	h.put("mcpbox", map[string]string{"HostIP": "127.0.0.1", "SandboxIP": "127.0.0.1", "CreatedAt": "7", "50005": itoa(port)})
	host := "50005-mcpbox.cube.test"

	httpClient := &http.Client{Transport: hostTransport{host: host, headers: map[string]string{"Authorization": "Bearer " + token}, base: h.client.Transport}}
	client := mcp.NewClient(&mcp.Implementation{Name: "test-agent", Version: "v1"}, &mcp.ClientOptions{
		ProgressNotificationHandler: func(_ context.Context, req *mcp.ProgressNotificationClientRequest) {
			if req.Params.Progress < req.Params.Total {
				acks <- req.Params.Progress
			}
		},
	})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	session, err := client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: "http://" + h.addr + "/mcp", HTTPClient: httpClient}, nil)
	if err != nil {
		t.Fatalf("initialize through the proxy: %v", err)
	}
	tools, err := session.ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tool := range tools.Tools {
		names = append(names, tool.Name)
	}
	if strings.Join(names, ",") != "count,echo" {
		t.Fatalf("tools %v", names)
	}
	res, err := session.CallTool(ctx, &mcp.CallToolParams{Name: "count", Arguments: map[string]any{"n": 4}, Meta: mcp.Meta{"progressToken": "p"}})
	if err != nil {
		t.Fatalf("tools/call: %v", err)
	}
	if res.IsError {
		t.Fatalf("tool failed: %+v", res.Content)
	}
	if got := res.StructuredContent.(map[string]any)["counted"]; got != float64(4) {
		t.Fatalf("result %v", res.StructuredContent)
	}
	sid := session.ID()
	if err := session.Close(); err != nil {
		t.Fatalf("close session: %v", err)
	}

	mu.Lock()
	defer mu.Unlock()
	var deleted, streamed bool
	for _, s := range seen {
		if s.auth != "Bearer "+token {
			t.Errorf("%s reached the gateway with Authorization %q", s.method, s.auth)
		}
		if s.proxyToken {
			t.Errorf("%s carried a proxy traffic token to the sandbox", s.method)
		}
		if s.session != "" && s.session != sid {
			t.Errorf("Mcp-Session-Id %q, want %q", s.session, sid)
		}
		deleted = deleted || (s.method == "DELETE" && s.session == sid)
		streamed = streamed || s.method == "GET"
	}
	if !deleted {
		t.Error("session DELETE did not reach the gateway")
	}
	if !streamed {
		t.Error("the client's standalone GET stream did not reach the gateway")
	}
}

func TestMCPGatewayOwnUnauthorizedPassesThrough(t *testing.T) {
	h := newHarness(t)
	mux := http.NewServeMux()
	mux.Handle("/mcp", sandbox.MCPHandler(sandbox.MCPOptions{Token: "right"}))
	port := backend(t, "127.0.0.1", mux)
	h.put("mcp401", map[string]string{"HostIP": "127.0.0.1", "50005": itoa(port)})
	for _, auth := range []string{"", "Bearer wrong"} {
		req := h.req("POST", "50005-mcp401.cube.test", "/mcp", strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`))
		req.Header.Set("Content-Type", "application/json")
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp := h.do(req)
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 401 || resp.Header.Get("Www-Authenticate") != `Bearer realm="mcp"` ||
			string(body) != `{"error":"invalid_token","error_description":"missing or wrong bearer token"}`+"\n" {
			t.Fatalf("auth %q: got %d %q %q, want the gateway's own 401", auth, resp.StatusCode, resp.Header.Get("Www-Authenticate"), body)
		}
	}
}
