package proxy

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/cube-sandbox/cubeproxy/internal/sandbox"
)

// pathSeen is what the path test's sandbox saw of a request.
type pathSeen struct {
	Target, Host string
	Prefix       []string
}

// pathSandbox answers "/redirect" with a root-relative Location, Refresh
// and cookies, "/to?l=<location>" with that Location, and anything else
// with what it saw of the request, as JSON.
func pathSandbox(t *testing.T) uint16 {
	return backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/redirect":
			w.Header().Set("Location", "/login?next=/a")
			w.Header().Set("Refresh", "0; URL=/next")
			w.Header()["Set-Cookie"] = []string{"s=1; Path=/", "t=2; path= /app ; HttpOnly", "u=3", "d=4; Domain=evil.test; Path=/x", "r=5; Path=rel",
				"p=6; Path=" + r.Header.Get("X-Forwarded-Prefix") + "/in",
				// The prefix itself, with blanks before the ';': under it
				// already, however the value is trimmed.
				"q=7; Path=" + r.Header.Get("X-Forwarded-Prefix") + " \t; Secure"}
			w.WriteHeader(http.StatusFound)
		case "/to":
			w.Header()["Location"] = r.URL.Query()["l"] // every one, each on its own line
			w.WriteHeader(http.StatusSeeOther)
		default:
			json.NewEncoder(w).Encode(pathSeen{Target: r.RequestURI, Host: r.Host, Prefix: r.Header.Values("X-Forwarded-Prefix")})
		}
	}))
}

// A request to the proxy's address (no sandbox in Host) under
// /sandbox/<id>/<port>/ reaches that sandbox port with the prefix gone and
// named in X-Forwarded-Prefix, and the sandbox's root-relative redirects
// and cookie paths come back under the prefix, as the platform's proxy
// serves it. A sandbox host keeps its own routing for /sandbox/ paths, and
// its answers are not touched.
func TestPathRouting(t *testing.T) {
	h := newHarness(t)
	port := pathSandbox(t)
	host := h.route("pathbox", port)
	prefix := "/sandbox/pathbox/" + itoa(port)
	client := &http.Client{Transport: h.client.Transport, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	get := func(host, target string, hdr ...string) (*http.Response, pathSeen) {
		t.Helper()
		r := h.req("GET", host, "", nil)
		r.URL.Opaque = target // as sent, no cleaning
		for i := 0; i+1 < len(hdr); i += 2 {
			r.Header.Add(hdr[i], hdr[i+1])
		}
		resp, err := client.Do(r)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		var seen pathSeen
		if resp.StatusCode == 200 {
			if err := json.Unmarshal(body, &seen); err != nil {
				t.Fatalf("%s: %v: %s", target, err, body)
			}
		}
		resp.Header.Set("X-Test-Body", string(body))
		return resp, seen
	}

	for _, tc := range []struct {
		target, want string
	}{
		{prefix + "/a/b?q=1&r=/x", "/a/b?q=1&r=/x"},
		{prefix + "/", "/"},
		{prefix, "/"},
		{prefix + "?q=1", "/?q=1"},
		{prefix + "//double", "//double"},
		{prefix + "/%2Fenc%20oded/", "/%2Fenc%20oded/"},
		{prefix + "/a/../b", "/a/../b"},
	} {
		resp, seen := get(h.addr, tc.target, "X-Forwarded-Prefix", "/forged", "X-Forwarded-Prefix", "/forged2")
		if resp.StatusCode != 200 || seen.Target != tc.want || seen.Host != h.addr || !slices.Equal(seen.Prefix, []string{prefix}) {
			t.Errorf("GET %s: %d, the sandbox saw %+v; want %q, Host %q, X-Forwarded-Prefix [%s]", tc.target, resp.StatusCode, seen, tc.want, h.addr, prefix)
		}
	}

	// Leading slashes count as one, as nginx merges them (a client that
	// joined a base URL ending in '/' and a path): the sandbox gets its
	// path as sent, the prefix spelled once, and its Location comes back
	// under that spelling. Sent raw: Go's client sends a "//" target in
	// absolute form.
	for _, tc := range []struct{ target, want string }{
		{"/" + prefix + "/a", "/a"},
		{"///" + prefix[1:] + "//a?q", "//a?q"},
		{"/" + prefix + "/redirect", ""},
	} {
		resp, body := h.dialProxy(t).do("GET", h.addr, tc.target, "")
		if tc.want == "" {
			if got, want := resp.Header.Get("Location"), prefix+"/login?next=/a"; resp.StatusCode != 302 || got != want {
				t.Errorf("GET %s: %d Location %q, want 302 %q", tc.target, resp.StatusCode, got, want)
			}
			continue
		}
		var seen pathSeen
		if resp.StatusCode != 200 || json.Unmarshal([]byte(body), &seen) != nil || seen.Target != tc.want || !slices.Equal(seen.Prefix, []string{prefix}) {
			t.Errorf("GET %s: %d %s; want the sandbox to see %q with X-Forwarded-Prefix %s", tc.target, resp.StatusCode, body, tc.want, prefix)
		}
	}

	// Any host that names no sandbox port routes by the path; a sandbox's
	// own host does not, and its client's X-Forwarded-Prefix is its own.
	for _, tc := range []struct {
		host, target, want string
		prefix             []string
	}{
		{"localhost", prefix + "/p", "/p", []string{prefix}},
		{"node.internal:8081", prefix + "/p", "/p", []string{prefix}},
		{host, prefix + "/p", prefix + "/p", []string{"/front"}},
	} {
		resp, seen := get(tc.host, tc.target, "X-Forwarded-Prefix", "/front")
		if resp.StatusCode != 200 || seen.Target != tc.want || !slices.Equal(seen.Prefix, tc.prefix) {
			t.Errorf("Host %s GET %s: %d, the sandbox saw %+v; want %q with X-Forwarded-Prefix %q", tc.host, tc.target, resp.StatusCode, seen, tc.want, tc.prefix)
		}
	}

	// The answer's paths, routed by path and by host.
	resp, _ := get(h.addr, prefix+"/redirect")
	if got, want := resp.Header.Get("Location"), prefix+"/login?next=/a"; resp.StatusCode != 302 || got != want {
		t.Errorf("by path: %d Location %q, want 302 %q", resp.StatusCode, got, want)
	}
	if got, want := resp.Header.Get("Refresh"), "0; URL="+prefix+"/next"; got != want {
		t.Errorf("by path: Refresh %q, want %q", got, want)
	}
	wantCookies := []string{"s=1; Path=" + prefix + "/", "t=2; path= " + prefix + "/app ; HttpOnly", "u=3", "d=4; Path=" + prefix + "/x", "r=5; Path=rel", "p=6; Path=" + prefix + "/in", "q=7; Path=" + prefix + " \t; Secure"}
	if got := resp.Header.Values("Set-Cookie"); !slices.Equal(got, wantCookies) {
		t.Errorf("by path: Set-Cookie %q, want %q", got, wantCookies)
	}
	resp, _ = get(host, "/redirect")
	if got := resp.Header.Get("Location"); got != "/login?next=/a" {
		t.Errorf("by host: Location %q, want it as the sandbox sent it", got)
	}
	if got, want := resp.Header.Values("Set-Cookie"), []string{"s=1; Path=/", "t=2; path= /app ; HttpOnly", "u=3", "d=4; Path=/x", "r=5; Path=rel", "p=6; Path=/in", "q=7; Path= \t; Secure"}; !slices.Equal(got, want) {
		t.Errorf("by host: Set-Cookie %q, want %q (only the foreign Domain goes)", got, want)
	}
	for loc, want := range map[string]string{
		"/x":                   prefix + "/x",
		"//evil.test/x":        prefix + "//evil.test/x",
		"https://example.com/": "https://example.com/",
		"next":                 "next",
		"../up":                "../up",
		// Under the prefix already (an app that reads X-Forwarded-Prefix):
		// not prefixed again, as nginx does.
		prefix + "/login":   prefix + "/login",
		prefix:              prefix,
		prefix + "?a=1":     prefix + "?a=1",
		prefix + "#top":     prefix + "#top",
		prefix + "0/x":      prefix + prefix + "0/x",
		"/sandbox/other/80": prefix + "/sandbox/other/80",
	} {
		resp, _ := get(h.addr, prefix+"/to?l="+strings.NewReplacer("/", "%2F", "#", "%23").Replace(loc))
		if got := resp.Header.Get("Location"); got != want {
			t.Errorf("Location %q came back as %q, want %q", loc, got, want)
		}
	}
	// A Location sent on several lines comes back on as many, each
	// root-relative one under the prefix, whichever line it is on: the
	// first line alone was looked at, and a root-relative line after an
	// absolute one left the prefix; after a root-relative one it was lost.
	for _, tc := range []struct{ sent, want []string }{
		{[]string{"https://example.com/", "/b"}, []string{"https://example.com/", prefix + "/b"}},
		{[]string{"/a", "/b", "c"}, []string{prefix + "/a", prefix + "/b", "c"}},
	} {
		q := ""
		for _, l := range tc.sent {
			q += "&l=" + strings.ReplaceAll(l, "/", "%2F")
		}
		resp, _ := get(h.addr, prefix+"/to?"+q[1:])
		if got := resp.Header.Values("Location"); !slices.Equal(got, tc.want) {
			t.Errorf("Location lines %q came back as %q, want %q", tc.sent, got, tc.want)
		}
	}

	// Malformed paths and unknown sandboxes: a JSON refusal, nothing dialed.
	for _, tc := range []struct {
		target string
		status int
		code   string
	}{
		{"/sandbox/pathbox", 400, "invalid_sandbox_path"},
		{"/sandbox/PATHBOX/" + itoa(port) + "/", 400, "invalid_sandbox_id"},
		{"/sandbox/pathbox/0" + itoa(port) + "/", 400, "invalid_port"},
		{"/sandbox//" + itoa(port) + "/", 400, "invalid_sandbox_id"}, // a template's missing id
		{"/sandbox/nobox/" + itoa(port) + "/", 404, "sandbox_not_found"},
		{"/sandbox/pathbox/1/", 404, "port_not_mapped"},
		// Within the prefix's root, as every target within "/".
		{prefix + "/..", 400, "bad_request"},
		{prefix + "/a/../../etc", 400, "bad_request"},
		{prefix + "/%2e%2E/x", 400, "bad_request"},
	} {
		resp, _ := get(h.addr, tc.target)
		var e struct{ Code string }
		if err := json.Unmarshal([]byte(resp.Header.Get("X-Test-Body")), &e); resp.StatusCode != tc.status || err != nil || e.Code != tc.code {
			t.Errorf("GET %s: %d %s, want %d %s", tc.target, resp.StatusCode, resp.Header.Get("X-Test-Body"), tc.status, tc.code)
		}
	}
}

// A restricted route routed by its path takes the traffic token, and a
// signed link lets its own request through without trading it for a
// cookie: every sandbox behind a path-routed host is one origin, where a
// cookie would serve any of their pages. The access log shows the target
// the client sent.
func TestPathRoutingCredentials(t *testing.T) {
	key, traffic := authRandomHex(t, 32), authRandomHex(t, 32)
	signer, sign := authSigner(t, key)
	h, logs := logHarness(t, "cube", func(o *harnessOpts) { o.cfg.Signer = signer })
	port := pathSandbox(t)
	putAuthRoute(h, "locked", traffic, port, 8080)
	prefix := "/sandbox/locked/8080"
	do := func(target string, hdr ...string) (*http.Response, string) {
		t.Helper()
		r := h.req("GET", h.addr, target, nil)
		for i := 0; i+1 < len(hdr); i += 2 {
			r.Header.Set(hdr[i], hdr[i+1])
		}
		resp := h.do(r)
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, string(b)
	}
	if resp, body := do(prefix + "/p"); resp.StatusCode != 403 || !strings.Contains(body, "traffic_token_missing") {
		t.Errorf("no token: %d %s", resp.StatusCode, body)
	}
	if resp, body := do(prefix+"/p", "E2b-Traffic-Access-Token", traffic); resp.StatusCode != 200 || !strings.Contains(body, `"Target":"/p"`) {
		t.Errorf("traffic token: %d %s", resp.StatusCode, body)
	}
	tok := sign("locked", 8080, 10*time.Minute)
	resp, body := do(prefix+"/page?a=1&cube_token="+tok, "Sec-Fetch-Mode", "navigate", "X-Cube-Request-Id", "path-link")
	if resp.StatusCode != 200 || !strings.Contains(body, `"Target":"/page?a=1"`) || resp.Header.Get("Set-Cookie") != "" {
		t.Errorf("signed link, navigation: %d %s, Set-Cookie %q; want the page itself, no token passed on, no cookie", resp.StatusCode, body, resp.Header.Get("Set-Cookie"))
	}
	cookie := "cube_proxy_auth=" + signer.CookieValue([]byte(tok), traffic)
	if resp, body := do(prefix+"/p", "Cookie", cookie); resp.StatusCode != 403 {
		t.Errorf("cookie on a path route: %d %s, want 403", resp.StatusCode, body)
	}
	f := logs.wait(t, "path-link")
	if f[7] != prefix+"/page?a=1&cube_token=REDACTED" || f[10] != "/page" {
		t.Errorf("access log request_uri %q uri %q, want the client's target, its token redacted, and the sandbox's path, as nginx's $request_uri and $uri", f[7], f[10])
	}
}

// A WebSocket and an MCP session (the official SDK, over streamable HTTP
// with its SSE streams) reach their sandbox ports through a path-routed
// URL on the proxy's address, as an agent without wildcard DNS uses it.
func TestPathRoutingStreams(t *testing.T) {
	h := newHarness(t)
	ended := make(chan error, 1)
	wsPort := wsBackend(t, ended)
	h.route("wsbox", wsPort)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, _, err := websocket.Dial(ctx, "ws://"+h.addr+"/sandbox/wsbox/"+itoa(wsPort)+"/ws", &websocket.DialOptions{Subprotocols: []string{"echo.v1"}})
	if err != nil {
		t.Fatalf("WebSocket by path: %v", err)
	}
	if err := wsEcho(t, c); err != nil {
		t.Fatalf("echo by path: %v", err)
	}
	c.Close(websocket.StatusNormalClosure, "")

	var mu sync.Mutex
	var paths []string
	gateway := sandbox.MCPHandler(sandbox.MCPOptions{OnRequest: func(r *http.Request, _ bool) {
		mu.Lock()
		defer mu.Unlock()
		paths = append(paths, r.Method+" "+r.URL.Path)
	}})
	mux := http.NewServeMux()
	mux.Handle("/mcp", gateway)
	mcpPort := backend(t, "127.0.0.1", mux)
	h.put("mcpbox", map[string]string{"HostIP": "127.0.0.1", "SandboxIP": "127.0.0.1", "CreatedAt": "7", "50005": itoa(mcpPort)})
	client := mcp.NewClient(&mcp.Implementation{Name: "path-agent", Version: "v1"}, nil)
	session, err := client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: "http://" + h.addr + "/sandbox/mcpbox/50005/mcp", HTTPClient: h.client}, nil)
	if err != nil {
		t.Fatalf("initialize by path: %v", err)
	}
	res, err := session.CallTool(ctx, &mcp.CallToolParams{Name: "echo", Arguments: map[string]any{"text": "hi"}})
	if err != nil || res.IsError {
		t.Fatalf("tools/call by path: %v %+v", err, res)
	}
	if err := session.Close(); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, p := range paths {
		if !strings.HasSuffix(p, " /mcp") {
			t.Errorf("the gateway got %s, want /mcp", p)
		}
	}
	if len(paths) == 0 {
		t.Error("no request reached the gateway")
	}
}

// On a path route the proxy vouches for X-Forwarded-Prefix, so the
// client's spellings of it with '_' or '.' go, as X_Forwarded_Host goes on
// a masked route: CGI, WSGI and PHP servers file X_Forwarded_Prefix under
// HTTP_X_FORWARDED_PREFIX beside (or over) the proxy's line, where
// Werkzeug's ProxyFix and its kin read the prefix they build links with.
// On host routing the client's X-Forwarded-Prefix is its own, and so are
// its other spellings.
func TestPathRoutingPrefixAliases(t *testing.T) {
	h := newHarness(t)
	port := backend(t, "127.0.0.1", echoHeaders())
	host := h.route("prefixalias", port)
	prefix := "/sandbox/prefixalias/" + itoa(port)
	forged := []string{"X_Forwarded_Prefix: /evil", "x.forwarded.prefix: /evil", "X-Forwarded_PREFIX: /evil"}
	for _, tc := range []struct {
		name, host, target string
		want               []string // the aliases that reach the sandbox
	}{
		{"by path", h.addr, prefix + "/p", nil},
		{"by host", host, "/p", []string{"X_forwarded_prefix", "X.forwarded.prefix", "X-Forwarded_prefix"}},
	} {
		e := echoRawRequest(t, h.addr, append([]string{"GET " + tc.target + " HTTP/1.1", "Host: " + tc.host, "X_App_Prefix: kept"}, forged...)...)
		var got []string
		for k := range e.Headers {
			if strings.ContainsAny(k, "_.") && strings.EqualFold(strings.NewReplacer("_", "-", ".", "-").Replace(k), "X-Forwarded-Prefix") {
				got = append(got, k)
			}
		}
		slices.Sort(got)
		want := slices.Clone(tc.want)
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Errorf("%s: aliases of X-Forwarded-Prefix that reached the sandbox %q, want %q", tc.name, got, want)
		}
		if e.get("X_App_Prefix") != "kept" {
			t.Errorf("%s: X_App_Prefix reached the sandbox as %q, want kept", tc.name, e.get("X_App_Prefix"))
		}
	}
}
