package proxy

import (
	"bufio"
	"io"
	"net/http"
	"net/http/cookiejar"
	"slices"
	"strings"
	"testing"

	"github.com/cube-sandbox/cubeproxy/routing"
)

// A cookie a sandbox sets stays on the host the client addressed. Every
// sandbox host is under one parent domain, so a Domain=<parent> cookie
// would reach every other sandbox (planted sessions, or a cookie bomb that
// makes every sandbox answer that browser 431): its Domain is removed. The
// sandbox's own host (any case, a leading dot) keeps its Domain; every
// other byte, the order and the proxy's own cookie name are not special.
func TestSandboxSetCookieScopedToItsHost(t *testing.T) {
	set := []string{
		"plain=1; Path=/",
		"parent=1; Domain=cube.test; Path=/; HttpOnly",
		"dotted=1; domain=.CUBE.test",
		"own=1; Domain=8080-scope.cube.test",
		"owndot=1; Domain=.8080-SCOPE.cube.test; Secure",
		"sibling=1; Domain=3000-scope.cube.test",
		"empty=1; Domain=",
		"lastwins=1; Domain=8080-scope.cube.test; Domain=cube.test",
		"cube_proxy_auth=forged; Domain=cube.test; Max-Age=99999999",
		"chips=1;Domain=cube.test;Path=/x; SameSite=None; Secure; Partitioned",
		"Domain=cube.test; Path=/",
		"other=1; Domain=example.com",
	}
	want := []string{
		"plain=1; Path=/",
		"parent=1; Path=/; HttpOnly",
		"dotted=1",
		"own=1",
		"owndot=1; Secure",
		"sibling=1",
		"empty=1; Domain=",
		"lastwins=1",
		"cube_proxy_auth=forged; Max-Age=99999999",
		"chips=1;Path=/x; SameSite=None; Secure; Partitioned",
		"Domain=cube.test; Path=/",
		"other=1",
	}
	// The 101 of a WebSocket upgrade is relayed by the tunnel, not by respond.
	upgrade := "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
	for _, s := range set {
		upgrade += "Set-Cookie: " + s + "\r\n"
	}
	h := newHarness(t)
	port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for _, s := range set {
			w.Header().Add("Set-Cookie", s)
		}
	}))
	h.put("scope", map[string]string{"HostIP": "127.0.0.1", "SandboxIP": "127.0.0.1", "CreatedAt": "1", "8080": itoa(port)})
	h.put("masked", map[string]string{"HostIP": "127.0.0.1", "SandboxIP": "127.0.0.1", "CreatedAt": "1", "8080": itoa(port),
		"MaskRequestHost": "8080-scope.cube.test"})
	h.put("wsscope", map[string]string{"HostIP": "127.0.0.1", "SandboxIP": "127.0.0.1", "CreatedAt": "1", "8080": itoa(rawBackend(t, upgrade+"\r\n"))})

	for _, tc := range []struct {
		name  string
		lines []string
		want  []string
	}{
		{"plain", []string{"GET / HTTP/1.1", "Host: 8080-scope.cube.test"}, want},
		{"host with a port", []string{"GET / HTTP/1.1", "Host: 8080-Scope.cube.test:8081"}, want},
		{"masked route", []string{"GET / HTTP/1.1", "Host: 8080-masked.cube.test"}, want},
		{"HEAD", []string{"HEAD / HTTP/1.1", "Host: 8080-scope.cube.test"}, want},
		{"WebSocket 101", []string{"GET / HTTP/1.1", "Host: 8080-wsscope.cube.test", "Upgrade: websocket", "Connection: Upgrade"}, want},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := dialRaw(t, h.addr)
			if _, err := io.WriteString(c, strings.Join(tc.lines, "\r\n")+"\r\n\r\n"); err != nil {
				t.Fatal(err)
			}
			resp, err := http.ReadResponse(bufio.NewReader(c), &http.Request{Method: strings.Fields(tc.lines[0])[0]})
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if got := resp.Header.Values("Set-Cookie"); !slices.Equal(got, tc.want) {
				t.Errorf("status %d, Set-Cookie:\n got %q\nwant %q", resp.StatusCode, got, tc.want)
			}
		})
	}
}

// Through a cookie jar that, like a browser with no Public Suffix List
// entry for the sandbox domain, takes Domain=<parent> cookies: what
// sandbox A sets never reaches sandbox B, and still reaches A.
func TestSandboxCookieNeverReachesAnotherSandbox(t *testing.T) {
	h := newHarness(t)
	a := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Add("Set-Cookie", "session=attacker; Domain=cube.test; Path=/")
		w.Header().Add("Set-Cookie", "bomb="+strings.Repeat("x", 4000)+"; Domain=.cube.test; Path=/")
		io.WriteString(w, r.Header.Get("Cookie"))
	}))
	b := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, r.Header.Get("Cookie"))
	}))
	hostA, hostB := h.route("tosser", a), h.route("victim", b)
	jar, err := cookiejar.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	c := authHostClient(h.addr, jar, false, nil)
	if resp, body := authGet(t, c, "http://"+hostA+"/", ""); resp.StatusCode != 200 || body != "" {
		t.Fatalf("sandbox A: %d %q", resp.StatusCode, body)
	}
	if resp, body := authGet(t, c, "http://"+hostB+"/", ""); resp.StatusCode != 200 || body != "" {
		t.Errorf("sandbox B got %d, cookies %.60q; want none of sandbox A's", resp.StatusCode, body)
	}
	if resp, body := authGet(t, c, "http://"+hostA+"/", ""); resp.StatusCode != 200 ||
		!strings.Contains(body, "session=attacker") || !strings.Contains(body, "bomb=xxx") {
		t.Errorf("sandbox A's own host: %d, cookies %.60q; want its cookies back", resp.StatusCode, body)
	}
}

// A name under a sandbox's host ("x.<port>-<id>.<domain>", which wildcard
// DNS resolves) names no sandbox, so it serves any sandbox's pages by
// their path. A cookie a sandbox sets with Domain=<its own host> would go
// there too (a Domain attribute takes in every name under it), to another
// sandbox's server; so would one a shared or path-routed host's page sets
// with Domain=<that host>. Every Domain attribute goes: a sandbox's cookie
// stays host-only, on the very host it was set for.
func TestSandboxCookieNeverReachesAPathRouteUnderItsHost(t *testing.T) {
	h := newHarness(t)
	a := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Add("Set-Cookie", "session=victims; Domain="+r.Host+"; Path=/")
		w.Header().Add("Set-Cookie", "dotted=victims; Domain=."+r.Host)
		io.WriteString(w, r.Header.Get("Cookie"))
	}))
	b := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, r.Header.Get("Cookie"))
	}))
	hostA := h.route("victim", a)
	h.route("snoop", b)
	jar, err := cookiejar.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	c := authHostClient(h.addr, jar, false, nil)
	if resp, body := authGet(t, c, "http://"+hostA+"/", ""); resp.StatusCode != 200 || body != "" {
		t.Fatalf("sandbox A: %d %q", resp.StatusCode, body)
	}
	under := "http://x." + hostA + "/sandbox/snoop/" + itoa(b) + "/"
	if resp, body := authGet(t, c, under, ""); resp.StatusCode != 200 || body != "" {
		t.Errorf("another sandbox's page on a name under A's host: %d, cookies %.60q; want none of sandbox A's", resp.StatusCode, body)
	}
	if resp, body := authGet(t, c, "http://"+hostA+"/", ""); resp.StatusCode != 200 ||
		!strings.Contains(body, "session=victims") || !strings.Contains(body, "dotted=victims") {
		t.Errorf("sandbox A's own host: %d, cookies %.60q; want its cookies back", resp.StatusCode, body)
	}
}

// With the sandbox domain configured, a name under a sandbox's host routes
// no path: a page of another sandbox served there would be same-site with
// that host, and its script could set cookies for it (document.cookie with
// its Domain), which a Public Suffix List entry for the domain stops
// everywhere else. It gets the refusal host routing gives such a name, and
// no sandbox is dialed; the shared hosts and other names still route by path.
func TestNoPathRouteUnderASandboxHost(t *testing.T) {
	h := newHarness(t, func(o *harnessOpts) { o.cfg.Parser = routing.ParserConfig{Domains: []string{"cube.test"}} })
	b := startAuthBackend(t)
	hostA := h.route("owner", b.port)
	h.route("guest", b.port)
	path := "/sandbox/guest/" + itoa(b.port) + "/p"
	for _, tc := range []struct {
		host   string
		status int
		code   string
	}{
		{"x." + hostA, 400, "domain_not_allowed"},
		{"a.b." + strings.ToUpper(hostA) + ".:8081", 400, "domain_not_allowed"},
		{"127.0.0.1", 200, ""},
		{"x.cube.test", 200, ""},
	} {
		resp, body := rawRequest(t, h.addr, "GET "+path+" HTTP/1.1\r\nHost: "+tc.host+"\r\nConnection: close\r\n\r\n")
		if resp.StatusCode != tc.status || tc.code != "" && !strings.Contains(body, `"code":"`+tc.code+`"`) {
			t.Errorf("Host %s, %s: %d %.80q, want %d %s", tc.host, path, resp.StatusCode, body, tc.status, tc.code)
		}
		if tc.status == 200 {
			if got := b.next(t); got.line != "GET /p HTTP/1.1" {
				t.Errorf("Host %s: the sandbox got %q, want GET /p", tc.host, got.line)
			}
		}
	}
	b.assertNoMore(t, "names under a sandbox host")
}
