package proxy

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/routing"
)

func TestHTTPSAuthority(t *testing.T) {
	for _, tc := range []struct{ host, port, want string }{
		{"50005-abc.cube.test", "", "50005-abc.cube.test"},
		{"50005-abc.cube.test:8081", "", "50005-abc.cube.test"},
		{"50005-abc.cube.test:8081", "8443", "50005-abc.cube.test:8443"},
		{"10.0.0.1:80", "8443", "10.0.0.1:8443"},
		{"[2001:db8::1]:8081", "8443", "[2001:db8::1]:8443"},
		{"[2001:db8::1]:8081", "", "[2001:db8::1]"},
		{"[2001:db8::1]", "8443", "[2001:db8::1]:8443"},
		{"[2001:db8::1]", "", "[2001:db8::1]"},
	} {
		if got := httpsAuthority(tc.host, tc.port); got != tc.want {
			t.Errorf("httpsAuthority(%q, %q) = %q, want %q", tc.host, tc.port, got, tc.want)
		}
	}
}

// A request fasthttp refuses is answered with the JSON error, however the
// client sends it: a head over client.max_header_size gets a 431, a
// malformed one a 400. fasthttp reads only a buffer's worth of a head, and
// none of the body after a malformed one, and a close with the rest unread
// makes the kernel reset the connection: the client's write of the rest
// fails, and a client that sends everything before it reads (curl,
// requests, most SDKs) reports the reset and never reads the answer. The
// reset may also destroy the answer in the client's buffers before it is
// read (RFC 9112 9.6).
func TestRefusedRequestHead(t *testing.T) {
	t.Parallel()
	big := func(n int) string {
		return "GET / HTTP/1.1\r\nHost: 50005-a.cube.test\r\nX-Big: " + strings.Repeat("x", n) + "\r\n\r\n"
	}
	withBody := func(head string, n int) string {
		return strings.Replace(head, "\r\n\r\n", "\r\nContent-Length: "+strconv.Itoa(n)+"\r\n\r\n", 1) + strings.Repeat("b", n)
	}
	// fasthttp refuses a Content-Length that is not a number; the client
	// sends the body all the same.
	badLength := func(n int) string {
		return "POST / HTTP/1.1\r\nHost: 50005-a.cube.test\r\nContent-Length: 1x\r\n\r\n" + strings.Repeat("b", n)
	}
	small := "GET / HTTP/1.1\r\nHost: 50005-nobox.cube.test\r\n\r\n"
	const tooLarge, malformed = "request_header_too_large", "bad_request"
	for _, tc := range []struct {
		name   string
		writes []string
		before int // answers before the refusal (pipelined requests)
		code   string
	}{
		{"just over, one write", []string{big(33 << 10)}, 0, tooLarge},
		{"64 KiB, one write", []string{big(64 << 10)}, 0, tooLarge},
		// More than the socket buffers hold: the write waits for the proxy.
		{"8 MiB, one write", []string{big(8 << 20)}, 0, tooLarge},
		{"64 KiB, line by line", strings.SplitAfter(big(64<<10), "\r\n"), 0, tooLarge},
		{"64 KiB in 4 KiB writes", pieces(big(64<<10), 4<<10), 0, tooLarge},
		{"with a body", []string{withBody(big(36<<10), 256<<10)}, 0, tooLarge},
		{"pipelined after a small request", []string{small + big(64<<10)}, 1, tooLarge},
		{"long request line", []string{"GET /" + strings.Repeat("q", 64<<10) + " HTTP/1.1\r\nHost: 50005-a.cube.test\r\n\r\n"}, 0, tooLarge},
		{"malformed, no body", []string{badLength(0)}, 0, malformed},
		{"malformed, 256 KiB body", []string{badLength(256 << 10)}, 0, malformed},
		{"malformed, 8 MiB body", []string{badLength(8 << 20)}, 0, malformed},
		// Behind a held answer the 400 keeps fasthttp's plain close: it
		// must not overtake the answer it follows.
		{"malformed, pipelined after a small request", []string{small + badLength(0)}, 1, malformed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			c, err := net.Dial("tcp", h.addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(20 * time.Second))
			for _, w := range tc.writes {
				// curl, requests and most SDKs give up on a failed write
				// without reading the answer.
				if _, err := io.WriteString(c, w); err != nil {
					t.Fatalf("write: %v", err)
				}
			}
			br := bufio.NewReader(c)
			for i := 0; i <= tc.before; i++ {
				resp, err := http.ReadResponse(br, nil)
				if err != nil {
					t.Fatalf("answer %d: %v", i+1, err)
				}
				b, err := io.ReadAll(resp.Body)
				resp.Body.Close()
				if err != nil {
					t.Fatalf("answer %d body: %v", i+1, err)
				}
				if i < tc.before {
					checkProxyError(t, resp, string(b), 404, CodeNotFound)
					continue
				}
				status := 431
				if tc.code == malformed {
					status = 400
				}
				checkProxyError(t, resp, string(b), status, tc.code)
				if !resp.Close {
					t.Errorf("%d without Connection: close", status)
				}
			}
		})
	}
}

// pieces cuts s into pieces of n bytes.
func pieces(s string, n int) []string {
	var out []string
	for len(s) > n {
		out = append(out, s[:n])
		s = s[n:]
	}
	return append(out, s)
}

// The plain-HTTP redirect listener takes heads up to client.max_header_size
// like the HTTPS one it sends clients to: a browser whose cookies for the
// domain outgrow fasthttp's default 4 KiB buffer got a 431 instead of its
// redirect.
func TestRedirectListenerHeaderLimit(t *testing.T) {
	h := newHarness(t)
	ln := listen(t, "127.0.0.1:0")
	go h.server.ServeRedirect(ln, "8443")
	for _, tc := range []struct {
		name   string
		cookie int
		status int
	}{
		{"small", 100, 308},
		{"8 KiB of cookies", 8 << 10, 308},
		{"24 KiB of cookies", 24 << 10, 308},
		{"over the limit", 40 << 10, 431},
		// Answered with a lingering close, as on the HTTPS listener.
		{"8 MiB", 8 << 20, 431},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := dialRaw(t, ln.Addr().String())
			req := "GET /a HTTP/1.1\r\nHost: 50005-box.cube.test\r\nCookie: c=" + strings.Repeat("x", tc.cookie) + "\r\n\r\n"
			if _, err := io.WriteString(c, req); err != nil {
				t.Fatal(err)
			}
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d, want %d", resp.StatusCode, tc.status)
			}
		})
	}
}

// Malformed requests over a raw socket, each on a connection of its own:
// every one is answered (before the proxy closes: no reset, no wait for
// more) with its status and a JSON code, and none whose head is refused
// reaches the sandbox the host names, which counts its connections.
func TestMalformedRequestsAnswered(t *testing.T) {
	h := newHarness(t)
	// Each case gets a sandbox of its own behind the same host: the one a
	// case dialed (a body that breaks) may accept that connection only
	// after the case ended, and would count it in the next.
	const host = "8080-box.cube.test"
	get := func(extra string) string { return "GET / HTTP/1.1\r\nHost: " + host + "\r\n" + extra + "\r\n" }
	post := func(extra, body string) string {
		return "POST / HTTP/1.1\r\nHost: " + host + "\r\n" + extra + "\r\n" + body
	}
	const bad = CodeBadRequest
	for _, tc := range []struct {
		name, raw string
		status    int
		code      string
	}{
		{"control char in a value", get("X-A: a\x01b\r\n"), 400, bad},
		{"DEL in a value", get("X-A: a\x7fb\r\n"), 400, bad},
		{"NUL in a value", get("X-A: a\x00b\r\n"), 400, bad},
		{"bare CR in a value", get("X-A: a\rb\r\n"), 400, bad},
		{"control char in a name", get("X\x01A: ab\r\n"), 400, bad},
		{"empty name", get(": ab\r\n"), 400, bad},
		{"space before the colon", get("X-A : ab\r\n"), 400, bad},
		{"line starting with a space", get(" X-A: a\r\n"), 400, bad},
		{"control char in the target", "GET /\x01 HTTP/1.1\r\nHost: " + host + "\r\n\r\n", 400, bad},
		{"three spaces in the request line", "GET / HTTP/1.1 x\r\nHost: " + host + "\r\n\r\n", 400, bad},
		{"double space", "GET  / HTTP/1.1\r\nHost: " + host + "\r\n\r\n", 400, bad},
		{"no version", "GET /\r\nHost: " + host + "\r\n\r\n", 400, bad},
		{"HTTP/2.0", "GET / HTTP/2.0\r\nHost: " + host + "\r\n\r\n", 505, CodeBadVersion},
		{"HTTP/9.9 asking for keep-alive", "GET / HTTP/9.9\r\nHost: " + host + "\r\nConnection: keep-alive\r\n\r\n", 505, CodeBadVersion},
		{"HTTP/1.10", "GET / HTTP/1.10\r\nHost: " + host + "\r\n\r\n", 400, bad},
		{"NUL in the method", "G\x00T / HTTP/1.1\r\nHost: " + host + "\r\n\r\n", 400, bad},
		{"two Host lines", "GET / HTTP/1.1\r\nHost: " + host + "\r\nHost: 80-other.cube.test\r\n\r\n", 400, bad},
		{"no Host", "GET / HTTP/1.1\r\n\r\n", 400, bad},
		{"Host with a path", "GET / HTTP/1.1\r\nHost: " + host + "/x\r\n\r\n", 400, bad},
		{"Host with a letter port", "GET / HTTP/1.1\r\nHost: " + host + ":abc\r\n\r\n", 400, bad},
		{"Host with userinfo", "GET / HTTP/1.1\r\nHost: a@" + host + "\r\n\r\n", 400, bad}, // fasthttp since v1.79 (RFC 9110 4.2.4)
		{"absolute-form target with userinfo", "GET http://a@" + host + "/ HTTP/1.1\r\nHost: " + host + "\r\n\r\n", 400, bad},
		{"port 0", "GET / HTTP/1.1\r\nHost: 0-box.cube.test\r\n\r\n", 400, routing.CodeInvalidPort},
		{"port 65536", "GET / HTTP/1.1\r\nHost: 65536-box.cube.test\r\n\r\n", 400, routing.CodeInvalidPort},
		{"port of 20 digits", "GET / HTTP/1.1\r\nHost: 99999999999999999999-box.cube.test\r\n\r\n", 400, routing.CodeInvalidPort},
		{"IDN in the id", "GET / HTTP/1.1\r\nHost: 80-bücher.cube.test\r\n\r\n", 400, routing.CodeInvalidSandboxID},
		{"punycode label", "GET / HTTP/1.1\r\nHost: xn--80ak6aa92e.cube.test\r\n\r\n", 400, routing.CodeInvalidPort},
		{"override port in hex", "GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Cube-Sandbox-Id: box\r\nX-Cube-Sandbox-Port: 0x50\r\n\r\n", 400, routing.CodeInvalidPort},
		{"override id with a path", "GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Cube-Sandbox-Id: ../box\r\nX-Cube-Sandbox-Port: 80\r\n\r\n", 400, routing.CodeInvalidSandboxID},
		{"override without a port", "GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Cube-Sandbox-Id: box\r\n\r\n", 400, routing.CodeMissingTargetHeaders},
		{"two Content-Lengths", post("Content-Length: 3\r\nContent-Length: 4\r\n", "abcd"), 400, bad},
		{"Content-Length list", post("Content-Length: 3, 3\r\n", "abc"), 400, bad},
		{"negative Content-Length", post("Content-Length: -1\r\n", "abc"), 400, bad},
		{"signed Content-Length", post("Content-Length: +3\r\n", "abc"), 400, bad},
		{"Content-Length of 23 digits", post("Content-Length: 99999999999999999999999\r\n", "abc"), 400, bad},
		{"huge Content-Length, sent on", post("Content-Length: 1000000000000\r\n", strings.Repeat("b", 9000)), 413, CodeBodyTooLarge},
		{"gzip, chunked", post("Transfer-Encoding: gzip, chunked\r\n", "0\r\n\r\n"), 400, bad},
		{"two Transfer-Encodings", post("Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n", "0\r\n\r\n"), 400, bad},
		{"chunked on HTTP/1.0", "POST / HTTP/1.0\r\nHost: " + host + "\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400, bad},
		{"chunk size of 20 hex digits", post("Transfer-Encoding: chunked\r\n", "ffffffffffffffffffff\r\nabc\r\n0\r\n\r\n"), 400, CodeBadBody},
		{"CONNECT", "CONNECT 1.2.3.4:80 HTTP/1.1\r\nHost: " + host + "\r\n\r\n", 405, CodeBadMethod},
		// fasthttp drops "identity" and reads the body as the next request
		// (without Content-Length) or by Content-Length: a front proxy that
		// reads the coding otherwise would disagree on where requests end.
		{"identity, body smuggling a request", post("Transfer-Encoding: identity\r\n", get("")), 400, bad},
		{"identity with Content-Length", post("Transfer-Encoding: identity\r\nContent-Length: 3\r\n", "abc"), 400, bad},
		{"identity to an unknown sandbox", "POST / HTTP/1.1\r\nHost: 80-nobox.cube.test\r\nTransfer-Encoding: Identity\r\n\r\n" + get(""), 400, bad},
		// fasthttp since v1.79: two Content-Types that differ (which one
		// the sandbox would read is anyone's guess), and a chunk line
		// whose extension runs past 16 KiB (read and thrown away, it let a
		// client spend the proxy's CPU on bytes no one receives).
		{"two Content-Types that differ", post("Content-Type: text/plain\r\nContent-Type: application/json\r\nContent-Length: 2\r\n", "{}"), 400, bad},
		{"chunk extension over 16 KiB", post("Transfer-Encoding: chunked\r\n", "1;"+strings.Repeat("x", 17<<10)+"\r\na\r\n0\r\n\r\n"), 400, CodeBadBody},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newScriptBackend(t, func(c net.Conn, _ *http.Request, _ int) bool { return rawWrite(c, okResponse("fine")) })
			h.put("box", map[string]string{"HostIP": "127.0.0.1", "SandboxIP": "127.0.0.1", "CreatedAt": "1", "8080": itoa(b.port)})
			c, err := net.Dial("tcp", h.addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(5 * time.Second))
			if _, err := io.WriteString(c, tc.raw); err != nil {
				t.Fatal(err)
			}
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Fatalf("no answer: %v", err)
			}
			body, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil {
				t.Fatalf("answer cut: %v", err)
			}
			checkProxyError(t, resp, string(body), tc.status, tc.code)
			if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
				t.Errorf("Content-Type %q", ct)
			}
			// A framing the proxy cannot trust ends the connection: what
			// follows the head must not be served as a request.
			if (tc.code == bad || tc.code == CodeBadVersion) && !resp.Close {
				t.Errorf("%d without Connection: close", tc.status)
			}
			// A body streams: its framing breaks after the sandbox got
			// the head, which is dialed as the host names it.
			if n := b.accepted.Load(); n != 0 && tc.code != CodeBadBody {
				t.Errorf("the sandbox was dialed %d times", n)
			}
		})
	}
}

// The redirect listener sends a client to the host its Host header names,
// like the HTTPS listener routes by it, and never to another one: fasthttp
// dropped userinfo from the host it reports ("a@evil.test" is
// "evil.test"), and (since v1.79) writes an absolute-form target's
// authority over the Host header, so these requests were sent to
// https://evil.test. A Host with userinfo is refused, as the HTTPS
// listener refuses it.
func TestRedirectListenerHost(t *testing.T) {
	h := newHarness(t)
	ln := listen(t, "[::1]:0")
	go h.server.ServeRedirect(ln, "8443")
	for _, tc := range []struct {
		name, target, host string
		status             int
		location           string
	}{
		{"plain", "/p", "50005-box.cube.test", 308, "https://50005-box.cube.test:8443/p"},
		// Userinfo is refused by fasthttp itself (since v1.79), 400
		// bad_request, in Host or in an absolute-form target.
		{"userinfo", "/p", "a@evil.test", 400, ""},
		{"userinfo with a port", "/p", "50005-box.cube.test:80@evil.test", 400, ""},
		{"absolute-form naming another host", "http://evil.test/p", "50005-box.cube.test", 308, "https://50005-box.cube.test:8443/p"},
		{"absolute-form naming another host with a port", "http://evil.test:8443/p", "50005-box.cube.test", 308, "https://50005-box.cube.test:8443/p"},
		{"absolute-form with userinfo", "http://u@evil.test/p", "50005-box.cube.test", 400, ""},
		// On an IPv6 listener, an IPv6 literal keeps its brackets. (fasthttp
		// answers a malformed one, "[::1", "[::1]x" or a bare "::1", 400
		// bad_request before the handler.)
		{"IPv6 literal", "/p", "[::1]:8081", 308, "https://[::1]:8443/p"},
		{"IPv6 literal without port", "/p", "[::1]", 308, "https://[::1]:8443/p"},
		// Brackets around anything but an IPv6 address are no IP literal:
		// taking them off named another host ("[evil.test]" went to
		// https://evil.test, "[]0]" to https://]0). fasthttp refuses
		// such a Host itself, but not behind an absolute-form target.
		{"brackets around a name", "http://a.test/p", "[evil.test]", 400, ""},
		{"brackets around a name, origin-form", "/p", "[evil.test]", 400, ""},
		{"brackets around an IPv4 address, origin-form", "/p", "[127.0.0.1]:80", 400, ""},
		{"brackets around a name with a port", "http://a.test/p", "[evil.test]:80", 400, ""},
		{"brackets around an IPv4 address", "http://a.test/p", "[127.0.0.1]", 400, ""},
		{"stray bracket", "http://a.test/p", "[]0]", 400, ""},
		{"text after the literal", "http://a.test/p", "[::1]]", 400, ""},
		{"IPv6 literal behind an absolute-form target", "http://a.test/p", "[::1]:80", 308, "https://[::1]:8443/p"},
		{"port only", "/p", ":80", 400, ""},
		{"port only behind an absolute-form target", "http://a.test/p", ":80", 400, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, body := rawRequest(t, ln.Addr().String(), "GET "+tc.target+" HTTP/1.1\r\nHost: "+tc.host+"\r\n\r\n")
			if resp.StatusCode != tc.status || resp.Header.Get("Location") != tc.location {
				t.Fatalf("%d Location %q, want %d %q", resp.StatusCode, resp.Header.Get("Location"), tc.status, tc.location)
			}
			if tc.status == 400 {
				code := routing.CodeInvalidHost
				// fasthttp's parser refuses userinfo anywhere, and a
				// bracketed Host that is no IPv6 literal when the target
				// is origin-form (the README says which code comes when).
				if strings.Contains(tc.target+tc.host, "@") ||
					strings.HasPrefix(tc.target, "/") && strings.HasPrefix(tc.host, "[") {
					code = CodeBadRequest
				}
				checkProxyError(t, resp, body, 400, code)
			}
		})
	}
}

// By default the traffic listener takes every head nginx's default
// large_client_header_buffers (4 × 8 KiB) takes: 30 KB of cookies and
// tokens in 2 KB lines reach the sandbox whole (the 16 KiB limit before
// answered 431), and a head over 32 KiB is still a 431.
func TestDefaultHeaderLimitTakesNginxsHeads(t *testing.T) {
	h := newHarness(t)
	seen := make(chan int, 2)
	host := h.route("bighead", backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen <- len(r.Header.Values("X-Line"))
	})))
	for _, tc := range []struct {
		lines, status int
	}{
		{15, 200}, // 30 KB in all
		{20, 431}, // 40 KB
	} {
		resp, _ := rawRequest(t, h.addr, "GET / HTTP/1.1\r\nHost: "+host+"\r\n"+
			strings.Repeat("X-Line: "+strings.Repeat("v", 1990)+"\r\n", tc.lines)+"\r\n")
		if resp.StatusCode != tc.status {
			t.Fatalf("%d lines of 2 KB: %d, want %d", tc.lines, resp.StatusCode, tc.status)
		}
		if tc.status == 200 {
			if n := <-seen; n != tc.lines {
				t.Errorf("the sandbox saw %d of the %d lines", n, tc.lines)
			}
		}
	}
}

// The redirect listener needs nothing of a request's body, and fasthttp
// allocates a declared Content-Length whole (up to its 4 MiB default) as
// soon as the head has come: 1,000 heads of ~70 bytes declaring 4 MB held
// 4 GB of the proxy's memory for the read timeout, from any client of the
// public plain-HTTP port. A body above a small buffer is now redirected
// at once, unread (and its connection closed), as the ErrorHandler
// already did above 4 MiB.
func TestRedirectListenerDoesNotHoldDeclaredBodies(t *testing.T) {
	h := newHarness(t)
	ln := listen(t, "127.0.0.1:0")
	go h.server.ServeRedirect(ln, "8443")
	head := "POST /up HTTP/1.1\r\nHost: 50005-box.cube.test\r\nContent-Length: 4000000\r\n\r\n"
	const conns = 32
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	cs := make([]net.Conn, conns)
	for i := range cs {
		cs[i] = dialRaw(t, ln.Addr().String())
		if _, err := io.WriteString(cs[i], head); err != nil {
			t.Fatal(err)
		}
	}
	for i, c := range cs {
		// The body never comes: the answer must not wait for it.
		resp, _ := rawExchange(t, c, ln.Addr().String(), "")
		if resp.StatusCode != 308 || resp.Header.Get("Location") != "https://50005-box.cube.test:8443/up" {
			t.Fatalf("connection %d: %d to %q, want 308 to https://50005-box.cube.test:8443/up", i, resp.StatusCode, resp.Header.Get("Location"))
		}
	}
	runtime.ReadMemStats(&after)
	if grew := after.TotalAlloc - before.TotalAlloc; grew > conns<<20 {
		t.Errorf("%d heads declaring 4 MB allocated %d bytes: their bodies were allocated", conns, grew)
	}
	// A chunk declaring more is refused at once too (fasthttp allocates
	// each chunk's declared size): 413, since fasthttp resets the request
	// it cannot read, and no head is left to redirect by; it was a 400
	// for an empty Host (above the 4 MiB before).
	c := dialRaw(t, ln.Addr().String())
	resp, body := rawExchange(t, c, ln.Addr().String(), "POST /up?x=1 HTTP/1.1\r\nHost: 50005-box.cube.test\r\nTransfer-Encoding: chunked\r\n\r\n3FFFF0\r\n")
	if resp.StatusCode != 413 || !strings.Contains(body, `"code":"request_body_too_large"`) || !resp.Close {
		t.Errorf("chunked, 4 MB chunk: %d %s, close %v; want 413 request_body_too_large, closed", resp.StatusCode, body, resp.Close)
	}
	// A small body is read and redirected as before, on a connection kept.
	c = dialRaw(t, ln.Addr().String())
	resp, _ = rawExchange(t, c, ln.Addr().String(), "POST /up HTTP/1.1\r\nHost: 50005-box.cube.test\r\nContent-Length: 3\r\n\r\nabc")
	if resp.StatusCode != 308 || resp.Close {
		t.Errorf("small body: %d, close %v; want 308 on a connection kept", resp.StatusCode, resp.Close)
	}
}
