package proxy

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// The sandbox's MCP port closed mid-session (its gateway restarting, a
// port mapping briefly wrong): the agent's call fails with the proxy's 502
// ("Bad Gateway"), which the go-sdk takes as transient, so the same
// session works again once the port answers (README, What an MCP agent
// sees). A status the go-sdk does not take as transient (a 404 or 410
// for a port that refused) would end every session on the sandbox.
func TestMCPPortClosedIsTransient(t *testing.T) {
	h := newHarness(t)
	srv := newAgentServer()
	port := backend(t, "127.0.0.1", mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv },
		&mcp.StreamableHTTPOptions{DisableLocalhostProtection: true}))
	route := func(p uint16) {
		h.put("portbox", map[string]string{"HostIP": "127.0.0.1", "CreatedAt": "1", "50005": itoa(p)})
	}
	route(port)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cs := agentConnect(t, ctx, h, "50005-portbox.cube.test", nil, &mcp.StreamableClientTransport{DisableStandaloneSSE: true})
	call := func() error {
		_, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "big", Arguments: map[string]any{"n": 3}})
		return err
	}
	// The mapping points at a port nobody listens on: the proxy's
	// connect is refused, as a sandbox port closed is.
	route(freePort(t))
	if err := call(); err == nil || !strings.HasSuffix(err.Error(), "Bad Gateway") {
		t.Fatalf("call while the port is closed: %v, want Bad Gateway", err)
	}
	route(port)
	if err := call(); err != nil {
		t.Fatalf("the same session once the port answers again: %v", err)
	}
}
