package proxy

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
	"github.com/cube-sandbox/cubeproxy/routing"
	"github.com/valyala/fasthttp"
)

type downStore struct{}

func (downStore) Lookup(context.Context, string) (*routing.Route, error) {
	return nil, errors.New("connection refused")
}

type badDataStore struct{}

func (badDataStore) Lookup(_ context.Context, id string) (*routing.Route, error) {
	return routing.ParseRoute(id, map[string]string{"SandboxIP": "10.0.0.1"}) // no HostIP
}

// Every row of DESIGN.md's status table, produced for real.
func TestErrorStatuses(t *testing.T) {
	t.Parallel()
	type want struct {
		status     int
		code       string
		retryAfter string
		sandboxID  string
	}
	release := make(chan struct{})
	defer close(release)
	for _, tc := range []struct {
		name  string
		opts  func(*harnessOpts)
		setup func(t *testing.T, h *harness) *http.Request
		want  want
	}{
		{"unparsable host", nil, func(t *testing.T, h *harness) *http.Request {
			return h.req("GET", "no-port-here.cube.test", "/", nil)
		}, want{400, "invalid_port", "", ""}},
		{"port zero", nil, func(t *testing.T, h *harness) *http.Request {
			return h.req("GET", "0-abc.cube.test", "/", nil)
		}, want{400, "invalid_port", "", ""}},
		{"IP host without target headers", nil, func(t *testing.T, h *harness) *http.Request {
			return h.req("GET", "127.0.0.1", "/", nil)
		}, want{400, "missing_target_headers", "", ""}},
		{"unknown sandbox", nil, func(t *testing.T, h *harness) *http.Request {
			return h.req("GET", "80-ghost.cube.test", "/", nil)
		}, want{404, CodeNotFound, "", "ghost"}},
		{"port not mapped", nil, func(t *testing.T, h *harness) *http.Request {
			h.put("ports", map[string]string{"HostIP": "127.0.0.1", "80": "8080"})
			return h.req("GET", "81-ports.cube.test", "/", nil)
		}, want{404, CodePortNotMapped, "", "ports"}},
		{"invalid route data", func(o *harnessOpts) { o.store = badDataStore{} }, func(t *testing.T, h *harness) *http.Request {
			return h.req("GET", "80-broken.cube.test", "/", nil)
		}, want{404, CodeRouteInvalid, "", "broken"}},
		{"route on this node without SandboxIP", func(o *harnessOpts) { o.cfg.NodeIP = netip.MustParseAddr("127.0.0.1") }, func(t *testing.T, h *harness) *http.Request {
			h.put("nosip", map[string]string{"HostIP": "127.0.0.1", "80": "8080"})
			return h.req("GET", "80-nosip.cube.test", "/", nil)
		}, want{404, CodeRouteInvalid, "", "nosip"}},
		{"sandbox killed", nil, func(t *testing.T, h *harness) *http.Request {
			h.put("dead", map[string]string{"HostIP": "127.0.0.1", "80": "8080"})
			if s, b := h.adminDo("POST", "/admin/meta/delete", `{"sandbox_id":"dead"}`, ""); s != 200 || !strings.Contains(b, `"backend_cache_deleted":`) {
				t.Fatalf("meta/delete: %d %s", s, b)
			}
			return h.req("GET", "80-dead.cube.test", "/", nil)
		}, want{410, CodeSandboxKilled, "", "dead"}},
		{"too many streams", func(o *harnessOpts) { o.cfg.MaxStreamsPerSandbox = 1 }, func(t *testing.T, h *harness) *http.Request {
			opened := make(chan struct{})
			port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				sseHeaders(w)
				close(opened)
				select {
				case <-release:
				case <-r.Context().Done():
				}
			}))
			host := h.route("busy", port)
			go func() {
				if resp, err := h.client.Do(h.req("GET", host, "/", nil)); err == nil {
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
			}()
			testenv.Recv(t, opened, 10*time.Second, "the stream holding the slot at the sandbox")
			return h.req("GET", host, "/", nil)
		}, want{429, CodeTooManyStreams, "1", "busy"}},
		{"backend refused", nil, func(t *testing.T, h *harness) *http.Request {
			return h.req("GET", h.route("refused", freePort(t)), "/", nil)
		}, want{502, CodeUpstreamConnect, "", "refused"}},
		{"backend reset before response", nil, func(t *testing.T, h *harness) *http.Request {
			port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				c, _, _ := w.(http.Hijacker).Hijack()
				c.Close()
			}))
			return h.req("POST", h.route("reset", port), "/", strings.NewReader("x"))
		}, want{502, CodeUpstreamReset, "", "reset"}},
		{"backend headers too large", func(o *harnessOpts) { o.cfg.UpstreamReadBufferSize = 4096 }, func(t *testing.T, h *harness) *http.Request {
			big := "HTTP/1.1 200 OK\r\nX-Big: " + strings.Repeat("a", 5000) + "\r\nContent-Length: 0\r\n\r\n"
			return h.req("GET", h.route("bighdr", rawBackend(t, big)), "/", nil)
		}, want{502, CodeUpstreamBadHeader, "", "bighdr"}},
		{"store down, nothing cached", func(o *harnessOpts) { o.store = downStore{} }, func(t *testing.T, h *harness) *http.Request {
			return h.req("GET", "80-anything.cube.test", "/", nil)
		}, want{503, CodeStoreUnavailable, "1", "anything"}},
		{"sandbox pausing", nil, func(t *testing.T, h *harness) *http.Request {
			h.put("pz", map[string]string{"HostIP": "127.0.0.1", "80": "8080"})
			if s, b := h.adminDo("POST", "/admin/state", `{"sandbox_id":"pz","state":"pausing"}`, ""); s != 200 {
				t.Fatalf("state: %d %s", s, b)
			}
			return h.req("GET", "80-pz.cube.test", "/", nil)
		}, want{503, CodeSandboxPausing, "1", "pz"}},
		{"backend sends no headers in time", func(o *harnessOpts) { o.cfg.ResponseHeaderTimeout = 200 * time.Millisecond }, func(t *testing.T, h *harness) *http.Request {
			port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				select {
				case <-release:
				case <-r.Context().Done():
				}
			}))
			return h.req("GET", h.route("slow", port), "/", nil)
		}, want{504, CodeUpstreamTimeout, "", "slow"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var mods []func(*harnessOpts)
			if tc.opts != nil {
				mods = append(mods, tc.opts)
			}
			h := newHarness(t, mods...)
			resp := h.do(tc.setup(t, h))
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tc.want.status {
				t.Fatalf("status %d (%s), want %d", resp.StatusCode, body, tc.want.status)
			}
			if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
				t.Errorf("Content-Type %q", ct)
			}
			if cc := resp.Header.Get("Cache-Control"); cc != "no-store" {
				t.Errorf("Cache-Control %q", cc)
			}
			if ra := resp.Header.Get("Retry-After"); ra != tc.want.retryAfter {
				t.Errorf("Retry-After %q, want %q", ra, tc.want.retryAfter)
			}
			if resp.Header.Get(HeaderRequestID) == "" {
				t.Error("no X-Cube-Request-Id on an error")
			}
			var got struct {
				Error     string  `json:"error"`
				Code      string  `json:"code"`
				SandboxID *string `json:"sandbox_id"`
			}
			if err := json.Unmarshal(body, &got); err != nil {
				t.Fatalf("body %q is not JSON: %v", body, err)
			}
			if got.Code != tc.want.code || got.Error == "" {
				t.Errorf("body %s: want code %q and a message", body, tc.want.code)
			}
			if tc.want.sandboxID != "" && (got.SandboxID == nil || *got.SandboxID != tc.want.sandboxID) {
				t.Errorf("body %s: want sandbox_id %q", body, tc.want.sandboxID)
			}
			// No valid sandbox named, none reported (README, Errors).
			if tc.want.sandboxID == "" && got.SandboxID != nil {
				t.Errorf("body %s: want no sandbox_id", body)
			}
		})
	}
}

func TestBrowserGetsHTMLErrorPage(t *testing.T) {
	h := newHarness(t)
	for _, tc := range []struct {
		hdr  map[string]string
		html bool
	}{
		{map[string]string{"Sec-Fetch-Mode": "navigate"}, true},
		{map[string]string{"Accept": "text/html,application/xhtml+xml,*/*;q=0.8"}, true},
		// A page's fetch() says what it is: its script reads JSON,
		// whatever Accept it set (README, Errors).
		{map[string]string{"Sec-Fetch-Mode": "cors", "Accept": "text/html"}, false},
	} {
		req := h.req("GET", "80-<script>.cube.test", "/", nil)
		req.Host = "80-nobody.cube.test"
		for k, v := range tc.hdr {
			req.Header.Set(k, v)
		}
		resp := h.do(req)
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if !tc.html {
			if resp.StatusCode != 404 || resp.Header.Get("Content-Type") != "application/json" || !strings.Contains(string(body), `"code":"sandbox_not_found"`) {
				t.Fatalf("%v: %d %q %s, want the JSON error", tc.hdr, resp.StatusCode, resp.Header.Get("Content-Type"), body)
			}
			continue
		}
		if resp.StatusCode != 404 || resp.Header.Get("Content-Type") != "text/html; charset=utf-8" ||
			!strings.Contains(string(body), "<h1>404 Not Found</h1>") || !strings.Contains(string(body), "nobody") {
			t.Fatalf("%v: %d %q %s", tc.hdr, resp.StatusCode, resp.Header.Get("Content-Type"), body)
		}
	}
}

// Malformed HTTP that fasthttp itself rejects still gets the JSON shape.
func TestMalformedRequestGetsJSON(t *testing.T) {
	h := newHarness(t)
	c, err := net.Dial("tcp", h.addr)
	if err != nil {
		t.Fatal(err)
	}
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	defer c.Close()
	fmt.Fprint(c, "GET / HTTP/1.1\r\nHost: 80-x.cube.test\r\nContent-Length: nope\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 400 || !strings.Contains(string(body), `"code":"bad_request"`) {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	if resp.Header.Get(HeaderRequestID) == "" {
		t.Error("a request fasthttp refused got no X-Cube-Request-Id")
	}
}

// Only HTTP/1.0 and HTTP/1.1 request lines reach a sandbox.
func TestUnsupportedHTTPVersion(t *testing.T) {
	h := newHarness(t)
	seen := make(chan string, 8)
	port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen <- r.Proto
		io.WriteString(w, "ok")
	}))
	host := h.route("versions", port)
	for _, tc := range []struct {
		version string
		status  int
	}{
		{"HTTP/1.1", 200}, {"HTTP/1.0", 200},
		{"HTTP/9.9", 505}, {"HTTP/2.0", 505}, {"HTTP/1.2", 505}, {"HTTP/0.9", 505},
	} {
		c, err := net.Dial("tcp", h.addr)
		if err != nil {
			t.Fatal(err)
		}
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		fmt.Fprintf(c, "GET / %s\r\nHost: %s\r\n\r\n", tc.version, host)
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		c.Close()
		if err != nil {
			t.Fatalf("%s: %v", tc.version, err)
		}
		resp.Body.Close()
		if resp.StatusCode != tc.status {
			t.Errorf("%s: %d, want %d", tc.version, resp.StatusCode, tc.status)
		}
	}
	close(seen)
	n := 0
	for proto := range seen {
		n++
		if proto != "HTTP/1.1" {
			t.Errorf("the sandbox got a %s request: the proxy speaks HTTP/1.1 to it", proto)
		}
	}
	if n != 2 {
		t.Errorf("the sandbox got %d requests, want 2 (HTTP/1.1 and HTTP/1.0 clients)", n)
	}
}

// CONNECT is refused before routing: the sandbox never sees it, whatever
// target it names, and other methods still pass.
func TestConnectRefused(t *testing.T) {
	h := newHarness(t)
	seen := make(chan string, 8)
	port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen <- r.Method
		io.WriteString(w, "ok")
	}))
	host := h.route("connect", port)
	for _, tc := range []struct {
		line   string
		status int
	}{
		{"CONNECT example.com:443 HTTP/1.1", 405},
		{"CONNECT " + host + " HTTP/1.1", 405},
		{"OPTIONS * HTTP/1.1", 200},
		{"GET / HTTP/1.1", 200},
	} {
		resp, body := authRawRequest(t, h.addr, tc.line, "Host: "+host)
		if resp.StatusCode != tc.status {
			t.Errorf("%s: %d %s, want %d", tc.line, resp.StatusCode, body, tc.status)
		}
		if tc.status == 405 && !strings.Contains(body, `"code":"method_not_allowed"`) {
			t.Errorf("%s: body %s", tc.line, body)
		}
	}
	close(seen)
	for m := range seen {
		if m == "CONNECT" {
			t.Error("a CONNECT reached the sandbox")
		}
	}
}

// How a failed exchange is told to the client: the sandbox's fault
// (closed, reset, gone silent, unparsable) or a timeout of the proxy's.
func TestUpstreamErrorClassification(t *testing.T) {
	p, err := New(Config{Logger: slog.New(slog.DiscardHandler)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	backendAddr := &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 9}
	opErr := func(op string, errno syscall.Errno) error {
		return &net.OpError{Op: op, Net: "tcp", Addr: backendAddr, Err: os.NewSyscallError(op, errno)}
	}
	for _, tc := range []struct {
		name   string
		err    error
		status int
		code   string
	}{
		{"eof", io.EOF, 502, CodeUpstreamReset},
		{"cut body", io.ErrUnexpectedEOF, 502, CodeUpstreamReset},
		{"reset on write", opErr("write", syscall.ECONNRESET), 502, CodeUpstreamReset},
		{"gone silent on write", opErr("write", syscall.ETIMEDOUT), 502, CodeUpstreamReset},
		{"gone silent on read", opErr("read", syscall.ETIMEDOUT), 502, CodeUpstreamReset},
		{"gone silent in a head", fmt.Errorf("error when reading response headers: %w", opErr("read", syscall.ETIMEDOUT)), 502, CodeUpstreamReset},
		{"deadline", os.ErrDeadlineExceeded, 504, CodeUpstreamTimeout},
		{"unparsable", errors.New("cannot parse response status code"), 502, CodeUpstreamBadHeader},
		{"client body", &clientBodyError{err: errors.New("bad chunk")}, 400, CodeBadBody},
		{"connect refused", &dialError{err: opErr("dial", syscall.ECONNREFUSED)}, 502, CodeUpstreamConnect},
		{"connect timed out", &dialError{err: &net.OpError{Op: "dial", Net: "tcp", Err: os.ErrDeadlineExceeded}}, 504, CodeUpstreamConnectTimeout},
		{"proxy out of descriptors", &dialError{err: opErr("socket", syscall.EMFILE)}, 503, CodeOutOfResources},
		{"system out of descriptors", &dialError{err: opErr("socket", syscall.ENFILE)}, 503, CodeOutOfResources},
		// Every local port to that address is taken (connections and
		// TIME_WAIT): the proxy's shortage, not the sandbox refusing.
		{"proxy out of local ports", &dialError{err: opErr("connect", syscall.EADDRNOTAVAIL)}, 503, CodeOutOfResources},
		// A sandbox VM gone: the host or its network is unreachable.
		{"host unreachable", &dialError{err: opErr("connect", syscall.EHOSTUNREACH)}, 502, CodeUpstreamConnect},
		{"network unreachable", &dialError{err: opErr("connect", syscall.ENETUNREACH)}, 502, CodeUpstreamConnect},
		// The connecting socket was destroyed (ss -K, a cgroup hook): the
		// proxy has descriptors to spare.
		{"connect aborted", &dialError{err: opErr("connect", syscall.ECONNABORTED)}, 502, CodeUpstreamConnect},
	} {
		var ctx fasthttp.RequestCtx
		var x exchange
		p.upstreamError(&ctx, &x, tc.err, []byte("box"), netip.AddrPort{})
		if ctx.Response.StatusCode() != tc.status || x.errCode != tc.code {
			t.Errorf("%s: %d %s, want %d %s", tc.name, ctx.Response.StatusCode(), x.errCode, tc.status, tc.code)
		}
	}
}

// An outage of the route store is logged once a second, not once per
// request: every request for an uncached sandbox fails while Redis is
// down, and a line each would flood the log (the access log and the
// store error metric count them all).
func TestStoreOutageLogIsRateLimited(t *testing.T) {
	logs := new(obsLogBuf)
	h := newHarness(t, func(o *harnessOpts) {
		o.store = downStore{}
		o.cfg.Logger = slog.New(slog.NewTextHandler(logs, nil))
	})
	start := time.Now()
	const n = 20
	for i := range n {
		if st, _, _ := h.get(fmt.Sprintf("8080-sbxoutage%d.cube.test", i), "/"); st != 503 {
			t.Fatalf("request %d with the store down: %d, want 503", i, st)
		}
	}
	// A loaded machine may take longer than a second for the batch; the
	// limit then allows a line for each second begun, still far below n.
	elapsed := time.Since(start)
	most := 1 + int(elapsed/time.Second)
	lines := strings.Count(logs.String(), "route store unavailable")
	if lines < 1 || lines > most {
		t.Errorf("%d requests during a store outage (%v) logged %d error lines, want 1 to %d", n, elapsed, lines, most)
	}
}

// A browser page on another origin (the platform's UI, a browser-based
// agent) calls a sandbox with fetch(): the proxy answers its preflight
// itself (README, CORS preflights), and then its refusal of the call must
// be readable too. Without Access-Control-Allow-Origin on the proxy's own
// answer the browser hides it: fetch rejects with "Failed to fetch", the
// same as a network outage, so the page could not tell a wrong token from
// a paused sandbox, nor read the Retry-After of a 429 or 503. The
// sandbox's own answers keep their own CORS headers, untouched.
func TestCrossOriginFetchReadsProxyErrors(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	token := strings.Repeat("ab", 32)
	sandbox := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusNotFound) // the app's own 404, no CORS headers of its own
	}))
	putAuthRoute(h, "locked", token, sandbox, 8080)
	h.put("pz", map[string]string{"HostIP": "127.0.0.1", "80": "8080"})
	if s, b := h.adminDo("POST", "/admin/state", `{"sandbox_id":"pz","state":"pausing"}`, ""); s != 200 {
		t.Fatalf("state: %d %s", s, b)
	}
	refused := h.route("refused", freePort(t))
	app := h.route("app", sandbox)

	const origin = "https://app.example"
	for _, tc := range []struct {
		name       string
		host       string
		origin     string
		status     int
		retryAfter string
		corsWanted bool
	}{
		{"token missing", "8080-locked.cube.test", origin, 403, "", true},
		{"unknown sandbox", "80-ghost.cube.test", origin, 404, "", true},
		{"sandbox pausing", "80-pz.cube.test", origin, 503, "1", true},
		{"sandbox refused", refused, origin, 502, "", true},
		{"no Origin: no CORS headers", "80-ghost.cube.test", "", 404, "", false},
		{"the sandbox's own answer", app, origin, 404, "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := h.req("POST", tc.host, "/mcp", strings.NewReader("{}"))
			req.Header.Set("Content-Type", "application/json")
			if tc.origin != "" {
				req.Header.Set("Origin", tc.origin)
				req.Header.Set("Sec-Fetch-Mode", "cors")
			}
			resp := h.do(req)
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tc.status || resp.Header.Get("Retry-After") != tc.retryAfter {
				t.Fatalf("%d Retry-After %q, want %d %q", resp.StatusCode, resp.Header.Get("Retry-After"), tc.status, tc.retryAfter)
			}
			acao := resp.Header.Get("Access-Control-Allow-Origin")
			if !tc.corsWanted {
				if acao != "" {
					t.Fatalf("Access-Control-Allow-Origin %q, want none", acao)
				}
				return
			}
			if acao != "*" {
				t.Errorf("Access-Control-Allow-Origin %q, want *: the page cannot read the refusal", acao)
			}
			// "*" is for calls without credentials; one with the browser's
			// cookies stays unreadable, so a page of another sandbox learns
			// nothing of the browser's cookie for this one from the code.
			if v := resp.Header.Get("Access-Control-Allow-Credentials"); v != "" {
				t.Errorf("Access-Control-Allow-Credentials %q, want none", v)
			}
			exposed := resp.Header.Get("Access-Control-Expose-Headers")
			for _, name := range []string{"Retry-After", HeaderRequestID, HeaderRetcode} {
				if !strings.Contains(exposed, name) {
					t.Errorf("Access-Control-Expose-Headers %q does not expose %s", exposed, name)
				}
			}
		})
	}
}

// In an error's JSON body '<', '>', '&' and control bytes are escaped as
// \u00XX, as encoding/json does, so a page may embed it; a byte that is no
// UTF-8 becomes \ufffd; everything else (a space, DEL, a literal U+FFFD,
// any other character) is written as it is. The HTML
// page escapes the message: a name a client chose must not become markup.
func TestErrorBodyEscaping(t *testing.T) {
	for _, tc := range []struct{ msg, want string }{
		{"a b", `"a b"`},
		{"<script>&", `"\u003cscript\u003e\u0026"`},
		{"q\"\\\n\x7f", `"q\"\\\u000a` + "\x7f" + `"`},
		{"\xff", `"\ufffd"`},
		{"\ufffd é", "\"\ufffd é\""},
	} {
		got := string(appendErrorJSON(nil, proxyError{msg: tc.msg, code: "c"}, nil))
		want := `{"error":` + tc.want + `,"code":"c"}` + "\n"
		if got != want {
			t.Errorf("%q: %s, want %s", tc.msg, got, want)
		}
		var v struct{ Error string }
		if err := json.Unmarshal([]byte(got), &v); err != nil || v.Error != strings.ToValidUTF8(tc.msg, "\ufffd") {
			t.Errorf("%q: %s decodes as %q (%v)", tc.msg, got, v.Error, err)
		}
	}
	page := errorPage(proxyError{status: 400, code: "c", msg: `bad <img src=x onerror=alert(1)> "host"`}, []byte("<b>id"))
	if strings.Contains(page, "<img") || strings.Contains(page, "<b>") {
		t.Errorf("the error page holds the client's markup:\n%s", page)
	}
}
