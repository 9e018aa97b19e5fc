package proxy

import (
	"strings"
	"testing"

	"github.com/cube-sandbox/cubeproxy/accesslog"
)

// An absolute-form target under /sandbox/ ("GET http://<node>/sandbox/<id>/
// <port>/p", as a client that has the node as its HTTP proxy sends a URL
// of path routing) is routed by its path, as nginx routes it (by $uri), and
// the sandbox gets what an origin-form request of that path gets: the rest
// of the path and the query as sent, the prefix in X-Forwarded-Prefix, the
// client's Host. Earlier builds routed it by Host alone and answered 400
// missing_target_headers. A target whose own host names a sandbox, or one
// that climbs out of the sandbox's root, is refused with no dial.
func TestAbsoluteFormPathRouting(t *testing.T) {
	h := newHarness(t)
	b := startAuthBackend(t)
	other := startAuthBackend(t)
	h.route("abspath", b.port)
	otherHost := h.route("absother", other.port)
	prefix := "/sandbox/abspath/" + itoa(b.port)

	for _, tc := range []struct {
		name, head string
		line, host string // what the sandbox gets
	}{
		{"HTTP/1.1", "GET http://127.0.0.1:8081" + prefix + "/p?q=/x HTTP/1.1\r\nHost: 127.0.0.1:8081\r\n", "GET /p?q=/x HTTP/1.1", "127.0.0.1:8081"},
		{"https scheme", "GET https://127.0.0.1" + prefix + "/a//b HTTP/1.1\r\nHost: 127.0.0.1\r\n", "GET /a//b HTTP/1.1", "127.0.0.1"},
		{"prefix alone", "GET http://127.0.0.1" + prefix + " HTTP/1.1\r\nHost: 127.0.0.1\r\n", "GET / HTTP/1.1", "127.0.0.1"},
		{"query after the port", "GET http://127.0.0.1" + prefix + "?x=1 HTTP/1.1\r\nHost: 127.0.0.1\r\n", "GET /?x=1 HTTP/1.1", "127.0.0.1"},
		{"slashes merged before sandbox", "GET http://localhost//" + prefix[1:] + "/p HTTP/1.1\r\nHost: localhost\r\n", "GET /p HTTP/1.1", "localhost"},
		{"HTTP/1.0 without Host", "GET http://127.0.0.1" + prefix + "/p HTTP/1.0\r\n", "GET /p HTTP/1.1", "127.0.0.1"},
		{"headers lose to the path", "GET http://127.0.0.1" + prefix + "/p HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Cube-Sandbox-Id: absother\r\nX-Cube-Sandbox-Port: " + itoa(other.port) + "\r\n", "GET /p HTTP/1.1", "127.0.0.1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, body := rawRequest(t, h.addr, tc.head+"\r\n")
			if resp.StatusCode != 200 || body != "ok" {
				t.Fatalf("%d %q, want 200 from the sandbox", resp.StatusCode, body)
			}
			got := b.next(t)
			if got.line != tc.line {
				t.Errorf("sandbox got request line %q, want %q", got.line, tc.line)
			}
			if hs := got.values("Host"); len(hs) != 1 || hs[0] != tc.host {
				t.Errorf("sandbox got Host %q, want %q", hs, tc.host)
			}
			if p := got.values("X-Forwarded-Prefix"); len(p) != 1 || p[0] != prefix {
				t.Errorf("sandbox got X-Forwarded-Prefix %q, want %q", p, prefix)
			}
		})
	}

	for _, tc := range []struct{ name, head, code string }{
		{"climbs out of the sandbox", "GET http://127.0.0.1" + prefix + "/../../absother/" + itoa(other.port) + "/ HTTP/1.1\r\nHost: 127.0.0.1\r\n", "bad_request"},
		{"escaped climb", "GET http://127.0.0.1" + prefix + "/%2e%2e/x HTTP/1.1\r\nHost: 127.0.0.1\r\n", "bad_request"},
		{"escaped slash in the port", "GET http://127.0.0.1/sandbox/abspath/" + itoa(b.port) + "%2F..%2F..%2Fabsother/1/ HTTP/1.1\r\nHost: 127.0.0.1\r\n", "invalid_port"},
		{"target names a sandbox", "GET http://" + otherHost + prefix + "/p HTTP/1.1\r\nHost: 127.0.0.1\r\n", "missing_target_headers"},
		{"Host names a sandbox", "GET http://127.0.0.1" + prefix + "/p HTTP/1.1\r\nHost: " + otherHost + "\r\n", "invalid_host"},
		{"upper-case id", "GET http://127.0.0.1/sandbox/ABSPATH/" + itoa(b.port) + "/ HTTP/1.1\r\nHost: 127.0.0.1\r\n", "invalid_sandbox_id"},
		{"no port", "GET http://127.0.0.1/sandbox/abspath?next=/" + itoa(b.port) + "/ HTTP/1.1\r\nHost: 127.0.0.1\r\n", "invalid_sandbox_path"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, body := rawRequest(t, h.addr, tc.head+"Connection: close\r\n\r\n")
			if resp.StatusCode != 400 || !strings.Contains(body, `"code":"`+tc.code+`"`) {
				t.Errorf("%d %s, want 400 %s", resp.StatusCode, body, tc.code)
			}
		})
	}
	if n := len(b.heads); n != 0 {
		t.Errorf("the sandbox got %d requests of the refused ones", n)
	}
	other.assertUntouched(t, "the other sandbox")
}

// "OPTIONS http://host" (absolute form, no path, no query) asks about the
// server as a whole, and the last proxy must send it on as "OPTIONS *"
// (RFC 9112 3.2.4); the parsed URI's path made it "OPTIONS /", a question
// about the root resource. Other methods, and a target with a path or a
// query, keep "/".
func TestAbsoluteFormOptionsServerWide(t *testing.T) {
	h := newHarness(t)
	b := startAuthBackend(t)
	host := h.route("absopts", b.port)
	for _, tc := range []struct{ head, line string }{
		{"OPTIONS http://" + host + " HTTP/1.1", "OPTIONS * HTTP/1.1"},
		{"OPTIONS http://" + host + ":80 HTTP/1.0", "OPTIONS * HTTP/1.1"},
		{"OPTIONS http://" + host + "/ HTTP/1.1", "OPTIONS / HTTP/1.1"},
		{"OPTIONS http://" + host + "?x HTTP/1.1", "OPTIONS /?x HTTP/1.1"},
		{"OPTIONS * HTTP/1.1", "OPTIONS * HTTP/1.1"},
		{"GET http://" + host + " HTTP/1.1", "GET / HTTP/1.1"},
	} {
		resp, body := rawRequest(t, h.addr, tc.head+"\r\nHost: "+host+"\r\n\r\n")
		if resp.StatusCode != 200 || body != "ok" {
			t.Errorf("%q: %d %q, want 200 from the sandbox", tc.head, resp.StatusCode, body)
			continue
		}
		if got := b.next(t); got.line != tc.line {
			t.Errorf("%q: sandbox got %q, want %q", tc.head, got.line, tc.line)
		}
	}
}

// The access log's uri of an absolute-form target routed by its path is
// the sandbox's own path, as for the origin form (nginx's $uri after the
// platform's rewrite): the prefix the proxy cut counts from the target's
// start, but the logged target is its path alone, so cutting that many
// bytes from it left the prefix in uri, or cut into the sandbox's path.
func TestAbsoluteFormPathRoutingLogURI(t *testing.T) {
	h, buf := logHarness(t, accesslog.FormatJSON)
	b := startAuthBackend(t)
	h.route("abslog", b.port)
	prefix := "/sandbox/abslog/" + itoa(b.port)
	for _, tc := range []struct{ name, target, requestURI, uri string }{
		{"origin form", prefix + "/p/q?x=1", prefix + "/p/q?x=1", "/p/q"},
		{"absolute form", "http://127.0.0.1:8081" + prefix + "/p/q?x=1", prefix + "/p/q?x=1", "/p/q"},
		{"absolute form, prefix alone", "http://127.0.0.1:8081" + prefix, prefix, "/"},
		{"absolute form, long authority", "http://" + strings.Repeat("a", 40) + ".example" + prefix + "/p", prefix + "/p", "/p"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id := "req-abslog-" + strings.ReplaceAll(strings.ReplaceAll(tc.name, " ", "-"), ",", "")
			resp, body := rawRequest(t, h.addr, "GET "+tc.target+" HTTP/1.1\r\nHost: 127.0.0.1:8081\r\nX-Cube-Request-Id: "+id+"\r\n\r\n")
			if resp.StatusCode != 200 || body != "ok" {
				t.Fatalf("%d %q, want 200 from the sandbox", resp.StatusCode, body)
			}
			b.next(t)
			if e := buf.waitJSON(t, id); e["request_uri"] != tc.requestURI || e["uri"] != tc.uri {
				t.Errorf("logged request_uri %q uri %q, want %q %q", e["request_uri"], e["uri"], tc.requestURI, tc.uri)
			}
		})
	}
}
