package proxy

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"iter"
	"net"
	"net/http"
	"net/http/httptrace"
	"regexp"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/cube-sandbox/cubeproxy/auth"
	"github.com/cube-sandbox/cubeproxy/internal/testenv"
	"github.com/cube-sandbox/cubeproxy/routing"
)

// echoHeaders answers with the request's Host and headers as JSON.
func echoHeaders() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		out := map[string]any{"host": r.Host, "headers": r.Header, "uri": r.RequestURI}
		json.NewEncoder(w).Encode(out)
	})
}

// echoRawRequest sends a raw request (lines, without the blank line) to the
// proxy at addr and decodes the echoHeaders answer, which must be a 200.
func echoRawRequest(t *testing.T, addr string, lines ...string) echoed {
	t.Helper()
	_, e := echoRawExchange(t, addr, lines...)
	return e
}

// echoRawExchange is echoRawRequest that also returns the response, for
// its head.
func echoRawExchange(t *testing.T, addr string, lines ...string) (*http.Response, echoed) {
	t.Helper()
	resp, body := authRawRequest(t, addr, lines...)
	if resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	var e echoed
	if err := json.Unmarshal([]byte(body), &e); err != nil {
		t.Fatal(err)
	}
	return resp, e
}

type echoed struct {
	Host    string              `json:"host"`
	URI     string              `json:"uri"`
	Headers map[string][]string `json:"headers"`
}

func (e echoed) get(k string) string {
	if v := e.Headers[http.CanonicalHeaderKey(k)]; len(v) > 0 {
		return strings.Join(v, "|")
	}
	return ""
}

func TestRequestHeaders(t *testing.T) {
	h := newHarness(t)
	port := backend(t, "127.0.0.1", echoHeaders())
	h.put("hdr", map[string]string{"HostIP": "127.0.0.1", "80": itoa(port), "49983": itoa(port)})
	h.put("masked", map[string]string{"HostIP": "127.0.0.1", "MaskRequestHost": "localhost:${PORT}", "80": itoa(port), "49983": itoa(port)})

	send := func(host string, hdr map[string]string) echoed {
		t.Helper()
		// No signer here: cube_token is the app's own parameter and passes.
		req := h.req("GET", host, "/p/a%2Fb/../c?x=1&cube_token=app&y=%20", nil)
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		resp := h.do(req)
		defer resp.Body.Close()
		var e echoed
		if err := json.NewDecoder(resp.Body).Decode(&e); err != nil {
			t.Fatal(err)
		}
		if resp.Header.Get(HeaderRequestID) != e.get(HeaderRequestID) || e.get(HeaderRequestID) == "" {
			t.Errorf("request id: backend %q, client %q", e.get(HeaderRequestID), resp.Header.Get(HeaderRequestID))
		}
		return e
	}

	e := send("80-HDR.Cube.Test", map[string]string{
		"Authorization":     "Bearer  abc.DEF==",
		"X-Access-Token":    "envd-token",
		"Cookie":            "a=1; b=two; c",
		"Mcp-Session-Id":    "Sess-ABC_123",
		"X-Forwarded-For":   "203.0.113.7",
		"Connection":        "keep-alive, X-Hop-Custom",
		"X-Hop-Custom":      "gone",
		"Keep-Alive":        "timeout=5",
		"Te":                "trailers",
		"Proxy-Connection":  "keep-alive",
		"X-Cube-Request-Id": "client-chosen-id",
	})
	for k, want := range map[string]string{
		"Authorization":     "Bearer  abc.DEF==",
		"X-Access-Token":    "envd-token",
		"Cookie":            "a=1; b=two; c",
		"Mcp-Session-Id":    "Sess-ABC_123",
		"X-Forwarded-For":   "203.0.113.7, 127.0.0.1",
		"X-Real-Ip":         "127.0.0.1",
		"X-Forwarded-Proto": "http",
		"X-Cube-Request-Id": "client-chosen-id",
		"X-Hop-Custom":      "",
		"Keep-Alive":        "",
		"Te":                "",
		"Proxy-Connection":  "",
		"X-Forwarded-Host":  "",
	} {
		if got := e.get(k); got != want {
			t.Errorf("%s = %q, want %q", k, got, want)
		}
	}
	if e.Host != "80-HDR.Cube.Test" {
		t.Errorf("Host %q: must pass as the client sent it", e.Host)
	}
	if e.URI != "/p/a%2Fb/../c?x=1&cube_token=app&y=%20" {
		t.Errorf("request URI %q: must pass unnormalised and whole", e.URI)
	}

	e = send("80-masked.cube.test", nil)
	if e.Host != "localhost:80" || e.get("X-Forwarded-Host") != "80-masked.cube.test" {
		t.Errorf("masked: Host %q, X-Forwarded-Host %q", e.Host, e.get("X-Forwarded-Host"))
	}
	e = send("49983-masked.cube.test", nil)
	if e.Host != "49983-masked.cube.test" || e.get("X-Forwarded-Host") != "" {
		t.Errorf("envd port must never be masked: Host %q", e.Host)
	}
	e = send("80-hdr.cube.test", nil)
	if id := e.get(HeaderRequestID); len(id) != 25 || id[8] != '-' {
		t.Errorf("generated request id %q", id)
	}
	// A client id that is no token (it would split the access log's
	// fields) or too long is replaced, not passed on.
	for _, bad := range []string{"two words", strings.Repeat("i", maxRequestIDLen+1)} {
		e = send("80-hdr.cube.test", map[string]string{"X-Cube-Request-Id": bad})
		if id := e.get(HeaderRequestID); len(id) != 25 || id[8] != '-' {
			t.Errorf("client id %q: the sandbox got %q, want a generated one", bad, id)
		}
	}
}

// rawBackend answers every request on a connection with the given raw response.
func rawBackend(t *testing.T, response string) uint16 { return rawBackendSeen(t, response, nil) }

// rawBackendSeen is rawBackend parsing requests as strictly as net/http
// does, and passing each to seen (when not nil) before it answers.
func rawBackendSeen(t *testing.T, response string, seen func(*http.Request)) uint16 {
	return rawBackendCounted(t, response, seen, new(atomic.Int64))
}

// rawBackendCounted is rawBackendSeen keeping in open the number of
// connections it has not yet finished reading.
func rawBackendCounted(t *testing.T, response string, seen func(*http.Request), open *atomic.Int64) uint16 {
	ln := testenv.ServeTCP(t, func(c net.Conn) {
		open.Add(1)
		defer open.Add(-1)
		defer c.Close()
		br := bufio.NewReader(c)
		for {
			req, err := http.ReadRequest(br)
			if err != nil {
				return
			}
			if seen != nil {
				seen(req)
			}
			io.Copy(io.Discard, req.Body)
			if _, err := io.WriteString(c, response); err != nil {
				return
			}
			if strings.Contains(response, "Connection: close") {
				return
			}
		}
	})
	return uint16(ln.Addr().(*net.TCPAddr).Port)
}

func TestResponseHeaders(t *testing.T) {
	h := newHarness(t)
	port := rawBackend(t, "HTTP/1.1 201 Created\r\nConnection: close, X-Hop\r\nX-Hop: 1\r\nKeep-Alive: timeout=5\r\n"+
		"Set-Cookie: a=1; Path=/\r\nSet-Cookie: a=2; Path=/x\r\nSet-Cookie: b=3\r\nX-End: 2\r\nServer: sandbox/1\r\nContent-Length: 2\r\n\r\nok")
	host := h.route("resp", port)
	var reused []bool
	for i := 0; i < 2; i++ {
		req := h.req("GET", host, "/", nil)
		req = req.WithContext(httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{
			GotConn: func(info httptrace.GotConnInfo) { reused = append(reused, info.Reused) },
		}))
		resp := h.do(req)
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 201 || string(body) != "ok" {
			t.Fatalf("%d %q", resp.StatusCode, body)
		}
		if resp.Header.Get("X-Hop") != "" || resp.Header.Get("Keep-Alive") != "" || resp.Header.Get("X-End") != "2" {
			t.Errorf("hop-by-hop headers leaked: %v", resp.Header)
		}
		if got := strings.Join(resp.Header.Values("Set-Cookie"), " | "); got != "a=1; Path=/ | a=2; Path=/x | b=3" {
			t.Errorf("Set-Cookie %q", got)
		}
		if resp.Header.Get("Server") != "sandbox/1" {
			t.Errorf("Server %q", resp.Header.Get("Server"))
		}
	}
	if len(reused) != 2 || !reused[1] {
		t.Errorf("the backend's Connection: close closed the client's keep-alive connection (reused=%v)", reused)
	}
}

func TestBodylessResponses(t *testing.T) {
	h := newHarness(t)
	port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/204":
			w.WriteHeader(204)
		case "/304":
			w.Header().Set("ETag", `"v1"`)
			w.WriteHeader(304)
		default:
			w.Header().Set("Content-Length", "5")
			w.Header().Set("Content-Type", "text/plain")
			if r.Method != "HEAD" {
				io.WriteString(w, "hello")
			}
		}
	}))
	host := h.route("nobody", port)
	for _, tc := range []struct {
		method, path string
		status       int
		length       string
	}{
		{"HEAD", "/", 200, "5"},
		{"GET", "/204", 204, ""},
		{"GET", "/304", 304, ""},
		{"GET", "/", 200, "5"},
	} {
		for i := 0; i < 2; i++ { // twice: the connection must stay usable
			resp := h.do(h.req(tc.method, host, tc.path, nil))
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			wantBody := ""
			if tc.method == "GET" && tc.status == 200 {
				wantBody = "hello"
			}
			if resp.StatusCode != tc.status || string(body) != wantBody {
				t.Fatalf("%s %s: %d %q", tc.method, tc.path, resp.StatusCode, body)
			}
			if tc.length != "" && fmt.Sprint(resp.ContentLength) != tc.length {
				t.Errorf("%s %s: Content-Length %d", tc.method, tc.path, resp.ContentLength)
			}
		}
	}
}

// A request body without Content-Type reaches the backend without one
// (fasthttp would add application/octet-stream).
func TestRequestContentTypeUntouched(t *testing.T) {
	h := newHarness(t)
	port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "%q", r.Header.Values("Content-Type"))
	}))
	host := h.route("ctype", port)
	for _, ct := range []string{"", "application/json", "text/plain; charset=utf-8"} {
		req := h.req("POST", host, "/", strings.NewReader(`{"a":1}`))
		want := `[]`
		if ct != "" {
			req.Header.Set("Content-Type", ct)
			want = fmt.Sprintf("[%q]", ct)
		}
		resp := h.do(req)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if string(b) != want {
			t.Errorf("client sent Content-Type %q; backend saw %s", ct, b)
		}
	}
}

// An absolute-form target reaches the sandbox in origin form, and
// Authorization exactly as the client sent it or not at all, whether the
// request is forwarded or opens a tunnel (an upgrade the backend declines
// is relayed like any answer, so the echo shows what the tunnel sent).
// Userinfo in the target, which fasthttp's Request.Write would turn into
// an Authorization header, is refused before the proxy (fasthttp since
// v1.79; TestMalformedRequestsAnswered).
func TestAbsoluteFormTarget(t *testing.T) {
	h := newHarness(t)
	port := backend(t, "127.0.0.1", echoHeaders())
	host := h.route("ui", port)
	upgrade := []string{"Connection: Upgrade", "Upgrade: websocket"}
	for _, tc := range []struct {
		name, auth, want string
		extra            []string
	}{
		{"no Authorization", "", "", nil},
		{"client's own Authorization", "Bearer app-token", "Bearer app-token", nil},
		{"upgrade", "", "", upgrade},
		{"upgrade with Authorization", "Bearer app-token", "Bearer app-token", upgrade},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lines := []string{"GET http://" + host + "/p%2Fq?a=1 HTTP/1.1", "Host: " + host}
			lines = append(lines, tc.extra...)
			if tc.auth != "" {
				lines = append(lines, "Authorization: "+tc.auth)
			}
			e := echoRawRequest(t, h.addr, lines...)
			if got := e.get("Authorization"); got != tc.want {
				t.Errorf("Authorization reached the sandbox as %q, want %q", got, tc.want)
			}
			if e.URI != "/p%2Fq?a=1" {
				t.Errorf("request URI %q, want the path and query as sent", e.URI)
			}
		})
	}
}

// An origin-form target reaches the sandbox byte for byte: a path that
// begins with "//" and holds "://" further on (a base URL ending in '/'
// joined with "/fetch?url=https://..."), which fasthttp parses as an
// absolute target, and the query of a request a signed cookie let through
// (authorize parses the query for the token parameter, and a parsed query
// went out re-encoded, "%20" as "+").
func TestOriginFormTargetByteForByte(t *testing.T) {
	signer, sign := authSigner(t, strings.Repeat("k", 32))
	h := newHarness(t, func(o *harnessOpts) { o.cfg.Signer = signer })
	port := backend(t, "127.0.0.1", echoHeaders())
	public := h.route("pub", port)
	traffic := strings.Repeat("ab", 32)
	putAuthRoute(h, "priv", traffic, port, 8080)
	cookie := "Cookie: cube_proxy_auth=" + signer.CookieValue([]byte(sign("priv", 8080, time.Hour)), traffic)
	for _, tc := range []struct {
		name, host, target, cookie string
	}{
		{"double slash and scheme in query", public, "//fetch?url=https://cdn.example/x.png", ""},
		{"double slash and scheme in path", public, "//x/a://b", ""},
		{"query of a cookie request", "8080-priv.cube.test", "/search?q=a%20b&x=%2F&y=~&z&w=a+b", cookie},
		{"double slash on a cookie request", "8080-priv.cube.test", "//fetch?url=https://cdn.example/x.png", cookie},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lines := []string{"GET " + tc.target + " HTTP/1.1", "Host: " + tc.host}
			if tc.cookie != "" {
				lines = append(lines, tc.cookie)
			}
			if e := echoRawRequest(t, h.addr, lines...); e.URI != tc.target {
				t.Errorf("sandbox got target %q, want %q", e.URI, tc.target)
			}
		})
	}
}

// A client that repeats X-Real-IP, X-Forwarded-For or X-Forwarded-Host
// must not get a copy of its own past the proxy's: a sandbox framework
// that reads the last line, or joins the lines (RFC 9110 5.3) and trusts
// the rightmost address, would take the forged one for the client's.
func TestForwardingHeadersRepeatedByClient(t *testing.T) {
	h := newHarness(t)
	port := backend(t, "127.0.0.1", echoHeaders())
	host := h.route("fwd", port)
	h.put("fwdmask", map[string]string{"HostIP": "127.0.0.1", "MaskRequestHost": "localhost:${PORT}", "80": itoa(port)})
	upgrade := []string{"Connection: Upgrade", "Upgrade: websocket"}
	for _, tc := range []struct {
		name, host, xfh string
		extra           []string
	}{
		{"plain", host, "evil.example|evil2.example", nil},
		{"upgrade", host, "evil.example|evil2.example", upgrade},
		{"masked", "80-fwdmask.cube.test", "80-fwdmask.cube.test", nil},
		{"masked upgrade", "80-fwdmask.cube.test", "80-fwdmask.cube.test", upgrade},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lines := []string{"GET / HTTP/1.1", "Host: " + tc.host,
				"X-Real-IP: 6.6.6.6", "X-Real-IP: 7.7.7.7",
				"X-Forwarded-For: 1.1.1.1", "X-Forwarded-For: ", "X-Forwarded-For: 2.2.2.2, 3.3.3.3",
				"X-Forwarded-Host: evil.example", "X-Forwarded-Host: evil2.example"}
			e := echoRawRequest(t, h.addr, append(lines, tc.extra...)...)
			for k, want := range map[string]string{
				"X-Real-Ip": "127.0.0.1",
				// As nginx's $proxy_add_x_forwarded_for: every line the
				// client sent, joined, then the address the proxy saw.
				"X-Forwarded-For":  "1.1.1.1, 2.2.2.2, 3.3.3.3, 127.0.0.1",
				"X-Forwarded-Host": tc.xfh,
			} {
				// An unmasked route passes the client's own
				// X-Forwarded-Host lines, in their order.
				if got := e.get(k); got != want {
					t.Errorf("%s reached the sandbox as %q, want %q", k, got, want)
				}
			}
		})
	}
}

// The client's X-Forwarded-For and Forwarded lines are joined in the order
// sent, as nginx joins them: behind a balancer that adds its own line, the
// element just before the proxy's is the one a sandbox trusts. fasthttp
// deletes a header (here the hop-by-hop TE, removed before the join) by
// moving the last line into its place, which put the last line first.
func TestForwardingLinesKeepTheirOrder(t *testing.T) {
	h := newHarness(t)
	port := backend(t, "127.0.0.1", echoHeaders())
	host := h.route("fwdorder", port)
	for _, tc := range []struct{ name, want string }{
		{"X-Forwarded-For", "1.1.1.1, 2.2.2.2, 3.3.3.3, 127.0.0.1"},
		{"Forwarded", "for=1.1.1.1, for=2.2.2.2, for=3.3.3.3, for=127.0.0.1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			prefix := ""
			if tc.name == "Forwarded" {
				prefix = "for="
			}
			// A valid id of the client's: no generated line after the last.
			e := echoRawRequest(t, h.addr, "GET / HTTP/1.1", "Host: "+host, HeaderRequestID+": order-id", "TE: trailers",
				tc.name+": "+prefix+"1.1.1.1", tc.name+": "+prefix+"2.2.2.2", tc.name+": "+prefix+"3.3.3.3")
			if got := e.get(tc.name); got != tc.want {
				t.Errorf("%s reached the sandbox as %q, want %q", tc.name, got, tc.want)
			}
		})
	}
}

// CGI, WSGI (werkzeug, wsgiref) and PHP servers file X_Real_IP and
// X-Real-IP under one variable (HTTP_X_REAL_IP) and join or overwrite
// them, so a client's line spelled with '_' would forge the address the
// proxy vouches for; PHP's built-in server (php -S) files X.Real.IP there
// too. nginx drops such names by default; so must the proxy, for the
// headers it sets (X_Cube_Request_Id too: the sandbox's logs would name
// another id than the answer and the access log), and leave every other
// name alone.
func TestForwardingHeaderUnderscoreAliases(t *testing.T) {
	h := newHarness(t)
	port := backend(t, "127.0.0.1", echoHeaders())
	h.put("alias", map[string]string{"HostIP": "127.0.0.1", "MaskRequestHost": "localhost:${PORT}", "80": itoa(port)})
	resp, body := authRawRequest(t, h.addr, "GET / HTTP/1.1", "Host: 80-alias.cube.test",
		"X-Forwarded-For: 1.1.1.1", "X_Forwarded_For: 6.6.6.6", "x-forwarded_for: 6.6.6.6",
		"X-Real-IP: 6.6.6.6", "X_REAL_IP: 6.6.6.6", "x_real-ip: 6.6.6.6",
		"X.Real.IP: 6.6.6.6", "X.Forwarded-For: 6.6.6.6", "X.Forwarded.Host: evil.example",
		"X_Forwarded_Host: evil.example", "X-Cube-Request-Id: client-id", "X_Cube_Request_Id: forged", "x.cube.request_id: forged",
		"X_App_Header: kept", "X.App.Header: kept", "Cookie: _ga=GA1.2; a_b=c", "X-Forwarded_Proto: https")
	if resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	var e echoed
	if err := json.Unmarshal([]byte(body), &e); err != nil {
		t.Fatal(err)
	}
	for k, v := range e.Headers {
		switch strings.NewReplacer("_", "-", ".", "-").Replace(strings.ToLower(k)) {
		case "x-real-ip", "x-forwarded-for", "x-forwarded-host", "x-cube-request-id":
			if strings.ContainsAny(k, "_.") {
				t.Errorf("%s: %q reached the sandbox", k, v)
			}
		}
	}
	for k, want := range map[string]string{
		"X-Real-Ip":         "127.0.0.1",
		"X-Forwarded-For":   "1.1.1.1, 127.0.0.1",
		"X-Forwarded-Host":  "80-alias.cube.test",
		"X-Cube-Request-Id": "client-id",
		"X_app_header":      "kept",
		"X.app.header":      "kept",
		"Cookie":            "_ga=GA1.2; a_b=c",
		"X-Forwarded_proto": "https", // not vouched for: the client may set X-Forwarded-Proto itself
	} {
		if got := e.get(k); got != want {
			t.Errorf("%s reached the sandbox as %q, want %q", k, got, want)
		}
	}
}

// On a route that does not mask Host the proxy sets no X-Forwarded-Host:
// the client's own passes as sent, and so do its spellings with '_' or
// '.', which forge nothing the proxy vouches for there.
func TestForwardedHostAliasKeptUnmasked(t *testing.T) {
	h := newHarness(t)
	port := backend(t, "127.0.0.1", echoHeaders())
	h.put("plainhost", map[string]string{"HostIP": "127.0.0.1", "80": itoa(port)})
	e := echoRawRequest(t, h.addr, "GET / HTTP/1.1", "Host: 80-plainhost.cube.test",
		"X-Forwarded-Host: front.example", "X_Forwarded_Host: app.example", "X_Real_IP: 6.6.6.6")
	for k, want := range map[string]string{
		"X-Forwarded-Host": "front.example",
		"X_forwarded_host": "app.example",
		"X_real_ip":        "",
	} {
		if got := e.get(k); got != want {
			t.Errorf("%s reached the sandbox as %q, want %q", k, got, want)
		}
	}
}

// The proxy's credential headers spelled with '_' (X_Cube_Admin_Token)
// are the real ones to a CGI, WSGI or PHP server (HTTP_X_CUBE_ADMIN_TOKEN),
// so a client's token would reach the sandbox's code under that spelling;
// PHP's built-in server (php -S) files '.' under '_' too, so
// X.Cube.Admin.Token is the same variable there. nginx drops such names by
// default; the proxy drops these, in any case and any mix of '_', '.' and
// '-', and leaves other names with '_' or '.' alone.
func TestCredentialHeaderUnderscoreAliases(t *testing.T) {
	h := newHarness(t)
	port := backend(t, "127.0.0.1", echoHeaders())
	h.put("credalias", map[string]string{"HostIP": "127.0.0.1", "80": itoa(port)})
	for _, tc := range []struct{ name, line string }{
		{"admin token", "X_Cube_Admin_Token: admin-secret"},
		{"admin token, upper case, mixed", "X-CUBE_ADMIN-TOKEN: admin-secret"},
		{"e2b traffic token", "E2b_Traffic_Access_Token: traffic-secret"},
		{"cube traffic token", "cube_traffic_access_token: traffic-secret"},
		{"cube traffic token, mixed", "Cube-Traffic_Access-Token: traffic-secret"},
		{"admin token, dots", "X.Cube.Admin.Token: admin-secret"},
		{"e2b traffic token, dots and underscores", "e2b.traffic_access-Token: traffic-secret"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := echoRawRequest(t, h.addr, "GET / HTTP/1.1", "Host: 80-credalias.cube.test", tc.line, "X_App_Token: kept", "X.App.Id: kept")
			for k, v := range e.Headers {
				switch strings.NewReplacer("_", "-", ".", "-").Replace(strings.ToLower(k)) {
				case "x-cube-admin-token", "e2b-traffic-access-token", "cube-traffic-access-token":
					t.Errorf("%s: %q reached the sandbox", k, v)
				}
			}
			if got := e.get("X_app_token"); got != "kept" {
				t.Errorf("X_App_Token reached the sandbox as %q, want %q", got, "kept")
			}
			if got := e.get("X.app.id"); got != "kept" {
				t.Errorf("X.App.Id reached the sandbox as %q, want %q", got, "kept")
			}
		})
	}
}

// scanHead decides which headers prepareRequest looks up at all: a name it
// missed (any case, any position) would skip a removal or a join.
func TestScanHead(t *testing.T) {
	for _, tc := range []struct {
		name, head string
		want       headSeen
	}{
		{"none", "Host: a\r\nUser-Agent: x\r\nAccept: */*\r\n", headSeen{}},
		{"hop in lower case", "Host: a\r\nconnection: x-hop\r\nx-hop: 1\r\n", headSeen{hop: true}},
		{"each hop", "Host: a\r\nTE: trailers\r\nTrailer: x\r\nKEEP-ALIVE: 5\r\nProxy-Authorization: b\r\n", headSeen{hop: true}},
		{"upgrade", "Host: a\r\nUpgrade: websocket\r\n", headSeen{hop: true}},
		{"cookie", "Host: a\r\ncookie: cube_proxy_auth=t\r\n", headSeen{credentials: true}},
		{"token header", "Host: a\r\nCUBE-TRAFFIC-ACCESS-TOKEN: t\r\n", headSeen{credentials: true}},
		{"forwarding, repeated", "Host: a\r\nx-real-ip: 1\r\nX-Real-IP: 2\r\nx-forwarded-for: 1\r\nX-Forwarded-For: 2\r\nX-Forwarded-For: 3\r\nX-Forwarded-Proto: https\r\nforwarded: for=h\r\n",
			headSeen{forwardedProto: true, forwardedFor: 2, forwarded: 1}},
		{"folded value", "Host: a\r\nX-Forwarded-For: 1.1.1.1,\r\n 2.2.2.2\r\n", headSeen{forwardedFor: 1}},
		{"underscore", "Host: a\r\nX_Real_IP: 6.6.6.6\r\n", headSeen{underscore: true}},
		{"dot", "Host: a\r\nX.Cube.Admin.Token: a\r\n", headSeen{underscore: true}},
		{"transfer coding", "Host: a\r\ntransfer-encoding: identity\r\n", headSeen{transferEncoding: true}},
		{"expectation", "Host: a\r\nexpect: 100-continue\r\n", headSeen{expect: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var req fasthttp.Request
			if err := req.Read(bufio.NewReader(strings.NewReader("GET / HTTP/1.1\r\n" + tc.head + "\r\n"))); err != nil {
				t.Fatal(err)
			}
			// Every header line counts, a folded value's continuation aside.
			tc.want.lines = uint16(strings.Count(tc.head, "\r\n") - strings.Count(tc.head, "\r\n "))
			if got := scanHead(&req.Header); got != tc.want {
				t.Errorf("scanHead = %+v, want %+v", got, tc.want)
			}
		})
	}
	// Every name of the table is found, in any case (the scan looks names
	// up by length).
	for _, n := range headNames {
		var req fasthttp.Request
		head := "GET / HTTP/1.1\r\nHost: a\r\n" + strings.ToUpper(n.name) + ": chunked\r\n\r\n0\r\n\r\n" // a body for the chunked one
		if err := req.Read(bufio.NewReader(strings.NewReader(head))); err != nil {
			t.Fatal(err)
		}
		if got := scanHead(&req.Header); got == (headSeen{}) {
			t.Errorf("scanHead missed %s", n.name)
		}
	}
	// A head not read from the wire has no raw copy: everything is looked up.
	var req fasthttp.Request
	req.Header.Set("X-Forwarded-For", "1.1.1.1")
	if got := scanHead(&req.Header); got != seeAll {
		t.Errorf("constructed head: %+v, want every lookup", got)
	}
}

// prepareRequest sets the forwarding headers with SetCanonical, which takes
// the name as given: each key must be the form fasthttp normalizes its name
// to, so that the sandbox gets the same bytes as through Set, and a
// client's copy (stored normalized) is the line replaced rather than a
// second one beside it.
func TestForwardingKeysCanonical(t *testing.T) {
	for _, key := range [][]byte{keyRealIP, keyForwardedFor, keyForwardedProto, keyForwardedHost, keyForwarded, keyRetcode} {
		var h fasthttp.RequestHeader
		h.Set(strings.ToLower(string(key)), "v")
		var names []string
		for k := range h.All() {
			names = append(names, string(k))
		}
		if !slices.Equal(names, []string{string(key)}) {
			t.Errorf("fasthttp stores %q as %q, want the key itself", key, names)
		}
	}
}

// Lower-case spellings of the headers prepareRequest rewrites are rewritten
// like the canonical ones (scanHead must not miss them).
func TestRequestHeadersInLowerCase(t *testing.T) {
	h := newHarness(t)
	port := backend(t, "127.0.0.1", echoHeaders())
	host := h.route("lower", port)
	e := echoRawRequest(t, h.addr, "GET /p HTTP/1.1", "host: "+host,
		"connection: x-hop", "x-hop: 1", "x-forwarded-for: 203.0.113.9", "x-real-ip: 6.6.6.6", "x-real-ip: 7.7.7.7",
		"cube-traffic-access-token: whatever", "cookie: a=1; "+auth.CookieName+"=t; b=2")
	for k, want := range map[string]string{
		"X-Hop":                     "",
		"X-Forwarded-For":           "203.0.113.9, 127.0.0.1",
		"X-Real-Ip":                 "127.0.0.1",
		"Cube-Traffic-Access-Token": "",
		"Cookie":                    "a=1; b=2",
	} {
		if got := e.get(k); got != want {
			t.Errorf("%s reached the sandbox as %q, want %q", k, got, want)
		}
	}
}

// An HTTP/1.0 client's connection handling is the proxy's business:
// fasthttp marks such a request Connection: close without the client
// sending the header, and that mark must not reach the sandbox, which
// would close the upstream connection after every answer.
func TestHTTP10ClientConnectionCloseNotForwarded(t *testing.T) {
	h := newHarness(t)
	var conns atomic.Int64
	ln := listen(t, "127.0.0.1:0")
	srv := &http.Server{Handler: echoHeaders(), ConnState: func(_ net.Conn, st http.ConnState) {
		if st == http.StateNew {
			conns.Add(1)
		}
	}}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	host := h.route("old", uint16(ln.Addr().(*net.TCPAddr).Port))
	for i := range 2 {
		c, err := net.Dial("tcp", h.addr)
		if err != nil {
			t.Fatal(err)
		}
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		fmt.Fprintf(c, "GET / HTTP/1.0\r\nHost: %s\r\n\r\n", host)
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatal(err)
		}
		var e echoed
		err = json.NewDecoder(resp.Body).Decode(&e)
		resp.Body.Close()
		c.Close()
		if err != nil {
			t.Fatal(err)
		}
		if got := e.get("Connection"); got != "" {
			t.Errorf("request %d: Connection %q reached the sandbox", i, got)
		}
	}
	if n := conns.Load(); n != 1 {
		t.Errorf("the sandbox saw %d connections for two requests, want 1 (kept alive)", n)
	}
}

// X-Forwarded-Proto is set when the client's is absent, and an empty line
// is as good as absent: the sandbox must not be left without a scheme (a
// framework would take the request for plain HTTP whatever it came over).
func TestEmptyForwardedProtoIsSet(t *testing.T) {
	h := newHarness(t)
	port := backend(t, "127.0.0.1", echoHeaders())
	host := h.route("proto", port)
	e := echoRawRequest(t, h.addr, "GET / HTTP/1.1", "Host: "+host, "X-Forwarded-Proto: ")
	if got := e.get("X-Forwarded-Proto"); got != "http" {
		t.Errorf("X-Forwarded-Proto reached the sandbox as %q, want %q", got, "http")
	}
}

// FuzzPrepareRequest checks what reaches a sandbox for any head fasthttp
// takes: the request prepareRequest leaves, as Request.Write sends it and
// the sandbox parses it, carries no hop-by-hop header (but the upgrade's
// own), no header its Connection named (but those connectionProof keeps),
// no proxy credential, exactly one
// X-Real-IP and X-Forwarded-For (the proxy's) and no '_' alias of them,
// one Host (the masked one, the client's in X-Forwarded-Host), the
// client's Content-Length, and no line whose name is no field name ("X
// Real IP"); and acceptsEventStream agrees with the RFC's reading of a
// well-formed Accept (acceptsEventStreamRef), q=0 in every spelling.
func FuzzPrepareRequest(f *testing.F) {
	for _, head := range []string{
		"User-Agent: x\r\nAccept: */*\r\n",
		"Connection: keep-alive, X-Hop\r\nX-Hop: 1\r\nConnection: x-other\r\nX-Other: 2\r\n",
		"Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n",
		"connection: upgrade, te\r\nupgrade: h2c\r\nTE: trailers\r\nKeep-Alive: 5\r\nProxy-Connection: x\r\n",
		"E2b-Traffic-Access-Token: t\r\ncube-traffic-access-token: u\r\n",
		"X-Cube-Admin-Token: a\r\nx-cube-admin-token: b\r\n",
		"Cookie: a=1; cube_proxy_auth=t; b=2\r\nCookie: cube_proxy_auth=u\r\n",
		"X-Real-IP: 6.6.6.6\r\nx-real-ip: 7.7.7.7\r\nX-Forwarded-For: 1.1.1.1\r\nX-Forwarded-For: 2.2.2.2\r\n",
		"X_Real_IP: 6.6.6.6\r\nX-Forwarded_For: 1.1.1.1\r\n",
		"X_Cube_Admin_Token: a\r\nE2b_Traffic-Access_Token: t\r\ncube_traffic_access_token: u\r\n",
		"X.Cube.Admin.Token: a\r\nE2b.Traffic_Access-Token: t\r\n",
		"X-Forwarded-For: 1.1.1.1,\r\n 2.2.2.2\r\nX-Forwarded-Proto:\r\n",
		"Transfer-Encoding: chunked\r\nContent-Length: 3\r\n",
		"X Real IP: 6.6.6.6\r\nT 0: x\r\nT 0: y\r\n",
		"Forwarded: for=6.6.6.6\r\nforwarded: for=\"[2001:db8::6\r\n",
		"Expect: 100-continue\r\n",
		"Expect: 100-continue\r\nContent-Length: 0\r\n",
		"Expect: 100-Continue\r\nTransfer-Encoding: chunked\r\nConnection: expect\r\n",
		"Connection: Host, content-length, X-Cube-Request-Id, X-Hop\r\nX-Hop: 1\r\nContent-Length: 2\r\n",
		"Connection: X-Real-IP, X-Forwarded-For, forwarded\r\nForwarded: for=6.6.6.6\r\n",
		"Connection: x-forwarded-for, Forwarded\r\nX-Forwarded-For: 6.6.6.6\r\nForwarded: for=6.6.6.6\r\nX-Forwarded-For: 7.7.7.7\r\n",
		"Expect: 100-continue\r\nExpect: x\r\nContent-Length: 3\r\n",
		"X-Cube-Request-Id: a\r\nx-cube-request-id: b c\r\nX-Cube-Request-Id: \r\n",
		"Accept: application/json\r\nAccept: Text/Event-Stream;q=1\r\n",
		// Weights: q=0 in its spellings refuses the stream, any other
		// accepts it; the first q counts.
		"Accept: text/event-stream;q=0, application/json\r\n",
		"Accept: text/event-stream; charset=utf-8; Q=0.000\r\n",
		"Accept: text/event-stream ;q=0.\r\nAccept: */*;q=0.1\r\n",
		"Accept: text/event-stream;q=0.001\r\n",
		"Accept: text/event-stream;q=0;q=1, text/event-stream;q=1.0\r\n",
		"Accept: text/event-stream;q=1;q=0\r\n",
		"Connection: content-length, host\r\nContent-Length: 7\r\n",
		"TE: trailers\r\nAccept: a\r\nX-Other: 1\r\nAccept: b\r\nAccept: c\r\n",
	} {
		f.Add(head)
	}
	p, err := New(Config{}, nil)
	if err != nil {
		f.Fatal(err)
	}
	parser := routing.NewParser(routing.ParserConfig{})
	var target routing.Target
	if err := parser.Parse(&target, []byte("50005-box.cube.test"), nil); err != nil {
		f.Fatal(err)
	}
	r := &routing.Route{ID: "box", MaskRequestHost: "localhost:${PORT}"}
	addr := &net.TCPAddr{IP: net.IPv4(192, 0, 2, 1), Port: 40000}
	f.Fuzz(func(t *testing.T, head string) {
		raw := "GET / HTTP/1.1\r\nHost: 50005-box.cube.test\r\n" + head + "\r\n"
		var ctx fasthttp.RequestCtx
		ctx.Init(&fasthttp.Request{}, addr, nil)
		if err := ctx.Request.Header.Read(bufio.NewReader(strings.NewReader(raw))); err != nil {
			return // the client gets fasthttp's 400
		}
		h := &ctx.Request.Header
		// As serve does first: a Host that is no longer this target (a
		// folded line joined it) gets a 400 before prepareRequest runs.
		var seen routing.Target
		if parser.Parse(&seen, h.Host(), h) != nil || seen.Port != target.Port || string(seen.ID()) != string(target.ID()) {
			return
		}
		if want, ok := acceptsEventStreamRef(h.PeekAll("Accept")); ok && acceptsEventStream(h) != want {
			t.Errorf("acceptsEventStream = %v for Accept %q, want %v", !want, h.PeekAll("Accept"), want)
		}
		length := h.ContentLength()
		upgrade := upgradeRequested(h)
		named := map[string]bool{}
		for _, v := range h.PeekAll("Connection") {
			forEachToken(v, func(tok []byte) { named[strings.ToLower(string(tok))] = true })
		}
		if upgrade {
			delete(named, "upgrade")
		}
		sentLines, ordered := repeatedLines(headerLines(h.RawHeaders()), h.PeekAll)
		if perr := p.prepareRequest(&ctx, scanHead(&ctx.Request.Header), r, &target, upgrade); perr != nil {
			return
		}
		var sent strings.Builder
		bw := bufio.NewWriter(&sent)
		if err := ctx.Request.Header.Write(bw); err != nil {
			t.Fatalf("writing the prepared head: %v", err)
		}
		bw.Flush()
		var got fasthttp.RequestHeader
		if err := got.Read(bufio.NewReader(strings.NewReader(sent.String()))); err != nil {
			t.Fatalf("the sandbox cannot parse the head sent to it: %v\n%q", err, sent.String())
		}
		lines := map[string]int{}
		for k, v := range got.All() {
			name := strings.ToLower(string(k))
			lines[name]++
			if strings.ContainsAny(name, " \t") {
				t.Errorf("%q, no field name, reached the sandbox\n%q", k, sent.String())
			}
			for _, hop := range hopHeaders {
				if strings.EqualFold(name, hop) && !(upgrade && (name == "upgrade" || name == "connection" && string(v) == "Upgrade")) {
					t.Errorf("hop-by-hop %s: %q reached the sandbox\n%q", k, v, sent.String())
				}
			}
			// The proxy sets its forwarding headers after the client's
			// named ones are gone: those reaching the sandbox are its own.
			proxys := name == "x-real-ip" || name == "x-forwarded-for" || name == "x-forwarded-proto" ||
				name == "x-forwarded-host" || name == "forwarded"
			if named[name] && !connectionProof(k) && !proxys {
				t.Errorf("%s, named in Connection, reached the sandbox\n%q", k, sent.String())
			}
			if name == strings.ToLower(auth.HeaderE2BTrafficToken) || name == strings.ToLower(auth.HeaderCubeTrafficToken) ||
				name == strings.ToLower(auth.HeaderAdminToken) {
				t.Errorf("proxy token %s reached the sandbox\n%q", k, sent.String())
			}
			if name == "cookie" {
				// Read from the bytes sent, not v: All re-serializes
				// fasthttp's parsed cookies and drops an empty name, so
				// the nameless "=cube_proxy_auth=" the client sent (and
				// the sandbox gets) read as a cookie of the proxy's name.
				for _, l := range strings.Split(sent.String(), "\r\n") {
					if n, raw, ok := strings.Cut(l, ":"); ok && strings.EqualFold(n, "cookie") {
						for range auth.CookieValues([]byte(strings.TrimLeft(raw, " \t")), auth.CookieName) {
							t.Errorf("the proxy's cookie reached the sandbox: %q", l)
						}
					}
				}
			}
			if strings.ContainsAny(name, "_.") && (underscoreAlias(k, "x-real-ip") || underscoreAlias(k, "x-forwarded-for") || underscoreAlias(k, "x-forwarded-host") || credentialAlias(k)) {
				t.Errorf("alias %s reached the sandbox\n%q", k, sent.String())
			}
		}
		// Content-Length frames the body: no Connection option removes it.
		if length >= 0 && got.ContentLength() != length {
			t.Errorf("Content-Length %d reached the sandbox as %d\n%q", length, got.ContentLength(), sent.String())
		}
		if lines["x-cube-request-id"] > 1 {
			t.Errorf("%d request id lines reached the sandbox\n%q", lines["x-cube-request-id"], sent.String())
		}
		for _, name := range []string{"x-real-ip", "x-forwarded-for", "x-forwarded-host"} {
			if lines[name] != 1 {
				t.Errorf("%d lines of %s reached the sandbox\n%q", lines[name], name, sent.String())
			}
		}
		if v := got.Peek("X-Real-IP"); string(v) != "192.0.2.1" {
			t.Errorf("X-Real-IP = %q", v)
		}
		if v := got.Peek("X-Forwarded-For"); !strings.HasSuffix(string(v), "192.0.2.1") {
			t.Errorf("X-Forwarded-For = %q", v)
		}
		// A forwarding field the client's Connection named is gone before
		// the proxy adds its element (RFC 9110 §7.6.1): the sandbox gets
		// that element alone, none of the client's claims.
		if v := got.Peek("X-Forwarded-For"); named["x-forwarded-for"] && string(v) != "192.0.2.1" {
			t.Errorf("X-Forwarded-For, named in Connection, reached the sandbox as %q\n%q", v, sent.String())
		}
		if fw := got.PeekAll("Forwarded"); named["forwarded"] && len(fw) > 0 && string(fw[0]) != "for=192.0.2.1" {
			t.Errorf("Forwarded, named in Connection, reached the sandbox as %q\n%q", fw, sent.String())
		}
		// A client's Forwarded ends with the proxy's element, outside any
		// quoted string of the client's.
		if fw := got.PeekAll("Forwarded"); len(fw) > 1 || len(fw) == 1 && (!bytes.HasSuffix(fw[0], []byte("for=192.0.2.1")) ||
			openQuote(fw[0][:len(fw[0])-len("for=192.0.2.1")])) {
			t.Errorf("Forwarded reached the sandbox as %q\n%q", fw, sent.String())
		}
		// The route masks Host: the sandbox sees the template with the
		// port, and the client's Host in X-Forwarded-Host, whatever the
		// client sent besides.
		if v := got.Host(); string(v) != "localhost:50005" || lines["host"] != 1 {
			t.Errorf("%d Host lines, Host %q reached the sandbox\n%q", lines["host"], v, sent.String())
		}
		if v := got.Peek("X-Forwarded-Host"); string(v) != "50005-box.cube.test" {
			t.Errorf("X-Forwarded-Host = %q\n%q", v, sent.String())
		}
		// A field's lines keep their order (RFC 9110 §5.3), whatever
		// lines the proxy deleted beside them, when lineOrder can hold
		// them all; a field that lost or gained lines is the proxy's.
		if ordered {
			for name, vals := range sentLines {
				// Whitespace at a value's ends is no part of it (RFC 9110
				// §5.5): fasthttp keeps the space an empty obs-fold line
				// leaves at the end of the client's value ("0:0\n \r\n"
				// reads "0 "), and drops it from the line sent on.
				if gv := got.PeekAll(name); len(gv) == len(vals) && !slices.EqualFunc(gv, vals, func(a []byte, b string) bool { return string(a) == strings.Trim(b, " \t") }) {
					t.Errorf("%s lines %q reached the sandbox as %q\n%q", name, vals, gv, sent.String())
				}
			}
		}
	})
}

// repeatedLines returns the lines of each field a head holds more than
// once (its lines all, peekAll its lines of a name) that the proxy neither
// sets nor keeps apart (special), and whether they all fit a lineOrder
// (its names, lines and bytes).
func repeatedLines(all iter.Seq2[[]byte, []byte], peekAll func(string) [][]byte) (map[string][]string, bool) {
	out := map[string][]string{}
	var o lineOrder
	lines, size := 0, 0
	for name := range all {
		key := strings.ToLower(string(name))
		if _, done := out[key]; done || special(name) || strings.HasPrefix(key, "x-forwarded-") || key == "x-real-ip" {
			continue
		}
		vals := peekAll(string(name))
		if len(vals) < 2 {
			continue
		}
		for _, v := range vals {
			out[key] = append(out[key], string(v))
			size += len(v)
		}
		lines += len(vals)
		size += len(name)
	}
	return out, len(out) <= len(o.names) && lines <= len(o.vals) && size <= len(o.space)
}

// acceptElem is one well-formed Accept element (RFC 9110 §12.5.1): a
// media range and its parameters, each token=token.
var acceptElem = regexp.MustCompile("^([!#$%&'*+.^_`|~0-9A-Za-z-]+)/([!#$%&'*+.^_`|~0-9A-Za-z-]+)((?:[ \t]*;[ \t]*[!#$%&'*+.^_`|~0-9A-Za-z-]+=[!#$%&'*+.^_`|~0-9A-Za-z-]+)*)[ \t]*$")

// qvalue is a weight as RFC 9110 §12.4.2 spells it.
var qvalue = regexp.MustCompile(`^(?:0(?:\.[0-9]{0,3})?|1(?:\.0{0,3})?)$`)

// acceptsEventStreamRef is acceptsEventStream as the RFC reads, for Accept
// lines whose every element is well formed with a valid weight (ok false
// otherwise): some element is text/event-stream, in any case, and its
// first q parameter, if any, is not 0.
func acceptsEventStreamRef(lines [][]byte) (accepts, ok bool) {
	for _, line := range lines {
		for elem := range strings.SplitSeq(string(line), ",") {
			elem = strings.Trim(elem, " \t")
			if elem == "" {
				continue
			}
			m := acceptElem.FindStringSubmatch(elem)
			if m == nil {
				return false, false
			}
			weight := ""
			for param := range strings.SplitSeq(m[3], ";") {
				name, v, _ := strings.Cut(strings.Trim(param, " \t"), "=")
				if strings.EqualFold(name, "q") {
					if !qvalue.MatchString(v) {
						return false, false
					}
					if weight == "" {
						weight = v
					}
				}
			}
			zero := weight != "" && strings.Trim(weight, "0.") == ""
			if strings.EqualFold(m[1], "text") && strings.EqualFold(m[2], "event-stream") && !zero {
				accepts = true
			}
		}
	}
	return accepts, true
}

// A hop-by-hop header whose first line is empty is still hop-by-hop: its
// later lines (a Proxy-Authorization, an Upgrade on a plain request) must
// not reach the other side, and neither may a header named on a later
// Connection line of a response.
func TestRemoveHopEmptyAndRepeatedLines(t *testing.T) {
	for _, tc := range []struct {
		name, head string
		gone       []string
	}{
		{"empty upgrade first", "Upgrade:\r\nUpgrade: websocket\r\n", []string{"Upgrade"}},
		{"empty proxy credential first", "Proxy-Authorization:\r\nProxy-Authorization: Basic eDp5\r\n", []string{"Proxy-Authorization"}},
		{"empty connection first", "Connection:\r\nConnection: X-Hop\r\nX-Hop: 1\r\n", []string{"Connection", "X-Hop"}},
		{"empty te and keep-alive", "TE:\r\nKeep-Alive:\r\nProxy-Connection:\r\n", []string{"Te", "Keep-Alive", "Proxy-Connection"}},
		{"second connection line", "Connection: keep-alive\r\nConnection: X-Secret\r\nX-Secret: 1\r\n", []string{"Connection", "X-Secret"}},
		// The lines of a repeated field, looked up to keep their order,
		// took the place of the Connection lines being read, and the
		// option they named stayed.
		{"connection option beside a repeated field", "Connection: X-Secret\r\nX-Secret: 1\r\nLink: <a>\r\nLink: <b>\r\n", []string{"Connection", "X-Secret"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var req fasthttp.RequestHeader
			if err := req.Read(bufio.NewReader(strings.NewReader("GET / HTTP/1.1\r\nHost: a\r\n" + tc.head + "\r\n"))); err != nil {
				t.Fatal(err)
			}
			removeHopRequest(&req, false)
			var resp fasthttp.ResponseHeader
			if err := resp.Read(bufio.NewReader(strings.NewReader("HTTP/1.1 200 OK\r\nContent-Length: 0\r\n" + tc.head + "\r\n"))); err != nil {
				t.Fatal(err)
			}
			removeHopResponse(&resp, false)
			for _, name := range tc.gone {
				if n := len(req.PeekAll(name)); n > 0 {
					t.Errorf("request: %d lines of %s left: %q", n, name, req.Header())
				}
				if n := len(resp.PeekAll(name)); n > 0 {
					t.Errorf("response: %d lines of %s left: %q", n, name, resp.Header())
				}
			}
		})
	}
}

// Each header a Connection line names costs a pass over every header to
// remove it: a 16 KiB head of thousands of options over thousands of headers
// cost about 10 ms of CPU, 140 times a plain request, so a client (or a
// sandbox's answers) could keep the proxy's cores busy at a trickle of
// bandwidth. Up to maxConnectionOptions are honoured; more are refused,
// a request with 400 bad_request before anything reaches the sandbox, an
// answer with 502 upstream_bad_response.
func TestConnectionOptionsBounded(t *testing.T) {
	options := func(n int) string {
		names := make([]string, n)
		for i := range names {
			names[i] = fmt.Sprintf("X-Opt-%d", i)
		}
		// An empty element (",,") is no option.
		return "Connection: keep-alive,," + strings.Join(names[1:], ", ")
	}
	h := newHarness(t)
	var hits atomic.Int64
	port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		echoHeaders().ServeHTTP(w, r)
	}))
	host := h.route("conn-opts", port)

	// Not authRawRequest: its Connection: close would be one option more.
	resp, body := rawRequest(t, h.addr, "GET / HTTP/1.1\r\nHost: "+host+"\r\n"+options(maxConnectionOptions)+"\r\nX-Opt-1: gone\r\nX-Kept: 1\r\n\r\n")
	var e echoed
	if resp.StatusCode != 200 || json.Unmarshal([]byte(body), &e) != nil {
		t.Fatalf("%d options: %d %s, want 200", maxConnectionOptions, resp.StatusCode, body)
	}
	if e.get("X-Opt-1") != "" || e.get("X-Kept") != "1" {
		t.Errorf("%d options: named header not removed, or another one lost: %v", maxConnectionOptions, e.Headers)
	}
	before := hits.Load()
	for _, lines := range [][]string{
		{options(maxConnectionOptions + 1)},
		// Options on several lines count together.
		{options(maxConnectionOptions), "Connection: X-One-More"},
	} {
		resp, body := rawRequest(t, h.addr, "GET / HTTP/1.1\r\nHost: "+host+"\r\n"+strings.Join(lines, "\r\n")+"\r\n\r\n")
		var pe struct{ Code string }
		if resp.StatusCode != 400 || json.Unmarshal([]byte(body), &pe) != nil || pe.Code != CodeBadRequest {
			t.Errorf("%d options: %d %s, want 400 %s", maxConnectionOptions+1, resp.StatusCode, body, CodeBadRequest)
		}
	}
	if n := hits.Load() - before; n != 0 {
		t.Errorf("refused requests reached the sandbox %d times", n)
	}

	for _, tc := range []struct {
		n      int
		status int
	}{{maxConnectionOptions, 200}, {maxConnectionOptions + 1, 502}} {
		port := rawBackend(t, "HTTP/1.1 200 OK\r\n"+options(tc.n)+"\r\nX-Opt-1: gone\r\nContent-Length: 2\r\n\r\nok")
		host := h.route(fmt.Sprintf("conn-opts-resp-%d", tc.n), port)
		status, body, hdr := h.get(host, "/")
		if status != tc.status {
			t.Errorf("answer with %d options: %d %s, want %d", tc.n, status, body, tc.status)
		}
		if status == 502 && !strings.Contains(body, CodeUpstreamBadHeader) {
			t.Errorf("answer with %d options: %s, want code %s", tc.n, body, CodeUpstreamBadHeader)
		}
		if status == 200 && hdr.Get("X-Opt-1") != "" {
			t.Errorf("answer with %d options: named header X-Opt-1 reached the client", tc.n)
		}
	}
}

// One request id per exchange: the sandbox gets exactly the id the client
// gets back, on one line, whatever lines the client sent (a second one
// could carry what the first would have been refused for), and the client
// gets that id alone, whatever lines of the header the sandbox's answer
// carried (an app echoing the ids it got), on a plain answer and on a
// detached event stream alike.
func TestRequestIDIsOneLine(t *testing.T) {
	h := newHarness(t)
	port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for _, v := range r.Header.Values(HeaderRequestID) {
			w.Header().Add(HeaderRequestID, v)
		}
		w.Header().Add(HeaderRequestID, "sandbox-own")
		if r.URL.Path == "/sse" {
			w.Header().Set("Content-Type", "text/event-stream")
		}
		json.NewEncoder(w).Encode(map[string]any{"headers": r.Header})
	}))
	host := h.route("rid", port)
	for _, tc := range []struct {
		name   string
		path   string
		lines  []string
		wantID string // "" for a generated one
	}{
		{"valid then invalid", "/", []string{"client-id", "two words"}, "client-id"},
		{"valid twice, different", "/", []string{"client-id", "other-id"}, "client-id"},
		// fasthttp deletes a header by moving the last line into its
		// place: the TE line going first would put other-id first.
		{"valid twice, behind a hop-by-hop header", "/", []string{"TE-FIRST", "client-id", "other-id"}, "client-id"},
		{"invalid then valid", "/", []string{"two words", "client-id"}, ""},
		{"one valid", "/", []string{"client-id"}, "client-id"},
		{"none", "/", nil, ""},
		{"event stream, valid then invalid", "/sse", []string{"client-id", "two words"}, "client-id"},
		{"event stream, none", "/sse", nil, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lines := []string{"GET " + tc.path + " HTTP/1.1", "Host: " + host}
			for _, v := range tc.lines {
				if v == "TE-FIRST" {
					lines = append(lines, "TE: trailers")
					continue
				}
				lines = append(lines, HeaderRequestID+": "+v)
			}
			resp, body := authRawRequest(t, h.addr, lines...)
			if resp.StatusCode != 200 {
				t.Fatalf("status %d: %s", resp.StatusCode, body)
			}
			var e echoed
			if err := json.Unmarshal([]byte(body), &e); err != nil {
				t.Fatalf("%v: %q", err, body)
			}
			got := resp.Header.Values(HeaderRequestID)
			sent := e.Headers[HeaderRequestID]
			if len(got) != 1 || len(sent) != 1 || got[0] != sent[0] {
				t.Fatalf("client got %q, sandbox got %q: want one and the same id", got, sent)
			}
			if tc.wantID != "" && got[0] != tc.wantID {
				t.Errorf("id %q, want the client's %q", got[0], tc.wantID)
			}
			if tc.wantID == "" && (len(got[0]) != 25 || got[0][8] != '-') {
				t.Errorf("id %q, want a generated one", got[0])
			}
		})
	}
}

// A weight of 0 says the client does not take the type (RFC 9110
// §12.4.2); any other weight, or none, takes it.
func TestAcceptsEventStreamWeights(t *testing.T) {
	for _, tc := range []struct {
		accept string
		want   bool
	}{
		{"text/event-stream", true},
		{"TEXT/EVENT-STREAM", true},
		{"text/event-stream;q=1", true},
		{"text/event-stream; q=0.5", true},
		{"text/event-stream;q=0.001", true},
		{"text/event-stream;charset=utf-8;q=0.1", true},
		{"text/event-stream;q=0", false},
		{"text/event-stream; Q=0", false},
		{"text/event-stream ;q=0.", false},
		{"text/event-stream;q=0.000", false},
		{"text/event-stream;charset=utf-8; q=0.00", false},
		{"text/event-stream;q=0, application/json", false},
		{"text/event-stream;q=0, text/event-stream", true},
		{"text/event-stream;q=", true},       // no weight given
		{"text/event-stream;q=0.0001", true}, // not a qvalue: not a refusal either
		// Neither are these: RFC 9110's grammar has one leading digit.
		{"text/event-stream;q=00", true},
		{"text/event-stream;q=000", true},
		{"text/event-stream;q=00.0", true},
		{"text/event-stream;q=0x", true},
		{"text/event-stream;q=0.0x", true},
		{"text/event-stream;q=-0", true},
		{"text/event-streamx", false},
		{"application/json", false},
	} {
		var h fasthttp.RequestHeader
		h.Set("Accept", tc.accept)
		if got := acceptsEventStream(&h); got != tc.want {
			t.Errorf("Accept %q: %v, want %v", tc.accept, got, tc.want)
		}
	}
}

// A Connection option names a field for this hop only (RFC 9110 7.6.1),
// but Host, Content-Length and the request id are not the client's to
// take off the request the proxy sends: Host routes it and is the
// sandbox's (and a masked route's X-Forwarded-Host), Content-Length frames
// the body, and the id is the one the client and the access log get. A
// client listing them got 400 "malformed request body" for a GET (the
// request could not be written without Host), its POST refused, or a
// sandbox that saw no id. Go's ReverseProxy keeps the first two (they are
// no header fields there) and nginx ignores Connection options. Other
// options are still removed.
func TestConnectionOptionsSpareHostLengthAndID(t *testing.T) {
	h := newHarness(t)
	port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		out := map[string]any{"host": r.Host, "headers": r.Header, "uri": string(body)}
		json.NewEncoder(w).Encode(out)
	}))
	host := h.route("connopt", port)
	h.put("connmask", map[string]string{"HostIP": "127.0.0.1", "MaskRequestHost": "localhost:${PORT}", "80": itoa(port)})
	upgrade := []string{"Upgrade: websocket"}
	for _, tc := range []struct {
		name, host, conn string
		extra            []string
		body             string
		wantHost, xfh    string
	}{
		{"host", host, "Host", nil, "", host, ""},
		{"host and a hop field", host, "Host, X-Hop", []string{"X-Hop: 1"}, "", host, ""},
		{"content length", host, "Content-Length", nil, "hello", host, ""},
		{"request id", host, "X-Cube-Request-Id", []string{"X-Cube-Request-Id: client-id"}, "", host, ""},
		{"generated request id", host, "x-cube-request-id", nil, "", host, ""},
		{"masked host", "80-connmask.cube.test", "Host", nil, "", "localhost:80", "80-connmask.cube.test"},
		{"upgrade without the sandbox's 101", host, "Upgrade, Host, X-Cube-Request-Id", upgrade, "", host, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			method := "GET"
			lines := []string{"", "Host: " + tc.host, "Connection: " + tc.conn}
			lines = append(lines, tc.extra...)
			if tc.body != "" {
				method = "POST"
				lines = append(lines, "Content-Length: "+itoa(uint16(len(tc.body))))
			}
			lines[0] = method + " / HTTP/1.1"
			raw := strings.Join(lines, "\r\n") + "\r\n\r\n" + tc.body
			c, err := net.Dial("tcp", h.addr)
			if err != nil {
				t.Fatal(err)
			}
			resp, body := rawExchange(t, c, h.addr, raw)
			if resp.StatusCode != 200 {
				t.Fatalf("status %d: %s", resp.StatusCode, body)
			}
			var e echoed
			if err := json.Unmarshal([]byte(body), &e); err != nil {
				t.Fatalf("%v: %q", err, body)
			}
			if e.Host != tc.wantHost || e.get("X-Forwarded-Host") != tc.xfh {
				t.Errorf("sandbox saw Host %q, X-Forwarded-Host %q; want %q, %q", e.Host, e.get("X-Forwarded-Host"), tc.wantHost, tc.xfh)
			}
			if e.URI != tc.body {
				t.Errorf("sandbox got the body %q, want %q", e.URI, tc.body)
			}
			if got, sent := resp.Header.Get(HeaderRequestID), e.get(HeaderRequestID); got == "" || sent != got {
				t.Errorf("client got id %q, sandbox %q: want one and the same", got, sent)
			}
			if e.get("X-Hop") != "" {
				t.Errorf("X-Hop, a Connection option, reached the sandbox")
			}
		})
	}
}

// A field sent on several lines keeps their order through the proxy, both
// ways, whatever lines the proxy deletes beside them (RFC 9110 §5.3: a
// proxy must not reorder them). fasthttp deletes a line by moving the
// head's last line into its place, so a hop-by-hop or credential line
// ahead of a repeated field's lines reordered them.
func TestRepeatedFieldLinesKeepTheirOrder(t *testing.T) {
	h := newHarness(t)
	port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// A head written by hand, as Node writes one: Keep-Alive
		// (hop-by-hop, on every Node answer) first, the last challenge
		// last (Go's own writer would end with Date).
		body, _ := json.Marshal(map[string]any{"headers": r.Header})
		conn, bw, err := w.(http.Hijacker).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		// Two repeated fields: putting one back must not move the other's.
		fmt.Fprintf(bw, "HTTP/1.1 200 OK\r\nKeep-Alive: timeout=5\r\nContent-Length: %d\r\nWWW-Authenticate: Basic\r\n"+
			"X-Other: 1\r\nWWW-Authenticate: Bearer\r\nX-Other: 2\r\nWWW-Authenticate: Digest\r\n\r\n%s", len(body), body)
		bw.Flush()
	}))
	host := h.route("lineorder", port)
	for _, tc := range []struct {
		name   string
		before string // the line the proxy deletes, ahead of the repeated ones
	}{
		{"Connection keep-alive", "Connection: keep-alive"},
		{"TE", "TE: trailers"},
		{"traffic token", "e2b-traffic-access-token: x"},
		{"underscore alias", "X_Real_IP: 6.6.6.6"},
		// Headers the proxy sets, sent twice: the client's lines go.
		{"X-Real-IP twice", "X-Real-IP: 6.6.6.6\r\nX-Real-IP: 7.7.7.7"},
		{"X-Forwarded-For twice", "X-Forwarded-For: 1.1.1.1\r\nX-Forwarded-For: 2.2.2.2"},
		{"Forwarded twice", "Forwarded: for=1.1.1.1\r\nForwarded: for=2.2.2.2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// The client's own id: no generated line after the last Accept.
			resp, e := echoRawExchange(t, h.addr, "GET / HTTP/1.1", "Host: "+host, HeaderRequestID+": lineorder-id", tc.before,
				"Accept: a", "X-Other: 1", "Accept: b", "X-Other: 2", "Accept: c")
			if got := e.get("Accept"); got != "a|b|c" {
				t.Errorf("Accept lines reached the sandbox as %q, want a|b|c", got)
			}
			if got := e.get("X-Other"); got != "1|2" {
				t.Errorf("X-Other lines reached the sandbox as %q, want 1|2", got)
			}
			if got := strings.Join(resp.Header["Www-Authenticate"], "|"); got != "Basic|Bearer|Digest" {
				t.Errorf("WWW-Authenticate lines reached the client as %q, want Basic|Bearer|Digest", got)
			}
			if got := strings.Join(resp.Header["X-Other"], "|"); got != "1|2" {
				t.Errorf("X-Other lines reached the client as %q, want 1|2", got)
			}
			if got := resp.Header.Get("Keep-Alive"); got != "" {
				t.Errorf("Keep-Alive %q reached the client", got)
			}
		})
	}
}

// An HTTP/1.0 client gets a chunked answer without its Transfer-Encoding
// line (no coding means anything to it), and the lines of a repeated field
// in the sandbox's order: removing that line moved the head's last line
// into its place, after the order of the lines was restored.
func TestAnswerLinesKeepTheirOrderForHTTP10(t *testing.T) {
	h := newHarness(t)
	// As Node writes a chunked answer: Keep-Alive (hop-by-hop) ahead of
	// the challenges, Transfer-Encoding after them.
	port := rawBackend(t, "HTTP/1.1 200 OK\r\nKeep-Alive: timeout=5\r\nWWW-Authenticate: Basic\r\nX-Other: 1\r\n"+
		"WWW-Authenticate: Bearer\r\nWWW-Authenticate: Digest\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n")
	host := h.route("order10", port)
	for _, method := range []string{"GET", "HEAD"} {
		t.Run(method, func(t *testing.T) {
			c := dialRaw(t, h.addr)
			fmt.Fprintf(c, "%s / HTTP/1.0\r\nHost: %s\r\n\r\n", method, host)
			resp, err := http.ReadResponse(bufio.NewReader(c), &http.Request{Method: method})
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if got := strings.Join(resp.Header["Www-Authenticate"], "|"); got != "Basic|Bearer|Digest" {
				t.Errorf("WWW-Authenticate lines reached the client as %q, want Basic|Bearer|Digest", got)
			}
			if te := resp.Header.Get("Transfer-Encoding"); te != "" || len(resp.TransferEncoding) > 0 {
				t.Errorf("Transfer-Encoding %q%q reached an HTTP/1.0 client", te, resp.TransferEncoding)
			}
			if want := map[string]string{"GET": "ok", "HEAD": ""}[method]; string(body) != want {
				t.Errorf("body %q, want %q", body, want)
			}
		})
	}
}

// TestSandboxRequestIDLineKeepsOrder: the proxy puts its request id over a
// sandbox's own X-Cube-Request-Id line. Deleting that line would move the
// head's last line into its place (fasthttp's swap delete) and reorder a
// repeated field around it; the client must get one id line, the request's,
// and the other lines in the sandbox's order.
func TestSandboxRequestIDLineKeepsOrder(t *testing.T) {
	for _, tc := range []struct {
		name string
		ids  string // the sandbox's id lines, first in its head
	}{
		{"one line", HeaderRequestID + ": sandbox-1\r\n"},
		{"lower case", "x-cube-request-id: sandbox-1\r\n"},
		{"two lines", HeaderRequestID + ": sandbox-1\r\nX-Other: 0\r\n" + HeaderRequestID + ": sandbox-2\r\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				conn, bw, err := w.(http.Hijacker).Hijack()
				if err != nil {
					return
				}
				defer conn.Close()
				fmt.Fprintf(bw, "HTTP/1.1 200 OK\r\n%sContent-Length: 2\r\nWWW-Authenticate: Basic\r\n"+
					"X-Other: 1\r\nWWW-Authenticate: Bearer\r\nWWW-Authenticate: Digest\r\n\r\n{}", tc.ids)
				bw.Flush()
			}))
			host := h.route("respid", port)
			resp, _ := authRawRequest(t, h.addr, "GET / HTTP/1.1", "Host: "+host, HeaderRequestID+": client-id")
			if got := strings.Join(resp.Header["Www-Authenticate"], "|"); got != "Basic|Bearer|Digest" {
				t.Errorf("WWW-Authenticate lines reached the client as %q, want Basic|Bearer|Digest", got)
			}
			if got := strings.Join(resp.Header[HeaderRequestID], "|"); got != "client-id" {
				t.Errorf("request id lines %q, want the client's one", got)
			}
		})
	}
}
