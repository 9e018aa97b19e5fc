package proxy

import (
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/cube-sandbox/cubeproxy/internal/sandbox"
	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// compressedGateway is an MCP gateway behind a compression middleware, as
// a TypeScript gateway with Express's compression() is: its event streams
// are gzipped, and the head of the standalone GET stream goes out before
// any event (flushHeaders). It answers initialize and the initialized
// notification, and its GET stream carries tools/list_changed once
// release is closed.
func compressedGateway(release <-chan struct{}) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.Method {
		case "POST":
			var msg struct {
				ID     json.RawMessage `json:"id"`
				Method string          `json:"method"`
			}
			if err := json.NewDecoder(r.Body).Decode(&msg); err != nil {
				http.Error(w, err.Error(), 400)
				return
			}
			if msg.ID == nil {
				w.WriteHeader(http.StatusAccepted)
				return
			}
			w.Header().Set("Mcp-Session-Id", "gz-session")
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w, `{"jsonrpc":"2.0","id":%s,"result":{"protocolVersion":"2025-06-18","capabilities":{"tools":{"listChanged":true}},"serverInfo":{"name":"gz","version":"1"}}}`, msg.ID)
		case "GET":
			w.Header().Set("Content-Type", "text/event-stream")
			w.Header().Set("Content-Encoding", "gzip")
			w.WriteHeader(200)
			w.(http.Flusher).Flush()
			select {
			case <-release:
			case <-r.Context().Done():
				return
			}
			gz := gzip.NewWriter(w)
			io.WriteString(gz, "event: message\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/tools/list_changed\"}\n\n")
			gz.Flush()
			w.(http.Flusher).Flush()
			<-r.Context().Done()
		case "DELETE":
			w.WriteHeader(200)
		}
	})
}

// A gateway that gzips its event streams: the agent's HTTP client
// (Go's, the go-sdk default, asks for gzip and inflates) must get the
// stream exactly as the gateway compressed it. A heartbeat comment is
// plain text, and one written into a gzip stream, as the first bytes of a
// standalone stream silent past the heartbeat interval, makes the agent's
// decoder fail ("gzip: invalid header"): the stream and then the session
// are lost.
func TestMCPCompressedEventStream(t *testing.T) {
	const beat = 20 * time.Millisecond
	h := newHarness(t, func(o *harnessOpts) { o.cfg.HeartbeatInterval = beat })
	release := make(chan struct{})
	port := backend(t, "127.0.0.1", compressedGateway(release))
	h.put("gzmcp", map[string]string{"HostIP": "127.0.0.1", "CreatedAt": "1", "50005": itoa(port)})
	host := "50005-gzmcp.cube.test"
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	inflating := &http.Transport{} // compression on, as http.DefaultTransport
	defer inflating.CloseIdleConnections()
	changed := make(chan struct{}, 1)
	agentConnect(t, ctx, h, host, &mcp.ClientOptions{
		ToolListChangedHandler: func(context.Context, *mcp.ToolListChangedRequest) { changed <- struct{}{} },
	}, &mcp.StreamableClientTransport{HTTPClient: &http.Client{Transport: hostTransport{host: host, base: inflating}}})
	// The standalone stream stays silent for several heartbeat intervals.
	testenv.WaitFor(t, 10*time.Second, "the standalone stream is open at the proxy", func() bool {
		s, _ := h.proxy.streams.open()
		return s == 1
	})
	<-time.After(10 * beat)
	close(release)
	select {
	case <-changed:
	case <-ctx.Done():
		t.Fatal("the notification on the gzipped standalone stream never reached the agent")
	}
}

// An agent sends a tools/call with large arguments (a file's content) and
// is answered from the head alone, before its body was read: the gateway's
// 401 with WWW-Authenticate to an expired bearer token (what the agent's
// OAuth handling needs), or the proxy's own refusal (sandbox down, paused,
// unknown; wrong traffic token). The answer must arrive as it does direct,
// not as a connection reset while the agent is still sending.
func TestMCPAnsweredBeforeLargeCallBody(t *testing.T) {
	const traffic = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	h := newHarness(t)
	mux := http.NewServeMux()
	mux.Handle("/mcp", sandbox.MCPHandler(sandbox.MCPOptions{Token: "fresh"}))
	port := backend(t, "127.0.0.1", mux)
	downPort := freePort(t)
	h.put("mcpexpired", map[string]string{"HostIP": "127.0.0.1", "CreatedAt": "1", "50005": itoa(port)})
	h.put("mcpdown", map[string]string{"HostIP": "127.0.0.1", "CreatedAt": "1", "50005": itoa(downPort)})
	h.put("mcppaused", map[string]string{"HostIP": "127.0.0.1", "CreatedAt": "1", "50005": itoa(port)})
	h.put("mcplocked", map[string]string{"HostIP": "127.0.0.1", "CreatedAt": "1", "50005": itoa(port),
		"AllowPublicTraffic": "false", "TrafficAccessToken": traffic})
	if code, b := h.adminDo("POST", "/admin/state", `{"sandbox_id":"mcppaused","state":"paused"}`, ""); code != 200 {
		t.Fatalf("pause: %d %s", code, b)
	}
	gateway401 := `{"error":"invalid_token","error_description":"missing or wrong bearer token"}` + "\n"
	for _, tc := range []struct {
		name, id string
		size     int
		chunked  bool
		status   int
		body     string // the whole body, or a part of it
		header   [2]string
	}{
		{"gateway 401 1MiB", "mcpexpired", 1 << 20, false, 401, gateway401, [2]string{"Www-Authenticate", `Bearer realm="mcp"`}},
		{"gateway 401 8MiB", "mcpexpired", 8 << 20, false, 401, gateway401, [2]string{"Www-Authenticate", `Bearer realm="mcp"`}},
		{"gateway 401 8MiB chunked", "mcpexpired", 8 << 20, true, 401, gateway401, [2]string{"Www-Authenticate", `Bearer realm="mcp"`}},
		{"gateway 401 24MiB", "mcpexpired", 24 << 20, false, 401, gateway401, [2]string{"Www-Authenticate", `Bearer realm="mcp"`}},
		{"sandbox down", "mcpdown", 8 << 20, false, 502, `"code":"upstream_connect_failed"`, [2]string{"Content-Type", "application/json"}},
		{"sandbox paused", "mcppaused", 8 << 20, false, 503, `"code":"sandbox_pausing"`, [2]string{"Retry-After", "1"}},
		{"sandbox unknown", "mcpnosuch", 8 << 20, false, 404, `"code":"sandbox_not_found"`, [2]string{"Content-Type", "application/json"}},
		{"traffic token wrong", "mcplocked", 8 << 20, false, 403, `"sandbox_id":"mcplocked"`, [2]string{"Content-Type", "application/json"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			call := `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"write","arguments":{"content":"` +
				strings.Repeat("x", tc.size) + `"}}}`
			// The reset races the answer at the client: a few tries.
			for range 3 {
				var body io.Reader = strings.NewReader(call)
				if tc.chunked {
					body = io.MultiReader(body) // length unknown: sent chunked
				}
				r := h.req("POST", "50005-"+tc.id+".cube.test", "/mcp", body)
				r.Header.Set("Content-Type", "application/json")
				r.Header.Set("Accept", "application/json, text/event-stream")
				r.Header.Set("Authorization", "Bearer expired")
				r.Header.Set("Cube-Traffic-Access-Token", strings.Repeat("0", 64))
				resp, err := h.client.Do(r)
				if err != nil {
					t.Fatalf("the answer did not reach the agent: %v", err)
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != tc.status || !strings.Contains(string(b), tc.body) || resp.Header.Get(tc.header[0]) != tc.header[1] {
					t.Fatalf("got %d %s: %q, %q; want %d %s: %q, %q", resp.StatusCode, tc.header[0], resp.Header.Get(tc.header[0]), b,
						tc.status, tc.header[0], tc.header[1], tc.body)
				}
			}
		})
	}
}
