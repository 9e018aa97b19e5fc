package proxy

import (
	"io"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/cube-sandbox/cubeproxy/internal/sandbox"
)

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
	down := listen(t, "127.0.0.1:0")
	downPort := uint16(down.Addr().(*net.TCPAddr).Port)
	down.Close()
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
