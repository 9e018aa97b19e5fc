package proxy

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/valyala/fasthttp"

	"github.com/cube-sandbox/cubeproxy/accesslog"
	"github.com/cube-sandbox/cubeproxy/auth"
	"github.com/cube-sandbox/cubeproxy/internal/sandbox"
	"github.com/cube-sandbox/cubeproxy/internal/testenv"
	"github.com/cube-sandbox/cubeproxy/routing"
)

// TestProxyAuth runs the proxy-auth end-to-end tests with every proxy's
// operational log and access log captured, then checks that no credential
// used anywhere in them reached a log line.
func TestProxyAuth(t *testing.T) {
	t.Parallel()
	lc := newAuthLogCapture(t)
	t.Run("MCPRestricted", func(t *testing.T) { testAuthMCPRestricted(t, lc) })
	t.Run("HeaderVariants", func(t *testing.T) { testAuthHeaderVariants(t, lc) })
	t.Run("NotConfiguredAndExempt", func(t *testing.T) { testAuthNotConfigured(t, lc) })
	t.Run("NoSideEffects", func(t *testing.T) { testAuthNoSideEffects(t, lc) })
	t.Run("BeforeBackendChoice", func(t *testing.T) { testAuthBeforeBackendChoice(t, lc) })
	t.Run("SignedTokens", func(t *testing.T) { testAuthSignedTokens(t, lc) })
	t.Run("AdminToken", func(t *testing.T) { testAuthAdminToken(t, lc) })
	t.Run("CookieOrigin", func(t *testing.T) { testAuthCookieOrigin(t, lc) })
	t.Run("StaleLinkWithCookie", func(t *testing.T) { testAuthStaleLinkWithCookie(t, lc) })
	t.Run("OldLinkKeepsLongerCookie", func(t *testing.T) { testAuthOldLinkKeepsLongerCookie(t, lc) })
	t.Run("Preflight", func(t *testing.T) { testAuthPreflight(t, lc) })
	t.Run("QueryTokenNoRedirect", func(t *testing.T) { testAuthQueryTokenNoRedirect(t, lc) })
	t.Run("TrafficTokenRotated", func(t *testing.T) { testAuthTrafficTokenRotated(t, lc) })
	t.Run("FramePreview", func(t *testing.T) { testAuthFramePreview(t, lc) })
	lc.checkNoSecrets(t)
}

// authLogCapture is the sink of every proxy started by TestProxyAuth: slog JSON
// at debug level and access logs in both formats, plus the secrets that
// must never appear in them.
type authLogCapture struct {
	mu      sync.Mutex
	buf     bytes.Buffer
	secrets []string

	logger     *slog.Logger
	accessJSON *accesslog.Logger
	accessCube *accesslog.Logger
}

func newAuthLogCapture(t *testing.T) *authLogCapture {
	c := &authLogCapture{}
	c.logger = slog.New(slog.NewJSONHandler(c, &slog.HandlerOptions{Level: slog.LevelDebug}))
	var err error
	if c.accessJSON, err = accesslog.New(accesslog.Config{Format: accesslog.FormatJSON, Output: c}, nil); err != nil {
		t.Fatal(err)
	}
	if c.accessCube, err = accesslog.New(accesslog.Config{Format: accesslog.FormatCube, Output: c}, nil); err != nil {
		t.Fatal(err)
	}
	return c
}

func (c *authLogCapture) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.buf.Write(p)
}

func (c *authLogCapture) String() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.buf.String()
}

// secret records credential values that must never be logged.
func (c *authLogCapture) secret(vals ...string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.secrets = append(c.secrets, vals...)
}

// harness starts a proxy that logs into the capture (JSON access log unless
// a modifier picks another).
func (c *authLogCapture) harness(t *testing.T, mods ...func(*harnessOpts)) *harness {
	t.Helper()
	base := func(o *harnessOpts) {
		o.cfg.Logger = c.logger
		o.cfg.AccessLog = c.accessJSON
	}
	return newHarness(t, append([]func(*harnessOpts){base}, mods...)...)
}

// checkNoSecrets flushes the access logs and asserts that the logs are not
// empty, that they describe the refused requests, and that none of the
// recorded secrets appears in them.
func (c *authLogCapture) checkNoSecrets(t *testing.T) {
	t.Helper()
	if err := c.accessJSON.Close(); err != nil {
		t.Fatal(err)
	}
	if err := c.accessCube.Close(); err != nil {
		t.Fatal(err)
	}
	logs := c.String()
	for _, want := range []string{
		auth.CodeTrafficTokenMissing, auth.CodeTrafficTokenInvalid, auth.CodeTrafficTokenNotConfigured,
		auth.CodeSignedTokenInvalid,
		"cube_token=REDACTED", "restricted route has no traffic token",
	} {
		if !strings.Contains(logs, want) {
			t.Errorf("captured logs lack %q: the capture does not cover the auth paths", want)
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.secrets) < 10 {
		t.Errorf("only %d secrets recorded", len(c.secrets))
	}
	for i, s := range c.secrets {
		if len(s) < 8 {
			t.Errorf("secret %d is too short to check", i)
			continue
		}
		if strings.Contains(logs, s) {
			t.Errorf("secret %d (%.6s...) appears in the logs", i, s)
		}
	}
	if t.Failed() {
		t.Logf("captured logs:\n%s", logs)
	}
}

// authRandomHex returns n random bytes as 2n hex characters.
func authRandomHex(t testing.TB, n int) string {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

// authSigner returns a signer with key and a function that signs a token
// for a sandbox port, valid for ttl from now.
func authSigner(t testing.TB, key string) (*auth.Signer, func(id string, port uint16, ttl time.Duration) string) {
	t.Helper()
	s, err := auth.NewSigner([]string{key})
	if err != nil {
		t.Fatal(err)
	}
	return s, func(id string, port uint16, ttl time.Duration) string {
		t.Helper()
		tok, err := s.Sign(id, port, time.Now().Add(ttl))
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
}

// putAuthRoute stores a route whose listed container ports all map to
// backendPort on 127.0.0.1; token "" makes it public.
func putAuthRoute(h *harness, id, token string, backendPort uint16, ports ...uint16) {
	h.t.Helper()
	f := map[string]string{"HostIP": "127.0.0.1", "SandboxIP": "127.0.0.1", "CreatedAt": "42"}
	if token != "" {
		f["AllowPublicTraffic"] = "false"
		f["TrafficAccessToken"] = token
	}
	for _, p := range ports {
		f[itoa(p)] = itoa(backendPort)
	}
	h.put(id, f)
}

// authBackend is a minimal HTTP/1.1 server that records every request head
// exactly as the proxy wrote it and counts accepted connections, so tests
// can assert both header bytes and "no connection was made".
type authBackend struct {
	port    uint16
	accepts atomic.Int64
	heads   chan authHead
}

// authHead is one request head as received.
type authHead struct {
	line   string
	fields [][2]string // name as sent, value without surrounding OWS
	raw    string
}

// values returns every value of a header, name matched case-insensitively.
func (h authHead) values(name string) []string {
	var out []string
	for _, f := range h.fields {
		if strings.EqualFold(f[0], name) {
			out = append(out, f[1])
		}
	}
	return out
}

func startAuthBackend(t *testing.T) *authBackend {
	t.Helper()
	b := &authBackend{heads: make(chan authHead, 256)}
	ln := testenv.ServeTCP(t, func(c net.Conn) {
		b.accepts.Add(1)
		b.serveConn(c)
	})
	b.port = uint16(ln.Addr().(*net.TCPAddr).Port)
	return b
}

func (b *authBackend) serveConn(c net.Conn) {
	defer c.Close()
	br := bufio.NewReader(c)
	for {
		var head authHead
		var raw strings.Builder
		for {
			line, err := br.ReadString('\n')
			if err != nil {
				return
			}
			raw.WriteString(line)
			line = strings.TrimRight(line, "\r\n")
			if line == "" {
				break
			}
			if head.line == "" {
				head.line = line
				continue
			}
			name, value, _ := strings.Cut(line, ":")
			head.fields = append(head.fields, [2]string{name, strings.Trim(value, " \t")})
		}
		head.raw = raw.String()
		if cl := head.values("Content-Length"); len(cl) == 1 {
			n, _ := strconv.ParseInt(cl[0], 10, 64)
			_, _ = io.CopyN(io.Discard, br, n)
		}
		b.heads <- head
		if _, err := io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nok"); err != nil {
			return
		}
	}
}

// next returns the next request head the backend received.
func (b *authBackend) next(t *testing.T) authHead {
	t.Helper()
	select {
	case h := <-b.heads:
		return h
	case <-time.After(5 * time.Second):
		t.Fatal("backend received no request")
		return authHead{}
	}
}

// assertUntouched fails when the backend was connected to or received a request.
func (b *authBackend) assertUntouched(t *testing.T, what string) {
	t.Helper()
	if n := b.accepts.Load(); n != 0 {
		t.Errorf("%s: backend accepted %d connections, want none", what, n)
	}
	if n := len(b.heads); n != 0 {
		t.Errorf("%s: backend received %d requests, want none", what, n)
	}
}

// authRawRequest writes head (request line and header lines, without the final
// empty line) to the proxy on a fresh connection and returns the response.
func authRawRequest(t *testing.T, addr string, lines ...string) (*http.Response, string) {
	t.Helper()
	return rawRequest(t, addr, strings.Join(lines, "\r\n")+"\r\nConnection: close\r\n\r\n")
}

// rawRequest writes raw to a new connection to addr and returns the
// answer, its body read.
func rawRequest(t *testing.T, addr, raw string) (*http.Response, string) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	return rawExchange(t, c, addr, raw)
}

// rawExchange writes raw to c, returns the answer with its body read and
// closes c.
func rawExchange(t *testing.T, c net.Conn, addr, raw string) (*http.Response, string) {
	t.Helper()
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, raw); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("answer from %s: %v", addr, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, string(body)
}

// expectAuthRefusal checks a proxy 403 JSON answer with the given code.
func expectAuthRefusal(t *testing.T, what string, status int, hdr http.Header, body, code string) {
	t.Helper()
	var e struct{ Error, Code, SandboxID string }
	if err := json.Unmarshal([]byte(body), &e); err != nil || status != 403 || e.Code != code ||
		!strings.HasPrefix(hdr.Get("Content-Type"), "application/json") || e.Error == "" {
		t.Errorf("%s: got %d %q (%s), want 403 JSON code %s", what, status, body, hdr.Get("Content-Type"), code)
	}
}

// 1. MCP end to end against a restricted sandbox: the proxy's token and the
// gateway's bearer are independent, and neither proxy header reaches it.
func testAuthMCPRestricted(t *testing.T, lc *authLogCapture) {
	h := lc.harness(t)
	traffic := authRandomHex(t, 32)
	bearer := "mcp-" + authRandomHex(t, 12) + "/+=="
	lc.secret(traffic, bearer)

	type seen struct {
		auth       string
		authorized bool
		proxyHdr   []string
	}
	var mu sync.Mutex
	var reqs []seen
	gateway := sandbox.MCPHandler(sandbox.MCPOptions{Token: bearer, OnRequest: func(r *http.Request, ok bool) {
		s := seen{auth: r.Header.Get("Authorization"), authorized: ok}
		for k := range r.Header {
			if strings.EqualFold(k, auth.HeaderE2BTrafficToken) || strings.EqualFold(k, auth.HeaderCubeTrafficToken) {
				s.proxyHdr = append(s.proxyHdr, k)
			}
		}
		mu.Lock()
		reqs = append(reqs, s)
		mu.Unlock()
	}})
	mux := http.NewServeMux()
	mux.Handle("/mcp", gateway)
	port := backend(t, "127.0.0.1", mux)
	putAuthRoute(h, "mcpsecure", traffic, port, 50005)
	host := "50005-mcpsecure.cube.test"
	gatewaySaw := func() []seen {
		mu.Lock()
		defer mu.Unlock()
		return append([]seen(nil), reqs...)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	connect := func(headers map[string]string) (*mcp.ClientSession, error) {
		c := &http.Client{Transport: hostTransport{host: host, headers: headers, base: h.client.Transport}}
		client := mcp.NewClient(&mcp.Implementation{Name: "auth-agent", Version: "v1"}, nil)
		return client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: "http://" + h.addr + "/mcp", HTTPClient: c, MaxRetries: -1}, nil)
	}
	initBody := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`
	post := func(headers map[string]string) (int, http.Header, string) {
		r := h.req("POST", host, "/mcp", strings.NewReader(initBody))
		r.Header.Set("Content-Type", "application/json")
		r.Header.Set("Accept", "application/json, text/event-stream")
		for k, v := range headers {
			r.Header.Set(k, v)
		}
		resp := h.do(r)
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header, string(b)
	}

	// No traffic token (bearer present): the proxy answers, the gateway sees nothing.
	st, hdr, body := post(map[string]string{"Authorization": "Bearer " + bearer})
	expectAuthRefusal(t, "no traffic token", st, hdr, body, auth.CodeTrafficTokenMissing)
	st, hdr, body = post(map[string]string{"Authorization": "Bearer " + bearer, "E2b-Traffic-Access-Token": authRandomHex(t, 32)})
	expectAuthRefusal(t, "wrong traffic token", st, hdr, body, auth.CodeTrafficTokenInvalid)
	if _, err := connect(map[string]string{"Authorization": "Bearer " + bearer}); err == nil {
		t.Error("MCP initialize without a traffic token succeeded")
	}
	if n := len(gatewaySaw()); n != 0 {
		t.Fatalf("the gateway saw %d requests that the proxy should have refused", n)
	}

	// Traffic token, no bearer: the gateway's own 401 reaches the client unchanged.
	st, hdr, body = post(map[string]string{"Cube-Traffic-Access-Token": traffic})
	if st != 401 || hdr.Get("Www-Authenticate") != `Bearer realm="mcp"` ||
		body != `{"error":"invalid_token","error_description":"missing or wrong bearer token"}`+"\n" {
		t.Errorf("traffic token without bearer: got %d %q %q, want the gateway's own 401", st, hdr.Get("Www-Authenticate"), body)
	}
	if _, err := connect(map[string]string{"E2b-Traffic-Access-Token": traffic}); err == nil {
		t.Error("MCP initialize without the bearer succeeded")
	}
	before := gatewaySaw()
	if len(before) == 0 {
		t.Fatal("requests with a traffic token never reached the gateway")
	}
	for _, s := range before {
		if s.authorized || len(s.proxyHdr) > 0 {
			t.Errorf("gateway saw %+v, want unauthorized and no proxy token header", s)
		}
	}

	// Both: initialize, tools/list and tools/call work end to end.
	session, err := connect(map[string]string{"Authorization": "Bearer " + bearer, "E2b-Traffic-Access-Token": traffic})
	if err != nil {
		t.Fatalf("initialize with both credentials: %v", err)
	}
	tools, err := session.ListTools(ctx, nil)
	if err != nil || len(tools.Tools) != 2 {
		t.Fatalf("tools/list: %v %+v", err, tools)
	}
	res, err := session.CallTool(ctx, &mcp.CallToolParams{Name: "echo", Arguments: map[string]any{"text": "through the proxy"}})
	if err != nil || res.IsError {
		t.Fatalf("tools/call: %v %+v", err, res)
	}
	if got := res.StructuredContent.(map[string]any)["text"]; got != "through the proxy" {
		t.Fatalf("echo returned %v", res.StructuredContent)
	}
	if err := session.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	after := gatewaySaw()[len(before):]
	if len(after) < 3 {
		t.Fatalf("gateway saw %d requests for initialize, list, call", len(after))
	}
	for _, s := range after {
		if s.auth != "Bearer "+bearer || !s.authorized {
			t.Errorf("gateway received Authorization %q (authorized %v), want the client's exact value", s.auth, s.authorized)
		}
		if len(s.proxyHdr) > 0 {
			t.Errorf("gateway received the proxy's token headers %v", s.proxyHdr)
		}
	}
}

// 2. Header variants through the proxy, with a backend that reports the
// exact head it received.
func testAuthHeaderVariants(t *testing.T, lc *authLogCapture) {
	h := lc.harness(t)
	b := startAuthBackend(t)
	tok := authRandomHex(t, 32)
	other := authRandomHex(t, 32)
	sameLen := tok[:63] + string("0123456789abcdef"[(strings.IndexByte("0123456789abcdef", tok[63])+1)%16])
	lc.secret(tok, other, sameLen)
	putAuthRoute(h, "hdrsecure", tok, b.port, 8080)
	putAuthRoute(h, "hdrpublic", "", b.port, 8080)
	secure, public := "Host: 8080-hdrsecure.cube.test", "Host: 8080-hdrpublic.cube.test"

	// End-to-end credentials of the sandbox's own services, with odd but
	// legal bytes: they must arrive exactly as sent.
	authz := "Bearer  " + authRandomHex(t, 8) + "+/=.~ x"
	xAccess := "envd_" + authRandomHex(t, 16)
	cookie := `sid=abc; theme="dark mode";empty=; z=1`
	lc.secret(authz, xAccess)
	passthrough := []string{"Authorization: " + authz, "X-Access-Token: " + xAccess, "Cookie: " + cookie, "X-Other: keep  me"}

	cases := []struct {
		name    string
		host    string
		headers []string
		code    string // "" = forwarded
	}{
		{"e2b lower-case", secure, []string{"e2b-traffic-access-token: " + tok}, ""},
		{"e2b upper-case", secure, []string{"E2B-TRAFFIC-ACCESS-TOKEN: " + tok}, ""},
		{"cube lower-case", secure, []string{"cube-traffic-access-token: " + tok}, ""},
		{"cube mixed-case", secure, []string{"CUBE-Traffic-Access-TOKEN: " + tok}, ""},
		{"no token", secure, nil, auth.CodeTrafficTokenMissing},
		{"e2b right, cube wrong", secure, []string{"Cube-Traffic-Access-Token: " + other, "E2b-Traffic-Access-Token: " + tok}, ""},
		{"e2b wrong, cube right", secure, []string{"Cube-Traffic-Access-Token: " + tok, "E2b-Traffic-Access-Token: " + other}, auth.CodeTrafficTokenInvalid},
		{"e2b empty, cube right", secure, []string{"E2b-Traffic-Access-Token:", "Cube-Traffic-Access-Token: " + tok}, ""},
		{"empty value", secure, []string{"E2b-Traffic-Access-Token: "}, auth.CodeTrafficTokenMissing},
		{"both empty", secure, []string{"E2b-Traffic-Access-Token:", "Cube-Traffic-Access-Token:"}, auth.CodeTrafficTokenMissing},
		// Whitespace around a field value is not part of it (RFC 9110 5.5).
		{"surrounding spaces", secure, []string{"E2b-Traffic-Access-Token: \t  " + tok + "  \t"}, ""},
		{"space inside", secure, []string{"E2b-Traffic-Access-Token: " + tok[:32] + " " + tok[32:]}, auth.CodeTrafficTokenInvalid},
		{"duplicated, right first", secure, []string{"E2b-Traffic-Access-Token: " + tok, "E2b-Traffic-Access-Token: " + other}, ""},
		{"duplicated, wrong first", secure, []string{"E2b-Traffic-Access-Token: " + other, "E2b-Traffic-Access-Token: " + tok}, auth.CodeTrafficTokenInvalid},
		{"right length, wrong token", secure, []string{"E2b-Traffic-Access-Token: " + sameLen}, auth.CodeTrafficTokenInvalid},
		{"upper-cased hex", secure, []string{"E2b-Traffic-Access-Token: " + strings.ToUpper(tok)}, auth.CodeTrafficTokenInvalid},
		{"prefix", secure, []string{"E2b-Traffic-Access-Token: " + tok[:63]}, auth.CodeTrafficTokenInvalid},
		{"token plus a byte", secure, []string{"E2b-Traffic-Access-Token: " + tok + "0"}, auth.CodeTrafficTokenInvalid},
		{"another sandbox's token", secure, []string{"Cube-Traffic-Access-Token: " + other}, auth.CodeTrafficTokenInvalid},
		{"token in an unrelated header", secure, []string{"X-Traffic-Access-Token: " + tok}, auth.CodeTrafficTokenMissing},
		{"public, no token", public, nil, ""},
		{"public, wrong e2b token", public, []string{"e2b-traffic-access-token: " + other}, ""},
		{"public, both tokens", public, []string{"E2B-Traffic-Access-Token: " + tok, "cube-traffic-access-token: " + other}, ""},
	}
	for _, tc := range cases {
		lines := append([]string{"GET /echo?q=1 HTTP/1.1", tc.host}, tc.headers...)
		lines = append(lines, passthrough...)
		resp, body := authRawRequest(t, h.addr, lines...)
		if tc.code != "" {
			expectAuthRefusal(t, tc.name, resp.StatusCode, resp.Header, body, tc.code)
			if len(b.heads) != 0 {
				t.Errorf("%s: a refused request reached the backend", tc.name)
			}
			continue
		}
		if resp.StatusCode != 200 || body != "ok" {
			t.Errorf("%s: got %d %q, want the backend's 200", tc.name, resp.StatusCode, body)
			continue
		}
		got := b.next(t)
		if got.line != "GET /echo?q=1 HTTP/1.1" {
			t.Errorf("%s: backend request line %q", tc.name, got.line)
		}
		for _, name := range []string{auth.HeaderE2BTrafficToken, auth.HeaderCubeTrafficToken} {
			if v := got.values(name); len(v) > 0 {
				t.Errorf("%s: backend received %s (%d values)", tc.name, name, len(v))
			}
		}
		if strings.Contains(got.raw, tok) || strings.Contains(got.raw, other) {
			t.Errorf("%s: a traffic token value reached the backend", tc.name)
		}
		for _, want := range [][2]string{{"Authorization", authz}, {"X-Access-Token", xAccess}, {"Cookie", cookie}, {"X-Other", "keep  me"}} {
			if v := got.values(want[0]); len(v) != 1 || v[0] != want[1] {
				t.Errorf("%s: backend got %s %q, want %q byte for byte", tc.name, want[0], v, want[1])
			}
		}
	}

	// The proxy's cookie is removed on every route; the other cookies keep
	// their bytes and separators, also when split over several Cookie lines.
	ours := auth.CookieName + "=" + other
	stripCases := []struct {
		host     string
		in, want []string
	}{
		{public, []string{"a=1; " + ours + "; b=\"x y\""}, []string{`a=1; b="x y"`}},
		{public, []string{ours + ";  b=2;c=3"}, []string{"b=2;c=3"}},
		{public, []string{"a=1;b=2; " + ours}, []string{"a=1;b=2"}},
		{public, []string{ours}, nil},
		{public, []string{"cube_proxy_auth_x=1; xcube_proxy_auth=2"}, []string{"cube_proxy_auth_x=1; xcube_proxy_auth=2"}},
		{secure, []string{"a=1; " + ours + "; " + auth.CookieName + "=" + sameLen + "; b=2"}, []string{"a=1; b=2"}},
		{public, []string{"a=1", ours + "; b=\"2\""}, []string{"a=1", `b="2"`}},
		{public, []string{ours + "; b=2", "a=\"1\""}, []string{"b=2", `a="1"`}},
		{public, []string{"a=1", ours, "c=3"}, []string{"a=1", "c=3"}},
	}
	for _, sc := range stripCases {
		lines := []string{"GET / HTTP/1.1", sc.host, "E2b-Traffic-Access-Token: " + tok}
		for _, c := range sc.in {
			lines = append(lines, "Cookie: "+c)
		}
		resp, body := authRawRequest(t, h.addr, lines...)
		if resp.StatusCode != 200 {
			t.Errorf("cookies %q: got %d %q", sc.in, resp.StatusCode, body)
			continue
		}
		got := b.next(t)
		if v := got.values("Cookie"); strings.Join(v, "\n") != strings.Join(sc.want, "\n") {
			t.Errorf("cookies %q reached the backend as %q, want %q", sc.in, v, sc.want)
		}
	}
}

// authFixedStore serves fixed routes, including ones the memory store
// would refuse (a restricted route without a token, as corrupt Redis data).
type authFixedStore map[string]*routing.Route

func (s authFixedStore) Lookup(_ context.Context, id string) (*routing.Route, error) {
	if r, ok := s[id]; ok {
		return r, nil
	}
	return nil, routing.ErrNotFound
}

// 3. A restricted route without a stored token is never served, not even
// on an exempt port or with a valid signed token; exempt ports skip only
// the token itself.
func testAuthNotConfigured(t *testing.T, lc *authLogCapture) {
	bad := startAuthBackend(t)
	good := startAuthBackend(t)
	tok := authRandomHex(t, 32)
	key := authRandomHex(t, 32)
	lc.secret(tok, key)
	signer, err := auth.NewSigner([]string{key})
	if err != nil {
		t.Fatal(err)
	}
	noToken, err := routing.ParseRoute("noconf", map[string]string{
		"HostIP": "127.0.0.1", "AllowPublicTraffic": "false", "8080": itoa(bad.port), "9000": itoa(bad.port),
	})
	if err != nil || noToken.Public || noToken.TrafficToken != "" {
		t.Fatalf("lenient parse: %v %+v", err, noToken)
	}
	exempt, err := routing.ParseRoute("exemptbox", map[string]string{
		"HostIP": "127.0.0.1", "AllowPublicTraffic": "false", "TrafficAccessToken": tok, "8080": itoa(good.port), "9000": itoa(good.port),
	})
	if err != nil {
		t.Fatal(err)
	}
	h := lc.harness(t, func(o *harnessOpts) {
		o.store = authFixedStore{"noconf": noToken, "exemptbox": exempt}
		o.cfg.ExemptPorts = []uint16{9000}
		o.cfg.Signer = signer
	})
	signed, err := signer.Sign("noconf", 8080, time.Now().Add(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	lc.secret(signed)

	for _, tc := range []struct {
		name  string
		lines []string
	}{
		{"no token", []string{"GET / HTTP/1.1", "Host: 8080-noconf.cube.test"}},
		{"some token", []string{"GET / HTTP/1.1", "Host: 8080-noconf.cube.test", "E2b-Traffic-Access-Token: " + tok}},
		{"exempt port", []string{"GET / HTTP/1.1", "Host: 9000-noconf.cube.test"}},
		{"signed query token", []string{"GET /?cube_token=" + signed + " HTTP/1.1", "Host: 8080-noconf.cube.test"}},
		{"signed cookie", []string{"GET / HTTP/1.1", "Host: 8080-noconf.cube.test", "Cookie: cube_proxy_auth=" + signer.CookieValue([]byte(signed), "")}},
		{"shared host", []string{"GET / HTTP/1.1", "Host: 127.0.0.1", "X-Cube-Sandbox-Id: noconf", "X-Cube-Sandbox-Port: 9000"}},
		// A CORS preflight too: answered 204 it would hide the data error
		// behind a browser's "allowed", which the README does not promise.
		{"preflight", []string{"OPTIONS / HTTP/1.1", "Host: 8080-noconf.cube.test", "Origin: https://app.example", "Access-Control-Request-Method: PUT"}},
		{"preflight, exempt port", []string{"OPTIONS / HTTP/1.1", "Host: 9000-noconf.cube.test", "Origin: https://app.example", "Access-Control-Request-Method: PUT"}},
	} {
		for i := 0; i < 2; i++ { // the second one is served from the cache
			resp, body := authRawRequest(t, h.addr, tc.lines...)
			expectAuthRefusal(t, tc.name, resp.StatusCode, resp.Header, body, auth.CodeTrafficTokenNotConfigured)
		}
	}
	bad.assertUntouched(t, "restricted route without a token")
	logged := false
	for _, line := range strings.Split(lc.String(), "\n") {
		logged = logged || strings.Contains(line, `"level":"WARN"`) && strings.Contains(line, "no traffic token") && strings.Contains(line, `"sandbox_id":"noconf"`)
	}
	if !logged {
		t.Error("the refused route was not logged as a data error with its sandbox id")
	}

	// Exempt port of a properly restricted route: no token needed, and a
	// token sent anyway is still stripped.
	resp, body := authRawRequest(t, h.addr, "GET /e HTTP/1.1", "Host: 9000-exemptbox.cube.test")
	if resp.StatusCode != 200 || body != "ok" {
		t.Fatalf("exempt port: %d %q", resp.StatusCode, body)
	}
	good.next(t)
	resp, _ = authRawRequest(t, h.addr, "GET /e HTTP/1.1", "Host: 9000-exemptbox.cube.test", "cube-traffic-access-token: "+tok)
	if got := good.next(t); resp.StatusCode != 200 || len(got.values(auth.HeaderCubeTrafficToken)) != 0 {
		t.Errorf("exempt port with a token: %d, forwarded %q", resp.StatusCode, got.values(auth.HeaderCubeTrafficToken))
	}
	resp, body = authRawRequest(t, h.addr, "GET /e HTTP/1.1", "Host: 8080-exemptbox.cube.test")
	expectAuthRefusal(t, "non-exempt port", resp.StatusCode, resp.Header, body, auth.CodeTrafficTokenMissing)
	resp, _ = authRawRequest(t, h.addr, "GET /e HTTP/1.1", "Host: 8080-exemptbox.cube.test", "E2b-Traffic-Access-Token: "+tok)
	if resp.StatusCode != 200 {
		t.Errorf("non-exempt port with the token: %d", resp.StatusCode)
	}
	good.next(t)
	// A preflight to an exempt port goes to the sandbox (README): the port
	// needs no credential, so the sandbox's own CORS answer is the one.
	resp, _ = authRawRequest(t, h.addr, "OPTIONS /e HTTP/1.1", "Host: 9000-exemptbox.cube.test",
		"Origin: https://app.example", "Access-Control-Request-Method: PUT")
	if got := good.next(t); resp.StatusCode != 200 || !strings.HasPrefix(got.line, "OPTIONS /e ") {
		t.Errorf("preflight to an exempt port: %d, sandbox got %q", resp.StatusCode, got.line)
	}
}

// 4. An unauthorized request has no side effect: no activity recorded, no
// upstream pool or connection, and it is refused before the sandbox state
// is even looked at.
func testAuthNoSideEffects(t *testing.T, lc *authLogCapture) {
	adminTok := "adm-" + authRandomHex(t, 20)
	tok := authRandomHex(t, 32)
	lc.secret(adminTok, tok)
	h := lc.harness(t, func(o *harnessOpts) { o.token = adminTok })
	b := startAuthBackend(t)
	putAuthRoute(h, "sidefx", tok, b.port, 8080)
	host := "Host: 8080-sidefx.cube.test"

	lastActive := func() map[string]int64 {
		st, body := h.adminDo("GET", "/admin/last_active", "", adminTok)
		var out struct{ Entries map[string]int64 }
		if st != 200 || json.Unmarshal([]byte(body), &out) != nil {
			t.Fatalf("last_active: %d %s", st, body)
		}
		return out.Entries
	}
	for _, lines := range [][]string{
		{"GET / HTTP/1.1", host},
		{"GET / HTTP/1.1", host, "E2b-Traffic-Access-Token: " + authRandomHex(t, 32)},
		{"GET /?cube_token=abc HTTP/1.1", host},
		{"GET / HTTP/1.1", host, "Upgrade: websocket", "Connection: Upgrade", "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==", "Sec-WebSocket-Version: 13"},
		{"GET / HTTP/1.1", host, "Accept: text/event-stream"},
	} {
		resp, _ := authRawRequest(t, h.addr, lines...)
		if resp.StatusCode != 403 {
			t.Errorf("%q: status %d, want 403", lines, resp.StatusCode)
		}
	}
	if _, ok := lastActive()["sidefx"]; ok {
		t.Error("an unauthorized request was recorded as sandbox activity")
	}
	if pools, conns, _ := h.proxy.pools.stats(); pools != 0 || conns != 0 {
		t.Errorf("unauthorized requests created %d upstream pools, %d connections", pools, conns)
	}
	b.assertUntouched(t, "unauthorized requests")

	// Auth comes before the sandbox state: a paused sandbox refuses an
	// unauthorized request with 403, not the 503 that makes clients retry.
	if st, body := h.adminDo("POST", "/admin/state", `{"sandbox_id":"sidefx","state":"paused"}`, adminTok); st != 200 {
		t.Fatalf("pause: %d %s", st, body)
	}
	resp, body := authRawRequest(t, h.addr, "GET / HTTP/1.1", host)
	expectAuthRefusal(t, "paused, no token", resp.StatusCode, resp.Header, body, auth.CodeTrafficTokenMissing)
	resp, _ = authRawRequest(t, h.addr, "GET / HTTP/1.1", host, "E2b-Traffic-Access-Token: "+tok)
	if resp.StatusCode != 503 {
		t.Errorf("paused with the token: %d, want 503", resp.StatusCode)
	}
	if st, body := h.adminDo("POST", "/admin/state", `{"sandbox_id":"sidefx","state":"running"}`, adminTok); st != 200 {
		t.Fatalf("resume: %d %s", st, body)
	}
	b.assertUntouched(t, "paused sandbox")

	// The same request with the token does have the side effects, so the
	// checks above are not vacuous.
	resp, _ = authRawRequest(t, h.addr, "GET / HTTP/1.1", host, "E2b-Traffic-Access-Token: "+tok)
	if resp.StatusCode != 200 {
		t.Fatalf("authorized: %d", resp.StatusCode)
	}
	b.next(t)
	if _, ok := lastActive()["sidefx"]; !ok {
		t.Error("an authorized request was not recorded as activity")
	}
	if pools, _, _ := h.proxy.pools.stats(); pools != 1 {
		t.Errorf("authorized request: %d pools, want 1", pools)
	}
	if b.accepts.Load() != 1 {
		t.Errorf("authorized request: %d backend connections, want 1", b.accepts.Load())
	}
}

// DESIGN.md's pipeline authorizes (3) before it chooses the backend (4):
// without the token, a restricted sandbox's port that is not mapped, or a
// route the proxy cannot dial, is a 403 like any other, not the 404 that
// would tell a stranger which ports the sandbox exposes or that its route
// is broken. With the token, the backend's 404 comes.
func testAuthBeforeBackendChoice(t *testing.T, lc *authLogCapture) {
	tok := authRandomHex(t, 32)
	lc.secret(tok)
	h := lc.harness(t, func(o *harnessOpts) { o.cfg.NodeIP = netip.MustParseAddr("127.0.0.9") })
	b := startAuthBackend(t)
	putAuthRoute(h, "ordremote", tok, b.port, 8080)
	// On this node (HostIP is node_ip) without a SandboxIP: no address to dial.
	h.put("ordlocal", map[string]string{"HostIP": "127.0.0.9", "AllowPublicTraffic": "false", "TrafficAccessToken": tok, "8080": itoa(b.port)})
	for _, tc := range []struct {
		name, host, token string
		status            int
		code              string
	}{
		{"unmapped port, no token", "9999-ordremote.cube.test", "", 403, auth.CodeTrafficTokenMissing},
		{"unmapped port, wrong token", "9999-ordremote.cube.test", authRandomHex(t, 32), 403, auth.CodeTrafficTokenInvalid},
		{"unmapped port, token", "9999-ordremote.cube.test", tok, 404, CodePortNotMapped},
		{"undialable route, no token", "8080-ordlocal.cube.test", "", 403, auth.CodeTrafficTokenMissing},
		{"undialable route, token", "8080-ordlocal.cube.test", tok, 404, CodeRouteInvalid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lines := []string{"GET / HTTP/1.1", "Host: " + tc.host}
			if tc.token != "" {
				lines = append(lines, "Cube-Traffic-Access-Token: "+tc.token)
			}
			resp, body := authRawRequest(t, h.addr, lines...)
			var e struct{ Code string }
			if err := json.Unmarshal([]byte(body), &e); err != nil || resp.StatusCode != tc.status || e.Code != tc.code {
				t.Errorf("got %d %s, want %d %s", resp.StatusCode, body, tc.status, tc.code)
			}
		})
	}
	b.assertUntouched(t, "requests no route could be dialed for")
}

// authHostClient sends every request to proxyAddr whatever the URL's host, so
// URLs (and the cookie jar) use the real sandbox hostname.
func authHostClient(proxyAddr string, jar http.CookieJar, follow bool, tlsCfg *tls.Config) *http.Client {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "tcp", proxyAddr)
		},
		TLSClientConfig:   tlsCfg,
		DisableKeepAlives: true,
	}
	c := &http.Client{Transport: tr, Jar: jar, Timeout: 10 * time.Second}
	c.CheckRedirect = func(req *http.Request, _ []*http.Request) error {
		if !follow {
			return http.ErrUseLastResponse
		}
		// Go sets Referer to the redirecting URL (token included); a
		// browser keeps the original referrer across a redirect (Fetch).
		req.Header.Del("Referer")
		return nil
	}
	return c
}

func authGet(t *testing.T, c *http.Client, u string, cookie string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest("GET", u, nil)
	if err != nil {
		t.Fatal(err)
	}
	if cookie != "" {
		req.Header.Set("Cookie", cookie)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

// assertAuthCookieRedirect checks the 302 that trades a signed token for the cookie.
//
// ttl is the token's lifetime counted from issued, a time taken before its
// expiry was fixed: Max-Age is the seconds left at the proxy's answer, so
// it may fall short of ttl by the time since issued, measured here (a
// slow run took over 4 s between signing and one of these answers).
func assertAuthCookieRedirect(t *testing.T, resp *http.Response, tok, location string, ttl time.Duration, issued time.Time, secure bool) {
	t.Helper()
	if resp.StatusCode != 302 || resp.Header.Get("Location") != location {
		t.Fatalf("got %d Location %q, want 302 to %q", resp.StatusCode, resp.Header.Get("Location"), location)
	}
	sc := resp.Header.Values("Set-Cookie")
	if len(sc) != 1 {
		t.Fatalf("Set-Cookie %q", sc)
	}
	c, err := http.ParseSetCookie(sc[0])
	if err != nil {
		t.Fatal(err)
	}
	// Up to a second over ttl: an issued token's expiry is rounded up to
	// a whole second (proxy.TokenExpiry), and Max-Age up from it. At
	// least what is left of ttl now, less a second: a token signed here
	// has its expiry truncated to a whole second.
	maxAge := time.Duration(c.MaxAge) * time.Second
	least := ttl - time.Since(issued) - time.Second
	if c.Name != auth.CookieName || !strings.HasPrefix(c.Value, tok+".") || !c.HttpOnly || c.SameSite != http.SameSiteLaxMode ||
		c.Secure != secure || c.Domain != "" || c.Path != "/" || maxAge > ttl+time.Second || maxAge < least {
		t.Errorf("Set-Cookie %q: want host-only HttpOnly SameSite=Lax Secure=%v Max-Age in [%v, %v]", sc[0], secure, least.Round(time.Millisecond), ttl+time.Second)
	}
	if resp.Header.Get("Cache-Control") != "no-store" {
		t.Errorf("302 Cache-Control %q", resp.Header.Get("Cache-Control"))
	}
}

// 5. Signed browser tokens through a real cookie jar.
func testAuthSignedTokens(t *testing.T, lc *authLogCapture) {
	oldKey, newKey := authRandomHex(t, 32), "k-"+authRandomHex(t, 24)
	adminTok := "adm-" + authRandomHex(t, 20)
	traffic := authRandomHex(t, 32)
	lc.secret(oldKey, newKey, adminTok, traffic)
	mustSigner := func(keys ...string) *auth.Signer {
		s, err := auth.NewSigner(keys)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	both, oldOnly, newOnly := mustSigner(newKey, oldKey), mustSigner(oldKey), mustSigner(newKey)
	sign := func(s *auth.Signer, id string, port uint16, exp time.Time) string {
		tok, err := s.Sign(id, port, exp)
		if err != nil {
			t.Fatal(err)
		}
		lc.secret(tok)
		return tok
	}
	b := startAuthBackend(t)
	start := func(s *auth.Signer, access *accesslog.Logger) *harness {
		h := lc.harness(t, func(o *harnessOpts) {
			o.cfg.Signer = s
			o.cfg.AccessLog = access
			o.token = adminTok
		})
		putAuthRoute(h, "box", traffic, b.port, 8080, 9090)
		putAuthRoute(h, "other", traffic, b.port, 8080)
		putAuthRoute(h, "pub", "", b.port, 8080)
		return h
	}
	h := start(both, lc.accessCube)
	const site = "http://8080-box.cube.test"
	// cookie is the cookie value the proxy sets for tok on the routes here.
	cookie := func(tok string) string { return both.CookieValue([]byte(tok), traffic) }
	ttl := 10 * time.Minute
	signed := time.Now()
	exp := signed.Add(ttl).Truncate(time.Second)
	tok := sign(both, "box", 8080, exp)
	checkHead := func(what string, got authHead, wantLine, wantCookie string) {
		t.Helper()
		if got.line != wantLine {
			t.Errorf("%s: backend request line %q, want %q", what, got.line, wantLine)
		}
		if v := got.values("Cookie"); wantCookie == "" && len(v) != 0 || wantCookie != "" && (len(v) != 1 || v[0] != wantCookie) {
			t.Errorf("%s: backend Cookie %q, want %q", what, v, wantCookie)
		}
		if strings.Contains(got.raw, auth.QueryParamName) || strings.Contains(got.raw, auth.CookieName) || strings.Contains(got.raw, tok) {
			t.Errorf("%s: the signed token reached the backend:\n%s", what, got.raw)
		}
	}

	// The 302 itself, inspected without following.
	resp, _ := authGet(t, authHostClient(h.addr, nil, false, nil), site+"/path?cube_token="+tok+"&x=1", "")
	assertAuthCookieRedirect(t, resp, tok, "/path?x=1", ttl, signed, false)
	resp, _ = authGet(t, authHostClient(h.addr, nil, false, nil), site+"/?cube_token="+tok, "")
	assertAuthCookieRedirect(t, resp, tok, "/", ttl, signed, false)
	resp, _ = authGet(t, authHostClient(h.addr, nil, false, nil), site+"/a/b?y=2&cube_token="+tok+"&z=%20", "")
	assertAuthCookieRedirect(t, resp, tok, "/a/b?y=2&z=%20", ttl, signed, false)
	// The redirect never leaves the host, whatever the request target.
	for _, tc := range []struct{ target, location string }{
		{"//evil.example/x", "/evil.example/x?k=v"},
		{`/\evil.example/x`, "/evil.example/x?k=v"},
		{"///evil.example/x", "/evil.example/x?k=v"},
		{"http://8080-BOX.cube.test:80/x", "/x?k=v"},
	} {
		resp, _ := authRawRequest(t, h.addr, "GET "+tc.target+"?cube_token="+tok+"&k=v HTTP/1.1", "Host: 8080-box.cube.test")
		assertAuthCookieRedirect(t, resp, tok, tc.location, ttl, signed, false)
	}
	// An absolute-form target naming another host is refused before any
	// token is looked at.
	resp, refused := authRawRequest(t, h.addr, "GET http://evil.example/x?cube_token="+tok+"&k=v HTTP/1.1", "Host: 8080-box.cube.test")
	if resp.StatusCode != 400 || !strings.Contains(refused, routing.CodeInvalidHost) || resp.Header.Get("Location") != "" || len(resp.Cookies()) != 0 {
		t.Errorf("absolute-form target naming evil.example: %d %s, Location %q, cookies %v; want 400 %s and neither", resp.StatusCode, refused, resp.Header.Get("Location"), resp.Cookies(), routing.CodeInvalidHost)
	}
	b.assertUntouched(t, "token redirects")

	// A browser: follows the redirect, keeps the cookie for this host only.
	jar, err := cookiejar.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	siteURL, _ := url.Parse(site + "/")
	jar.SetCookies(siteURL, []*http.Cookie{{Name: "theme", Value: "dark"}})
	browser := authHostClient(h.addr, jar, true, nil)
	resp, body := authGet(t, browser, site+"/path?cube_token="+tok+"&x=1", "")
	if resp.StatusCode != 200 || body != "ok" {
		t.Fatalf("after redirect: %d %q", resp.StatusCode, body)
	}
	checkHead("followed redirect", b.next(t), "GET /path?x=1 HTTP/1.1", "theme=dark")
	resp, _ = authGet(t, browser, site+"/again", "")
	if resp.StatusCode != 200 {
		t.Fatalf("cookie alone: %d", resp.StatusCode)
	}
	checkHead("cookie alone", b.next(t), "GET /again HTTP/1.1", "theme=dark")
	otherPort, _ := url.Parse("http://9090-box.cube.test/")
	for _, c := range jar.Cookies(otherPort) {
		if c.Name == auth.CookieName {
			t.Error("the cookie is not host-only: the jar sends it to another port's host")
		}
	}
	resp, body = authGet(t, browser, "http://9090-box.cube.test/", "")
	expectAuthRefusal(t, "other port, same jar", resp.StatusCode, resp.Header, body, auth.CodeTrafficTokenMissing)

	// Refusals, by query parameter and by cookie.
	direct := authHostClient(h.addr, nil, false, nil)
	expired := sign(both, "box", 8080, time.Now().Add(-2*time.Second))
	// Character 4 encodes expiry bits: still valid base64url, but the MAC
	// no longer matches.
	tampered := []byte(tok)
	if tampered[4] = 'A'; tok[4] == 'A' {
		tampered[4] = 'B'
	}
	lc.secret(string(tampered))
	for _, tc := range []struct {
		name, url, tok, code string
	}{
		{"expired", site + "/", expired, auth.CodeSignedTokenExpired},
		{"tampered", site + "/", string(tampered), auth.CodeSignedTokenInvalid},
		{"garbage", site + "/", "not*a*token", auth.CodeSignedTokenMalformed},
		{"another sandbox", "http://8080-other.cube.test/", tok, auth.CodeSignedTokenWrongTarget},
		{"another port", "http://9090-box.cube.test/", tok, auth.CodeSignedTokenWrongTarget},
		{"signed for another port", site + "/", sign(both, "box", 9090, exp), auth.CodeSignedTokenWrongTarget},
		{"signed for another sandbox", site + "/", sign(both, "other", 8080, exp), auth.CodeSignedTokenWrongTarget},
		{"unknown key", site + "/", sign(mustSigner("z-"+authRandomHex(t, 20)), "box", 8080, exp), auth.CodeSignedTokenInvalid},
	} {
		resp, body := authGet(t, direct, tc.url+"?cube_token="+url.QueryEscape(tc.tok), "")
		expectAuthRefusal(t, tc.name+" (query)", resp.StatusCode, resp.Header, body, tc.code)
		if tc.code == auth.CodeSignedTokenMalformed {
			continue
		}
		resp, body = authGet(t, direct, tc.url, "a=1; "+auth.CookieName+"="+cookie(tc.tok))
		expectAuthRefusal(t, tc.name+" (cookie)", resp.StatusCode, resp.Header, body, tc.code)
	}
	// A wrong traffic token is refused as wrong (README: wrong → 403
	// traffic_token_invalid) even beside a valid signed token or cookie: a
	// client that sends the header means it, and a stale or mistyped one
	// must show, not be papered over by an ambient cookie.
	for _, tc := range []struct {
		name  string
		lines []string
	}{
		{"a signed token (fetch)", []string{"GET /?cube_token=" + tok + " HTTP/1.1", "Sec-Fetch-Mode: cors"}},
		{"a signed token (navigation)", []string{"GET /?cube_token=" + tok + " HTTP/1.1"}},
		{"a valid cookie", []string{"GET / HTTP/1.1", "Cookie: " + auth.CookieName + "=" + cookie(tok)}},
	} {
		lines := append([]string{tc.lines[0], "Host: 8080-box.cube.test", "E2b-Traffic-Access-Token: " + authRandomHex(t, 32)}, tc.lines[1:]...)
		resp, body := authRawRequest(t, h.addr, lines...)
		expectAuthRefusal(t, "wrong traffic token beside "+tc.name, resp.StatusCode, resp.Header, body, auth.CodeTrafficTokenInvalid)
	}
	b.assertNoMore(t, "refused signed tokens")

	// Every cookie of the name counts, on every Cookie line: a sibling
	// host's domain-wide cookie sent first does not lock the user out.
	for _, tc := range []struct {
		name    string
		cookies []string
		keep    string
	}{
		{"a junk cookie first", []string{auth.CookieName + "=junk; " + auth.CookieName + "=" + cookie(tok)}, ""},
		{"a foreign token first", []string{"k=v; " + auth.CookieName + "=" + cookie(sign(both, "other", 8080, exp)) + "; " + auth.CookieName + "=" + cookie(tok)}, "k=v"},
		{"a bare token first", []string{"k=v; " + auth.CookieName + "=" + tok + "; " + auth.CookieName + "=" + cookie(tok)}, "k=v"},
		{"on a second Cookie line", []string{"k=v", auth.CookieName + "=" + cookie(tok)}, "k=v"},
	} {
		lines := []string{"GET /jar HTTP/1.1", "Host: 8080-box.cube.test"}
		for _, c := range tc.cookies {
			lines = append(lines, "Cookie: "+c)
		}
		if resp, body := authRawRequest(t, h.addr, lines...); resp.StatusCode != 200 {
			t.Errorf("%s: %d %s", tc.name, resp.StatusCode, body)
			continue
		}
		checkHead(tc.name, b.next(t), "GET /jar HTTP/1.1", tc.keep)
	}
	resp, body = authRawRequest(t, h.addr, "GET /jar HTTP/1.1", "Host: 8080-box.cube.test",
		"Cookie: "+auth.CookieName+"="+cookie(expired)+"; "+auth.CookieName+"=junk")
	expectAuthRefusal(t, "no cookie verifies", resp.StatusCode, resp.Header, body, auth.CodeSignedTokenExpired)

	// The token parameter never reaches the sandbox, even when another
	// credential, or a public route, lets the request through.
	for _, tc := range []struct {
		name, host, target, line string
		hdr                      []string
	}{
		{"traffic token", "8080-box.cube.test", "/q?cube_token=" + tok + "&a=1", "GET /q?a=1 HTTP/1.1", []string{"E2b-Traffic-Access-Token: " + traffic}},
		{"public route", "8080-pub.cube.test", "/q?a=1&cube_token=" + tok, "GET /q?a=1 HTTP/1.1", nil},
		{"encoded name", "8080-pub.cube.test", "/q?cube%5Ftoken=" + tok, "GET /q HTTP/1.1", nil},
		{"websocket", "8080-pub.cube.test", "/ws?cube_token=" + tok, "GET /ws HTTP/1.1",
			[]string{"Upgrade: websocket", "Connection: Upgrade", "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==", "Sec-WebSocket-Version: 13"}},
	} {
		lines := append([]string{"GET " + tc.target + " HTTP/1.1", "Host: " + tc.host}, tc.hdr...)
		resp, body := authRawRequest(t, h.addr, lines...)
		if tc.name != "websocket" && resp.StatusCode != 200 {
			t.Errorf("%s: %d %s", tc.name, resp.StatusCode, body)
			continue
		}
		checkHead(tc.name, b.next(t), tc.line, "")
	}

	// The cookie is stripped even when the traffic token authorizes.
	resp, _ = authGet(t, direct, site+"/both", "k=v; "+auth.CookieName+"="+cookie(expired))
	if resp.StatusCode != 403 {
		t.Errorf("expired cookie without traffic token: %d", resp.StatusCode)
	}
	req, _ := http.NewRequest("GET", site+"/both", nil)
	req.Header.Set("Cookie", auth.CookieName+"="+cookie(tok)+"; k=v")
	req.Header.Set("E2b-Traffic-Access-Token", traffic)
	if r, err := direct.Do(req); err != nil || r.StatusCode != 200 {
		t.Fatalf("traffic token plus cookie: %v %v", err, r)
	} else {
		r.Body.Close()
	}
	checkHead("traffic token plus cookie", b.next(t), "GET /both HTTP/1.1", "k=v")

	// Over TLS the cookie is Secure.
	tlsAddr, roots := serveTLS(t, h)
	resp, _ = authGet(t, authHostClient(tlsAddr, nil, false, &tls.Config{RootCAs: roots}), "https://8080-box.cube.test/p?cube_token="+tok, "")
	assertAuthCookieRedirect(t, resp, tok, "/p", ttl, signed, true)
	// Behind a TLS terminator (the README's h2 terminator, a load
	// balancer) the browser is on HTTPS too: a cookie without Secure would
	// go out in clear on any http:// navigation to the host. The header
	// can only make the cookie stricter for the client that sends it.
	for _, tc := range []struct {
		proto  string
		secure bool
	}{{"https", true}, {"HTTPS", true}, {"https, http", true}, {"http", false}, {"", false}} {
		lines := []string{"GET /p?cube_token=" + tok + " HTTP/1.1", "Host: 8080-box.cube.test"}
		if tc.proto != "" {
			lines = append(lines, "X-Forwarded-Proto: "+tc.proto)
		}
		resp, _ = authRawRequest(t, h.addr, lines...)
		assertAuthCookieRedirect(t, resp, tok, "/p", ttl, signed, tc.secure)
	}

	// POST /admin/tokens issues a token that works (admin with a signer,
	// as cmd wires it).
	adminLn := listen(t, "127.0.0.1:0")
	adminSrv := &fasthttp.Server{Handler: NewAdmin(AdminConfig{Token: adminTok, Signer: both}, h.proxy).Handler}
	go adminSrv.Serve(adminLn)
	t.Cleanup(func() { _ = adminSrv.Shutdown() })
	issue := func(token string) (int, string) {
		r, _ := http.NewRequest("POST", "http://"+adminLn.Addr().String()+"/admin/tokens", strings.NewReader(`{"sandbox_id":"box","port":8080,"ttl":"5m"}`))
		if token != "" {
			r.Header.Set(auth.HeaderAdminToken, token)
		}
		resp, err := http.DefaultClient.Do(r)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if st, _ := issue(""); st != 403 {
		t.Errorf("POST /admin/tokens without the admin token: %d", st)
	}
	if st, _ := issue(adminTok + "x"); st != 403 {
		t.Errorf("POST /admin/tokens with a wrong admin token: %d", st)
	}
	issuedAt := time.Now()
	st, issued := issue(adminTok)
	var it struct {
		Token      string `json:"token"`
		QueryParam string `json:"query_param"`
	}
	if st != 200 || json.Unmarshal([]byte(issued), &it) != nil || it.Token == "" || it.QueryParam != auth.QueryParamName {
		t.Fatalf("POST /admin/tokens: %d %s", st, issued)
	}
	lc.secret(it.Token)
	resp, _ = authGet(t, direct, site+"/adm?cube_token="+it.Token, "")
	assertAuthCookieRedirect(t, resp, it.Token, "/adm", 5*time.Minute, issuedAt, false)

	// Rotation: the old key verifies while listed second ...
	oldTok := sign(oldOnly, "box", 8080, exp)
	jar2, _ := cookiejar.New(nil)
	resp, body = authGet(t, authHostClient(h.addr, jar2, true, nil), site+"/old?cube_token="+oldTok, "")
	if resp.StatusCode != 200 || body != "ok" {
		t.Fatalf("token signed with the old key while listed: %d %q", resp.StatusCode, body)
	}
	checkHead("old key", b.next(t), "GET /old HTTP/1.1", "")

	// ... and not after a restart without it; new-key tokens still work.
	h2 := start(newOnly, lc.accessJSON)
	direct2 := authHostClient(h2.addr, nil, false, nil)
	resp, body = authGet(t, direct2, site+"/old?cube_token="+oldTok, "")
	expectAuthRefusal(t, "old key removed (query)", resp.StatusCode, resp.Header, body, auth.CodeSignedTokenInvalid)
	resp, body = authGet(t, direct2, site+"/old", auth.CookieName+"="+oldOnly.CookieValue([]byte(oldTok), traffic))
	expectAuthRefusal(t, "old key removed (cookie)", resp.StatusCode, resp.Header, body, auth.CodeSignedTokenInvalid)
	resp, _ = authGet(t, direct2, site+"/new?cube_token="+tok, "")
	assertAuthCookieRedirect(t, resp, tok, "/new", ttl, signed, false)
	b.assertNoMore(t, "after rotation")
}

// assertNoMore fails when the backend received requests nobody consumed.
func (b *authBackend) assertNoMore(t *testing.T, what string) {
	t.Helper()
	if n := len(b.heads); n != 0 {
		t.Errorf("%s: backend received %d unexpected requests", what, n)
	}
}

// 6. Admin API authentication.
func testAuthAdminToken(t *testing.T, lc *authLogCapture) {
	adminTok := "adm-" + authRandomHex(t, 24)
	lc.secret(adminTok)
	h := lc.harness(t, func(o *harnessOpts) { o.token = adminTok })
	for _, tc := range []struct {
		name, token string
		status      int
	}{
		{"missing", "", 403},
		{"wrong, same length", "adm-" + authRandomHex(t, 24), 403},
		{"prefix", adminTok[:len(adminTok)-1], 403},
		{"extra byte", adminTok + "0", 403},
		{"other case", strings.ToUpper(adminTok), 403},
		{"right", adminTok, 200},
	} {
		for _, ep := range [][2]string{{"GET", "/admin/last_active"}, {"GET", "/admin/routes"}, {"POST", "/admin/backend_cache/delete"}} {
			st, body := h.adminDo(ep[0], ep[1], `{"sandbox_id":"x"}`, tc.token)
			if st != tc.status {
				t.Errorf("%s %s with %s token: %d %s, want %d", ep[0], ep[1], tc.name, st, body, tc.status)
			}
			if st == 403 && !strings.Contains(body, `"error"`) {
				t.Errorf("403 body %q", body)
			}
		}
	}
	if st, _ := h.adminDo("GET", "/admin/healthz", "", ""); st != 200 {
		t.Errorf("healthz without token: %d, want 200 (probes)", st)
	}
	// A wrong token must not change state: the route stays.
	putAuthRoute(h, "keepme", "", 1, 8080)
	if st, _ := h.adminDo("DELETE", "/admin/routes/keepme", "", "nope-"+authRandomHex(t, 8)); st != 403 {
		t.Errorf("DELETE with a wrong token: %d", st)
	}
	if _, ok := h.store.Get("keepme"); !ok {
		t.Error("a refused admin request deleted a route")
	}

	// A request fasthttp cannot parse is logged at debug level; the log
	// line must not quote the request head, which carries the admin token
	// (or, on the traffic listener, a client's credentials).
	for _, addr := range []string{h.admin, h.addr} {
		raw := "GET /admin/routes HTTP/1.1\r\nHost: 127.0.0.1\r\n" + auth.HeaderAdminToken + ": " + adminTok +
			"\r\nNo colon here\r\n\r\n"
		if st := rawStatus(t, addr, raw); st != 400 {
			t.Errorf("malformed request to %s: %d, want 400", addr, st)
		}
	}

	// The admin API never answers on the traffic listener.
	for _, host := range []string{h.addr, "127.0.0.1", "8080-keepme.cube.test"} {
		r := h.req("GET", host, "/admin/routes", nil)
		r.Header.Set(auth.HeaderAdminToken, adminTok)
		resp := h.do(r)
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode == 200 || strings.Contains(string(body), `"routes"`) {
			t.Errorf("admin API answered on the traffic listener (Host %s): %d %s", host, resp.StatusCode, body)
		}
	}

	// No token configured: loopback clients only (this test can only be
	// loopback; the non-loopback bind is refused at startup, see cmd).
	open := lc.harness(t)
	if st, body := open.adminDo("GET", "/admin/last_active", "", ""); st != 200 {
		t.Errorf("no admin token, loopback client: %d %s", st, body)
	}
	if st, _ := open.adminDo("GET", "/admin/last_active", "", "anything-at-all"); st != 200 {
		t.Errorf("no admin token, loopback client with a header: %d", st)
	}
	for _, tc := range []struct {
		addr, token string
		ok          bool
	}{
		{"127.0.0.1:8082", "", true},
		{"localhost:8082", "", true},
		{"[::1]:0", "", true},
		{"0.0.0.0:8082", "", false}, // wildcard without a token
		{"10.0.0.1:8082", "", false},
		{"0.0.0.0:8082", "secret", true},
		// net.Listen would take these as every interface, random port.
		{"", "secret", false},
		{"10.0.0.1", "secret", false},
	} {
		if err := CheckAdminAddr(tc.addr, tc.token); (err == nil) != tc.ok {
			t.Errorf("CheckAdminAddr(%q, token %q) = %v, want ok %v", tc.addr, tc.token, err, tc.ok)
		}
	}
}

// testAuthCookieOrigin: every sandbox host is under one registrable domain,
// so to a browser a page of sandbox A is same-site with sandbox B and
// SameSite=Lax still attaches B's cookie to the WebSocket, fetch or form
// POST that A's page makes. The cookie authorizes no request whose Origin
// is another sandbox or site; header tokens, which a page cannot make a
// browser send, are not affected.
func testAuthCookieOrigin(t *testing.T, lc *authLogCapture) {
	key, traffic := authRandomHex(t, 32), authRandomHex(t, 32)
	s, sign := authSigner(t, key)
	tok := sign("box", 8080, 10*time.Minute)
	lc.secret(key, traffic, tok)
	b := startAuthBackend(t)
	h := lc.harness(t, func(o *harnessOpts) { o.cfg.Signer = s })
	putAuthRoute(h, "box", traffic, b.port, 8080)

	ws := []string{"Upgrade: websocket", "Connection: Upgrade", "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==", "Sec-WebSocket-Version: 13"}
	for _, tc := range []struct {
		name    string
		hdr     []string
		allowed bool
	}{
		{"no Origin (navigation, non-browser client)", nil, true},
		{"own origin", []string{"Origin: http://8080-box.cube.test"}, true},
		{"own origin, other scheme and explicit port", []string{"Origin: https://8080-BOX.cube.test:8443"}, true},
		{"same sandbox, another port", []string{"Origin: http://3000-box.cube.test"}, true},
		{"another sandbox", []string{"Origin: http://8080-evil.cube.test"}, false},
		{"another sandbox, WebSocket", append([]string{"Origin: http://3000-evil.cube.test"}, ws...), false},
		{"an id that is a prefix", []string{"Origin: http://8080-bo.cube.test"}, false},
		{"the host under another domain", []string{"Origin: http://8080-box.cube.test.evil.example"}, false},
		{"another site", []string{"Origin: https://evil.example"}, false},
		{"opaque origin", []string{"Origin: null"}, false},
		{"the traffic token is not ambient", []string{"Origin: http://8080-evil.cube.test", "E2b-Traffic-Access-Token: " + traffic}, true},
		// A subresource (<script src>, <img>, <link>) carries no Origin:
		// another sandbox's page is the same site, so the browser attaches
		// the Lax cookie, and a script's answer runs in that page (XSSI).
		// Sec-Fetch-Site names such a request, its Referer the page.
		{"another sandbox's <script src>", []string{"Sec-Fetch-Site: same-site", "Sec-Fetch-Mode: no-cors", "Sec-Fetch-Dest: script", "Referer: http://8080-evil.cube.test/"}, false},
		{"another sandbox's <img>, no Referer", []string{"Sec-Fetch-Site: same-site", "Sec-Fetch-Mode: no-cors", "Sec-Fetch-Dest: image"}, false},
		{"a cross-site page's <script src> (a partitioned cookie)", []string{"Sec-Fetch-Site: cross-site", "Sec-Fetch-Mode: no-cors", "Sec-Fetch-Dest: script", "Referer: https://platform.example/"}, false},
		{"a Referer that only starts like the host", []string{"Sec-Fetch-Site: same-site", "Sec-Fetch-Mode: no-cors", "Referer: http://8080-box.cube.test.evil.example/x"}, false},
		{"a Referer without a scheme", []string{"Sec-Fetch-Site: same-site", "Sec-Fetch-Mode: no-cors", "Referer: 8080-box.cube.test"}, false},
		{"the same sandbox's other port, <img>", []string{"Sec-Fetch-Site: same-site", "Sec-Fetch-Mode: no-cors", "Sec-Fetch-Dest: image", "Referer: https://3000-box.cube.test:8443/app?x=1#f"}, true},
		{"the same sandbox's other port, Referer origin only", []string{"Sec-Fetch-Site: same-site", "Sec-Fetch-Mode: cors", "Referer: http://3000-box.cube.test"}, true},
		{"the host's own page", []string{"Sec-Fetch-Site: same-origin", "Sec-Fetch-Mode: no-cors", "Sec-Fetch-Dest: script"}, true},
		{"a link on another sandbox's page (navigation)", []string{"Sec-Fetch-Site: same-site", "Sec-Fetch-Mode: navigate", "Sec-Fetch-Dest: document", "Referer: http://8080-evil.cube.test/"}, true},
		{"a preview frame of another site", []string{"Sec-Fetch-Site: cross-site", "Sec-Fetch-Mode: navigate", "Sec-Fetch-Dest: iframe"}, true},
		{"a typed URL or bookmark", []string{"Sec-Fetch-Site: none", "Sec-Fetch-Mode: navigate"}, true},
	} {
		lines := append([]string{"GET /o HTTP/1.1", "Host: 8080-box.cube.test", "Cookie: " + auth.CookieName + "=" + s.CookieValue([]byte(tok), traffic)}, tc.hdr...)
		resp, body := authRawRequest(t, h.addr, lines...)
		if !tc.allowed {
			expectAuthRefusal(t, tc.name, resp.StatusCode, resp.Header, body, auth.CodeSignedCookieForeignOrigin)
			b.assertNoMore(t, tc.name)
			continue
		}
		if resp.StatusCode != 200 {
			t.Errorf("%s: %d %s", tc.name, resp.StatusCode, body)
			continue
		}
		if got := b.next(t); strings.Contains(got.raw, tok) {
			t.Errorf("%s: the cookie reached the backend", tc.name)
		}
	}
}

// testAuthStaleLinkWithCookie: a browser that holds a valid cookie (from a
// newer link) and opens an old link whose cube_token has expired is let in
// by the cookie, as it would be on the same URL without the parameter; the
// parameter's refusal stands only when no cookie verifies. So does a
// request whose traffic-token header is right: any one valid credential
// lets it through (README, *Signed links and cookies for browsers*).
func testAuthStaleLinkWithCookie(t *testing.T, lc *authLogCapture) {
	key, traffic := authRandomHex(t, 32), authRandomHex(t, 32)
	s, sign := authSigner(t, key)
	valid, expired := sign("box", 8080, 10*time.Minute), sign("box", 8080, -time.Minute)
	lc.secret(key, traffic, valid, expired)
	b := startAuthBackend(t)
	h := lc.harness(t, func(o *harnessOpts) { o.cfg.Signer = s })
	putAuthRoute(h, "box", traffic, b.port, 8080)

	for _, tc := range []struct {
		name, param, cookie, header, code string // header: the traffic token's; code "" = let through
	}{
		{"expired link, valid cookie", expired, valid, "", ""},
		{"garbage link, valid cookie", "not*a*token", valid, "", ""},
		{"expired link, right traffic token", expired, "", traffic, ""},
		{"garbage link, right traffic token", "not*a*token", "", traffic, ""},
		{"expired link, expired cookie", expired, expired, "", auth.CodeSignedTokenExpired},
		{"expired link, no cookie", expired, "", "", auth.CodeSignedTokenExpired},
		{"garbage link, expired cookie: the link's error", "not*a*token", expired, "", auth.CodeSignedTokenMalformed},
	} {
		lines := []string{"GET /p?cube_token=" + url.QueryEscape(tc.param) + "&a=1 HTTP/1.1", "Host: 8080-box.cube.test"}
		if tc.cookie != "" {
			lines = append(lines, "Cookie: "+auth.CookieName+"="+s.CookieValue([]byte(tc.cookie), traffic))
		}
		if tc.header != "" {
			lines = append(lines, "Cube-Traffic-Access-Token: "+tc.header)
		}
		resp, body := authRawRequest(t, h.addr, lines...)
		if tc.code != "" {
			expectAuthRefusal(t, tc.name, resp.StatusCode, resp.Header, body, tc.code)
			b.assertNoMore(t, tc.name)
			continue
		}
		if resp.StatusCode != 200 {
			t.Errorf("%s: %d %s", tc.name, resp.StatusCode, body)
			continue
		}
		if got := b.next(t); got.line != "GET /p?a=1 HTTP/1.1" || strings.Contains(got.raw, tc.cookie+tc.header) {
			t.Errorf("%s: backend got %q:\n%s", tc.name, got.line, got.raw)
		}
	}
}

// testAuthOldLinkKeepsLongerCookie: a still-valid old link opened by a
// browser whose cookie (from a newer link) lives longer is redirected
// without a Set-Cookie, so the shorter link does not cut the session short;
// a cookie that dies first, or does not verify, is replaced.
func testAuthOldLinkKeepsLongerCookie(t *testing.T, lc *authLogCapture) {
	key, traffic, other := authRandomHex(t, 32), authRandomHex(t, 32), authRandomHex(t, 32)
	s, sign := authSigner(t, key)
	short, long := sign("box", 8080, 10*time.Minute), sign("box", 8080, time.Hour)
	lc.secret(key, traffic, other, short, long)
	b := startAuthBackend(t)
	h := lc.harness(t, func(o *harnessOpts) { o.cfg.Signer = s })
	putAuthRoute(h, "box", traffic, b.port, 8080)

	for _, tc := range []struct {
		name, link, cookie string // cookie: the Cookie line's value, "" for none
		wantMaxAge         int    // 0: no Set-Cookie
	}{
		{"short link, longer cookie kept", short, s.CookieValue([]byte(long), traffic), 0},
		{"long link, shorter cookie replaced", long, s.CookieValue([]byte(short), traffic), 3600},
		{"short link, longer cookie of a rotated traffic token replaced", short, s.CookieValue([]byte(long), other), 600},
		{"short link, no cookie", short, "", 600},
	} {
		lines := []string{"GET /p?cube_token=" + url.QueryEscape(tc.link) + "&a=1 HTTP/1.1", "Host: 8080-box.cube.test"}
		if tc.cookie != "" {
			lines = append(lines, "Cookie: "+auth.CookieName+"="+tc.cookie)
		}
		resp, body := authRawRequest(t, h.addr, lines...)
		if resp.StatusCode != 302 || resp.Header.Get("Location") != "/p?a=1" {
			t.Errorf("%s: %d Location %q %s", tc.name, resp.StatusCode, resp.Header.Get("Location"), body)
			continue
		}
		set := resp.Cookies()
		if tc.wantMaxAge == 0 {
			if len(set) != 0 {
				t.Errorf("%s: Set-Cookie %v, want none", tc.name, resp.Header["Set-Cookie"])
			}
			continue
		}
		// A second of slack either way: the link's expiry is whole seconds.
		if len(set) != 1 || set[0].Name != auth.CookieName || set[0].MaxAge < tc.wantMaxAge-2 || set[0].MaxAge > tc.wantMaxAge {
			t.Errorf("%s: Set-Cookie %v, want Max-Age ≈ %d", tc.name, resp.Header["Set-Cookie"], tc.wantMaxAge)
		}
	}
	b.assertNoMore(t, "redirects only")
}

// testAuthTrafficTokenRotated: the platform rotates a sandbox's traffic
// token to cut off whoever holds the old one (or the sandbox is recreated
// under its id with a new token). A browser session (the cookie) made under
// the old token ends with it, also after the route was public for a while;
// a new link gives a working cookie again.
func testAuthTrafficTokenRotated(t *testing.T, lc *authLogCapture) {
	key, first, second := authRandomHex(t, 32), authRandomHex(t, 32), authRandomHex(t, 32)
	s, sign := authSigner(t, key)
	lc.secret(key, first, second)
	b := startAuthBackend(t)
	h := lc.harness(t, func(o *harnessOpts) { o.cfg.Signer = s })
	putAuthRoute(h, "box", first, b.port, 8080)
	const site = "http://8080-box.cube.test"

	jar, err := cookiejar.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	browser := authHostClient(h.addr, jar, true, nil)
	open := func(what, target, wantCode string) {
		t.Helper()
		resp, body := authGet(t, browser, site+target, "")
		if wantCode != "" {
			expectAuthRefusal(t, what, resp.StatusCode, resp.Header, body, wantCode)
			b.assertNoMore(t, what)
			return
		}
		if resp.StatusCode != 200 || body != "ok" {
			t.Fatalf("%s: %d %q", what, resp.StatusCode, body)
		}
		if got := b.next(t); strings.Contains(got.raw, auth.CookieName) {
			t.Errorf("%s: the cookie reached the backend", what)
		}
	}
	tok := sign("box", 8080, 10*time.Minute)
	lc.secret(tok)
	open("link", "/?cube_token="+tok, "")
	open("cookie", "/page", "")

	putAuthRoute(h, "box", second, b.port, 8080)
	open("cookie after rotation", "/page", auth.CodeSignedTokenInvalid)
	resp, body := authRawRequest(t, h.addr, "GET /t HTTP/1.1", "Host: 8080-box.cube.test", "E2b-Traffic-Access-Token: "+second)
	if resp.StatusCode != 200 {
		t.Fatalf("the new traffic token: %d %s", resp.StatusCode, body)
	}
	b.next(t)
	fresh := sign("box", 8080, 10*time.Minute)
	lc.secret(fresh)
	open("new link", "/?cube_token="+fresh, "")
	open("new cookie", "/page", "")

	// Public for a while (the cookie is not needed, and stripped), then
	// restricted again under a new token: the cookie does not come back.
	putAuthRoute(h, "box", "", b.port, 8080)
	open("public route", "/page", "")
	putAuthRoute(h, "box", first, b.port, 8080)
	open("restricted again under another token", "/page", auth.CodeSignedTokenInvalid)
}

func TestAppendLocalPath(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"", "/"},
		{"/", "/"},
		{"/a/b", "/a/b"},
		{"/a//b", "/a//b"},
		{"//evil.example/x", "/evil.example/x"},
		{"///evil.example", "/evil.example"},
		{`/\evil.example`, "/evil.example"},
		{`\\evil.example`, "/evil.example"},
		{"/\t/evil.example", "/evil.example"},
		{"http://evil.example/x", "/x"},
		{"https://evil.example//y", "/y"},
		{"http://evil.example", "/"},
		{"*", "/"},
		{"evil.example:443", "/"},
	} {
		if got := string(appendLocalPath(nil, []byte(tc.in))); got != tc.want {
			t.Errorf("appendLocalPath(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// rawStatus writes raw to a new connection to addr and returns the status
// of the answer.
func rawStatus(t *testing.T, addr, raw string) int {
	t.Helper()
	resp, _ := rawRequest(t, addr, raw)
	return resp.StatusCode
}

// testAuthPreflight: a browser's CORS preflight carries no credentials, so
// on a restricted route the proxy answers it itself (the sandbox gets
// nothing without a token), letting the browser send the real request,
// which still needs the token. Anything short of a preflight is refused as
// before, and with a credential, or on a public route, the sandbox answers.
func testAuthPreflight(t *testing.T, lc *authLogCapture) {
	traffic := authRandomHex(t, 32)
	lc.secret(traffic)
	b := startAuthBackend(t)
	h := lc.harness(t)
	putAuthRoute(h, "box", traffic, b.port, 8080)
	putAuthRoute(h, "open", "", b.port, 8080)
	preflight := func(host string, extra ...string) []string {
		return append([]string{"OPTIONS /mcp HTTP/1.1", "Host: " + host, "Origin: https://app.example",
			"Access-Control-Request-Method: POST"}, extra...)
	}

	resp, body := authRawRequest(t, h.addr, preflight("8080-box.cube.test", "Access-Control-Request-Headers: content-type,e2b-traffic-access-token")...)
	want := map[string]string{
		"Access-Control-Allow-Origin":      "https://app.example",
		"Access-Control-Allow-Credentials": "true",
		"Access-Control-Allow-Methods":     "POST",
		"Access-Control-Allow-Headers":     "content-type,e2b-traffic-access-token",
		"Access-Control-Max-Age":           "600",
	}
	if resp.StatusCode != 204 || body != "" {
		t.Errorf("preflight: %d %q, want 204 without a body", resp.StatusCode, body)
	}
	for k, v := range want {
		if got := resp.Header.Get(k); got != v {
			t.Errorf("preflight: %s %q, want %q", k, got, v)
		}
	}
	// The answer mirrors all three: a cache must not serve it for another.
	if got := resp.Header.Get("Vary"); got != "Origin, Access-Control-Request-Method, Access-Control-Request-Headers" {
		t.Errorf("preflight: Vary %q", got)
	}
	b.assertUntouched(t, "preflight without a token")

	// The real request: the token is what lets it through.
	resp, body = authRawRequest(t, h.addr, "POST /mcp HTTP/1.1", "Host: 8080-box.cube.test", "Origin: https://app.example", "Content-Length: 0")
	expectAuthRefusal(t, "the real request without the token", resp.StatusCode, resp.Header, body, auth.CodeTrafficTokenMissing)
	b.assertUntouched(t, "the real request without the token")

	for _, tc := range []struct {
		name  string
		lines []string
	}{
		{"OPTIONS without Access-Control-Request-Method", []string{"OPTIONS /mcp HTTP/1.1", "Host: 8080-box.cube.test", "Origin: https://app.example"}},
		{"OPTIONS without Origin", []string{"OPTIONS /mcp HTTP/1.1", "Host: 8080-box.cube.test", "Access-Control-Request-Method: POST"}},
		// The head ends here, before the body; what authRawRequest
		// appends is then a second, malformed request, its answer unread.
		{"a preflight with a body", preflight("8080-box.cube.test", "Content-Length: 2\r\n\r\nab")},
		// A chunked body has no Content-Length to show it.
		{"a preflight with a chunked body", preflight("8080-box.cube.test", "Transfer-Encoding: chunked\r\n\r\n2\r\nab\r\n0")},
		{"GET with the preflight's headers", []string{"GET /mcp HTTP/1.1", "Host: 8080-box.cube.test", "Origin: https://app.example", "Access-Control-Request-Method: POST"}},
	} {
		resp, body := authRawRequest(t, h.addr, tc.lines...)
		expectAuthRefusal(t, tc.name, resp.StatusCode, resp.Header, body, auth.CodeTrafficTokenMissing)
		b.assertUntouched(t, tc.name)
	}

	// With the token, or on a public route, the sandbox answers its own.
	for _, tc := range []struct{ name, host, extra string }{
		{"preflight with the token", "8080-box.cube.test", "E2b-Traffic-Access-Token: " + traffic},
		{"preflight on a public route", "8080-open.cube.test", "X-Public: 1"},
	} {
		resp, body := authRawRequest(t, h.addr, preflight(tc.host, tc.extra)...)
		if resp.StatusCode != 200 || body != "ok" {
			t.Errorf("%s: %d %q, want the sandbox's answer", tc.name, resp.StatusCode, body)
		}
		if got := b.next(t); !strings.HasPrefix(got.line, "OPTIONS /mcp ") {
			t.Errorf("%s: the sandbox got %q", tc.name, got.line)
		}
	}
}

// testAuthQueryTokenNoRedirect: browsers cannot set headers on a WebSocket
// or an EventSource, so the signed token rides in the URL; but no
// WebSocket client follows a 302, and a cross-origin fetch or EventSource
// fails on a redirect that carries no CORS headers. Such requests are let
// through by a valid token at once, the parameter removed; a navigation
// (and a client that says nothing) still trades it for the cookie.
func testAuthQueryTokenNoRedirect(t *testing.T, lc *authLogCapture) {
	key, traffic := authRandomHex(t, 32), authRandomHex(t, 32)
	s, sign := authSigner(t, key)
	tok, other := sign("box", 8080, 10*time.Minute), sign("box", 9090, 10*time.Minute)
	lc.secret(key, traffic, tok, other)
	b := startAuthBackend(t)
	h := lc.harness(t, func(o *harnessOpts) { o.cfg.Signer = s })
	putAuthRoute(h, "box", traffic, b.port, 8080)
	host := "Host: 8080-box.cube.test"
	ws := []string{"Upgrade: websocket", "Connection: Upgrade", "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==", "Sec-WebSocket-Version: 13"}

	// A client answered 302 to a POST repeats it as a GET without its
	// body, and one without a cookie jar (an MCP client given the signed
	// URL: its POSTs, its SSE GET) comes back with no credential at all.
	post := []string{"Content-Type: application/json", "Content-Length: 2"}
	for _, tc := range []struct {
		name   string
		method string // GET when empty
		tok    string
		hdr    []string
		want   string // "forward", "redirect" or a refusal code
	}{
		{"WebSocket from a browser", "", tok, append([]string{"Origin: http://8080-box.cube.test", "Sec-Fetch-Mode: websocket"}, ws...), "forward"},
		{"WebSocket from a non-browser client", "", tok, ws, "forward"},
		{"EventSource from another port's page", "", tok, []string{"Accept: text/event-stream", "Origin: http://3000-box.cube.test", "Sec-Fetch-Mode: cors"}, "forward"},
		{"same-origin fetch", "", tok, []string{"Sec-Fetch-Mode: same-origin"}, "forward"},
		{"navigation", "", tok, []string{"Sec-Fetch-Mode: navigate", "Sec-Fetch-Dest: document"}, "redirect"},
		{"client without Sec-Fetch-Mode", "", tok, nil, "redirect"},
		// Connection: close ends the bodiless answer for the reader.
		{"HEAD without Sec-Fetch-Mode", "HEAD", tok, []string{"Connection: close"}, "redirect"},
		{"MCP POST without Sec-Fetch-Mode", "POST", tok, append([]string{"Accept: application/json, text/event-stream"}, post...), "forward"},
		{"form POST navigation", "POST", tok, append([]string{"Sec-Fetch-Mode: navigate"}, post...), "forward"},
		{"DELETE without Sec-Fetch-Mode", "DELETE", tok, nil, "forward"},
		{"SSE GET without Sec-Fetch-Mode", "", tok, []string{"Accept: text/event-stream"}, "forward"},
		{"SSE GET, type in capitals on a second Accept line", "", tok, []string{"Accept: application/json", "Accept: Text/Event-Stream"}, "forward"},
		{"WebSocket, token for another port", "", other, ws, auth.CodeSignedTokenWrongTarget},
		{"EventSource, garbage token", "", "not*a*token", []string{"Sec-Fetch-Mode: cors"}, auth.CodeSignedTokenMalformed},
		{"POST, token for another port", "POST", other, post, auth.CodeSignedTokenWrongTarget},
	} {
		method := tc.method
		if method == "" {
			method = "GET"
		}
		lines := append([]string{method + " /ev?a=1&cube_token=" + url.QueryEscape(tc.tok) + " HTTP/1.1", host}, tc.hdr...)
		body := ""
		if method == "POST" {
			body = "{}"
		}
		// No "Connection: close": it would cancel the upgrade.
		resp, body := rawRequest(t, h.addr, strings.Join(lines, "\r\n")+"\r\n\r\n"+body)
		switch tc.want {
		case "forward":
			// The backend answers 200 to the upgrade too: it is relayed.
			if resp.StatusCode != 200 || body != "ok" {
				t.Errorf("%s: %d %q (Location %q), want the sandbox's answer", tc.name, resp.StatusCode, body, resp.Header.Get("Location"))
				continue
			}
			if got := b.next(t); got.line != method+" /ev?a=1 HTTP/1.1" || strings.Contains(got.raw, tc.tok) {
				t.Errorf("%s: backend got %q:\n%s", tc.name, got.line, got.raw)
			}
			if len(resp.Header.Values("Set-Cookie")) != 0 {
				t.Errorf("%s: Set-Cookie %q on a request that is no navigation", tc.name, resp.Header.Values("Set-Cookie"))
			}
		case "redirect":
			if resp.StatusCode != 302 || resp.Header.Get("Location") != "/ev?a=1" {
				t.Errorf("%s: %d Location %q, want 302 to /ev?a=1", tc.name, resp.StatusCode, resp.Header.Get("Location"))
			}
		default:
			expectAuthRefusal(t, tc.name, resp.StatusCode, resp.Header, body, tc.want)
		}
		b.assertNoMore(t, tc.name)
	}

	// A real WebSocket client, end to end.
	ended := make(chan error, 1)
	wsPort := wsBackend(t, ended)
	putAuthRoute(h, "wsbox", traffic, wsPort, 8080)
	wsTok := sign("wsbox", 8080, time.Minute)
	lc.secret(wsTok)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, _, err := websocket.Dial(ctx, "ws://"+h.addr+"/ws?cube_token="+wsTok, &websocket.DialOptions{
		Host: "8080-wsbox.cube.test", Subprotocols: []string{"echo.v1"},
	})
	if err != nil {
		t.Fatalf("WebSocket with the signed token in its URL: %v", err)
	}
	defer c.CloseNow()
	if err := c.Write(ctx, websocket.MessageText, []byte("hi")); err != nil {
		t.Fatal(err)
	}
	if _, msg, err := c.Read(ctx); err != nil || string(msg) != "hi" {
		t.Fatalf("echo: %q %v", msg, err)
	}
}

// testAuthFramePreview: an agent platform shows a private sandbox's dev
// server in an iframe of its own (another site) by loading the signed link
// there. A SameSite=Lax cookie is neither stored nor sent in a cross-site
// frame, so the page after the 302 and all its subresources were 403s;
// such a frame on HTTPS now gets a partitioned SameSite=None cookie, which
// then lets the frame's own loads through while the Origin rule still
// refuses every other page's fetches.
func testAuthFramePreview(t *testing.T, lc *authLogCapture) {
	key, traffic := authRandomHex(t, 32), authRandomHex(t, 32)
	s, sign := authSigner(t, key)
	const ttl = 10 * time.Minute
	tok := sign("box", 3000, ttl)
	lc.secret(key, traffic, tok)
	value := s.CookieValue([]byte(tok), traffic)
	lc.secret(value)
	b := startAuthBackend(t)
	h := lc.harness(t, func(o *harnessOpts) { o.cfg.Signer = s })
	putAuthRoute(h, "box", traffic, b.port, 3000)

	tlsAddr, roots := serveTLS(t, h)
	send := func(tlsOn bool, raw string) (*http.Response, string) {
		t.Helper()
		if !tlsOn {
			return rawRequest(t, h.addr, raw)
		}
		c, err := tls.Dial("tcp", tlsAddr, &tls.Config{RootCAs: roots, ServerName: "3000-box.cube.test"})
		if err != nil {
			t.Fatal(err)
		}
		return rawExchange(t, c, tlsAddr, raw)
	}

	const (
		lax         = "; HttpOnly; SameSite=Lax"
		laxSecure   = "; HttpOnly; SameSite=Lax; Secure"
		partitioned = "; HttpOnly; SameSite=None; Secure; Partitioned"
	)
	frame := func(dest, site string) []string {
		return []string{"Sec-Fetch-Dest: " + dest, "Sec-Fetch-Mode: navigate", "Sec-Fetch-Site: " + site}
	}
	for _, tc := range []struct {
		name  string
		tls   bool
		hdr   []string
		attrs string // what follows Max-Age in the Set-Cookie
	}{
		{"cross-site iframe over TLS", true, frame("iframe", "cross-site"), partitioned},
		{"cross-site frame over TLS", true, frame("frame", "cross-site"), partitioned},
		{"cross-site iframe behind a TLS terminator", false, append(frame("iframe", "cross-site"), "X-Forwarded-Proto: https"), partitioned},
		{"cross-site iframe, first forwarded proto https", false, append(frame("iframe", "cross-site"), "X-Forwarded-Proto: https, http"), partitioned},
		// A Lax cookie works in a frame whose parent is of the sandbox's site.
		{"same-site iframe over TLS", true, frame("iframe", "same-site"), laxSecure},
		{"same-origin iframe over TLS", true, frame("iframe", "same-origin"), laxSecure},
		{"cross-site top-level link over TLS", true, frame("document", "cross-site"), laxSecure},
		{"typed URL over TLS", true, frame("document", "none"), laxSecure},
		{"no Sec-Fetch headers over TLS", true, nil, laxSecure},
		// SameSite=None needs Secure: nothing works in a frame over HTTP.
		{"cross-site iframe over plain HTTP", false, frame("iframe", "cross-site"), lax},
		{"cross-site iframe, forwarded proto http", false, append(frame("iframe", "cross-site"), "X-Forwarded-Proto: http"), lax},
	} {
		lines := append([]string{"GET /app?x=1&cube_token=" + tok + " HTTP/1.1", "Host: 3000-box.cube.test"}, tc.hdr...)
		resp, body := send(tc.tls, strings.Join(lines, "\r\n")+"\r\nConnection: close\r\n\r\n")
		if resp.StatusCode != 302 || resp.Header.Get("Location") != "/app?x=1" {
			t.Errorf("%s: %d Location %q %s, want 302 to /app?x=1", tc.name, resp.StatusCode, resp.Header.Get("Location"), body)
			continue
		}
		sc := resp.Header.Values("Set-Cookie")
		if len(sc) != 1 {
			t.Errorf("%s: Set-Cookie %q", tc.name, sc)
			continue
		}
		prefix := auth.CookieName + "=" + value + "; Path=/; Max-Age="
		rest, ok := strings.CutPrefix(sc[0], prefix)
		digits, attrs, _ := strings.Cut(rest, ";")
		maxAge, err := strconv.Atoi(digits)
		if !ok || err != nil || maxAge > int(ttl/time.Second) || maxAge < int(ttl/time.Second)-3 || ";"+attrs != tc.attrs {
			t.Errorf("%s: Set-Cookie\n %q\nwant\n %q", tc.name, sc[0], prefix+strconv.Itoa(int(ttl/time.Second))+tc.attrs)
		}
	}
	b.assertNoMore(t, "token trades")

	// What the preview frame then loads, with the partitioned cookie the
	// browser sends there (over TLS; authorization ignores the transport).
	cookie := "Cookie: " + auth.CookieName + "=" + value
	ws := []string{"Upgrade: websocket", "Connection: Upgrade", "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==", "Sec-WebSocket-Version: 13"}
	post := []string{"Content-Type: application/json", "Content-Length: 2"}
	for _, tc := range []struct {
		name   string
		method string
		hdr    []string
		code   string // "" when the sandbox answers
	}{
		{"the page after the 302", "GET", frame("iframe", "cross-site"), ""},
		{"script", "GET", []string{"Sec-Fetch-Dest: script", "Sec-Fetch-Mode: no-cors", "Sec-Fetch-Site: same-origin"}, ""},
		{"image", "GET", []string{"Sec-Fetch-Dest: image", "Sec-Fetch-Mode: no-cors", "Sec-Fetch-Site: same-origin"}, ""},
		{"same-origin fetch POST", "POST", append([]string{"Origin: https://3000-box.cube.test", "Sec-Fetch-Dest: empty", "Sec-Fetch-Mode: same-origin", "Sec-Fetch-Site: same-origin"}, post...), ""},
		{"the app's WebSocket", "GET", append([]string{"Origin: https://3000-box.cube.test", "Sec-Fetch-Dest: websocket", "Sec-Fetch-Mode: websocket", "Sec-Fetch-Site: same-origin"}, ws...), ""},
		// The cookie is sent on every request under the platform's
		// top-level site; anything with another Origin is refused.
		{"the platform page's fetch", "GET", []string{"Origin: https://platform.example", "Sec-Fetch-Dest: empty", "Sec-Fetch-Mode: cors", "Sec-Fetch-Site: cross-site"}, auth.CodeSignedCookieForeignOrigin},
		{"the platform page's WebSocket", "GET", append([]string{"Origin: https://platform.example", "Sec-Fetch-Mode: websocket", "Sec-Fetch-Site: cross-site"}, ws...), auth.CodeSignedCookieForeignOrigin},
		{"another sandbox's fetch POST", "POST", append([]string{"Origin: https://3000-evil.cube.test", "Sec-Fetch-Dest: empty", "Sec-Fetch-Mode: cors", "Sec-Fetch-Site: cross-site"}, post...), auth.CodeSignedCookieForeignOrigin},
	} {
		lines := append([]string{tc.method + " /app/x HTTP/1.1", "Host: 3000-box.cube.test", cookie}, tc.hdr...)
		reqBody := ""
		if tc.method == "POST" {
			reqBody = "{}"
		}
		// No "Connection: close": it would cancel the upgrade.
		resp, body := send(true, strings.Join(lines, "\r\n")+"\r\n\r\n"+reqBody)
		if tc.code != "" {
			expectAuthRefusal(t, tc.name, resp.StatusCode, resp.Header, body, tc.code)
			b.assertNoMore(t, tc.name)
			continue
		}
		// The backend answers 200 to the upgrade too: it is relayed.
		if resp.StatusCode != 200 || body != "ok" {
			t.Errorf("%s: %d %q, want the sandbox's answer", tc.name, resp.StatusCode, body)
			continue
		}
		if got := b.next(t); got.line != tc.method+" /app/x HTTP/1.1" || strings.Contains(got.raw, auth.CookieName) {
			t.Errorf("%s: backend got %q:\n%s", tc.name, got.line, got.raw)
		}
	}
}

// The admin token is the proxy's credential as the traffic tokens are: a
// client that sends it to a sandbox host (a script pointed at the wrong
// URL, a header set on every request) must not hand it to the code running
// there, on any line, in any case, or in a chunked body's trailer. The
// sandbox's own credentials still pass byte for byte.
func TestAdminTokenNeverReachesTheSandbox(t *testing.T) {
	h := newHarness(t)
	port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		io.WriteString(w, strconv.Quote(strings.Join(r.Header.Values(auth.HeaderAdminToken), ","))+" "+strconv.Quote(strings.Join(r.Trailer.Values(auth.HeaderAdminToken), ","))+" "+strconv.Quote(r.Header.Get("Authorization")))
	}))
	token := strings.Repeat("cd", 32)
	public := h.route("admintokpub", port)
	h.put("admintokpriv", map[string]string{"HostIP": "127.0.0.1", "AllowPublicTraffic": "false", "TrafficAccessToken": token, "80": itoa(port)})
	const want = `"" "" "Bearer app"`
	for _, tc := range []struct{ name, host, head, body string }{
		{"public", public, "X-Cube-Admin-Token: s3cret\r\n", ""},
		{"public, lower case", public, "x-cube-admin-token: s3cret\r\n", ""},
		{"public, two lines", public, "X-Cube-Admin-Token: s3cret\r\nX-CUBE-ADMIN-TOKEN: other\r\n", ""},
		{"public, empty", public, "X-Cube-Admin-Token:\r\n", ""},
		{"restricted", "80-admintokpriv.cube.test", "X-Cube-Admin-Token: s3cret\r\nCube-Traffic-Access-Token: " + token + "\r\n", ""},
		{"public, trailer", public, "Transfer-Encoding: chunked\r\nTrailer: X-Cube-Admin-Token\r\n",
			"3\r\nabc\r\n0\r\nX-Cube-Admin-Token: s3cret\r\n\r\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			raw := "POST / HTTP/1.1\r\nHost: " + tc.host + "\r\nAuthorization: Bearer app\r\n" + tc.head
			if tc.body == "" {
				raw += "Content-Length: 0\r\n"
			}
			resp, body := rawRequest(t, h.addr, raw+"\r\n"+tc.body)
			if resp.StatusCode != 200 || body != want {
				t.Fatalf("sandbox saw %d %s, want 200 %s", resp.StatusCode, body, want)
			}
		})
	}
}

// The cookie a signed link is traded for over plain HTTP is Secure when a
// TLS terminator in front says the client came over HTTPS: the first
// X-Forwarded-Proto element, blanks around it and case aside.
func TestCookieKindTrustsTheFirstForwardedProto(t *testing.T) {
	for _, tc := range []struct {
		proto string
		want  auth.CookieKind
	}{
		{"", auth.CookieLax},
		{"http", auth.CookieLax},
		{"https", auth.CookieLaxSecure},
		{"HTTPS", auth.CookieLaxSecure},
		{"https , http", auth.CookieLaxSecure},
		{"https\t,http", auth.CookieLaxSecure},
		{"http, https", auth.CookieLax},
		{"httpsx", auth.CookieLax},
	} {
		var ctx fasthttp.RequestCtx
		if tc.proto != "" {
			ctx.Request.Header.Set("X-Forwarded-Proto", tc.proto)
		}
		if got := cookieKind(&ctx); got != tc.want {
			t.Errorf("X-Forwarded-Proto %q: cookie kind %v, want %v", tc.proto, got, tc.want)
		}
	}
}
