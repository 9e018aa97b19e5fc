package proxy

import (
	"encoding/json"
	"strings"
	"testing"
)

// README, Decisions, "Where nginx refuses a request and the proxy does
// not" and "Like nginx, not relayed": requests the platform's nginx
// answers 400 (or 405) that are valid HTTP, or repaired as RFC 9112 lets a
// proxy repair them, reach the sandbox as the client sent them. bench/differ
// holds these against nginx, but only as explained differences: a proxy
// that began to refuse one as nginx does (a fasthttp upgrade that became
// strict about methods, say) would pass it. This holds what the sandbox
// gets.
func TestRequestsNginxRefusesReachTheSandbox(t *testing.T) {
	h := newHarness(t)
	b := startAuthBackend(t)
	host := h.route("lenient", b.port)
	for _, tc := range []struct {
		name, line string
		fields     string // header lines after Host, each ending in CRLF
		wantLine   string // request line the sandbox gets
		field      string // a field the sandbox gets ...
		value      string // ... with this value ("" = none at all)
	}{
		{"lower-case method", "get /x HTTP/1.1", "", "get /x HTTP/1.1", "", ""},
		{"token character in the method", "GET! /x HTTP/1.1", "", "GET! /x HTTP/1.1", "", ""},
		{"asterisk-form OPTIONS", "OPTIONS * HTTP/1.1", "", "OPTIONS * HTTP/1.1", "", ""},
		{"% without two hex digits", "GET /%zz/a%2 HTTP/1.1", "", "GET /%zz/a%2 HTTP/1.1", "", ""},
		{"% at the end", "GET /a% HTTP/1.1", "", "GET /a% HTTP/1.1", "", ""},
		{"name with _", "GET /x HTTP/1.1", "X_Custom: 1\r\n", "GET /x HTTP/1.1", "X_Custom", "1"},
		{"obs-fold replaced by a space", "GET /x HTTP/1.1", "X-F: a\r\n b\r\n", "GET /x HTTP/1.1", "X-F", "a b"},
		{"bodiless DELETE framed by fasthttp's writer", "DELETE /x HTTP/1.1", "", "DELETE /x HTTP/1.1", "Content-Length", "0"},
		{"TRACE, Max-Forwards untouched", "TRACE /x HTTP/1.1", "Max-Forwards: 0\r\n", "TRACE /x HTTP/1.1", "Max-Forwards", "0"},
		{"no Via added", "GET /x HTTP/1.1", "", "GET /x HTTP/1.1", "Via", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, body := rawRequest(t, h.addr, tc.line+"\r\nHost: "+host+"\r\n"+tc.fields+"Connection: close\r\n\r\n")
			if resp.StatusCode != 200 || body != "ok" {
				t.Fatalf("%d %q, want the sandbox's 200", resp.StatusCode, body)
			}
			got := b.next(t)
			if got.line != tc.wantLine {
				t.Errorf("sandbox got request line %q, want %q", got.line, tc.wantLine)
			}
			if tc.field == "" {
				return
			}
			vs := got.values(tc.field)
			if tc.value == "" && len(vs) != 0 || tc.value != "" && (len(vs) != 1 || vs[0] != tc.value) {
				t.Errorf("sandbox got %s %q, want %q (head:\n%s)", tc.field, vs, tc.value, got.raw)
			}
		})
	}
}

// The sandbox's side of the same decision: answers nginx 1.22 relays that
// the proxy refuses (RFC 9112 6.3; a status line that is not HTTP/1.x),
// a sized answer cut short, which is read whole before its head goes out,
// the folded line nginx answers 502 for, repaired, and what is not
// relayed, as by nginx: an interim 1xx (up to 8 of them), a chunked
// answer's trailer fields.
func TestSandboxAnswersNginxRelaysDifferently(t *testing.T) {
	h := newHarness(t)
	for _, tc := range []struct {
		name, answer string
		status       int
		code         string // the proxy's error code, for a refusal
		field, value string // a field the client gets, for a 200
	}{
		{"two equal Content-Lengths", "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\nok", 502, CodeUpstreamBadHeader, "", ""},
		{"signed Content-Length", "HTTP/1.1 200 OK\r\nContent-Length: +2\r\n\r\nok", 502, CodeUpstreamBadHeader, "", ""},
		{"lower-case status line", "http/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", 502, CodeUpstreamBadHeader, "", ""},
		{"sized answer cut short", "HTTP/1.1 200 OK\r\nContent-Length: 100\r\nConnection: close\r\n\r\nok", 502, CodeUpstreamReset, "", ""},
		{"obs-fold replaced by a space", "HTTP/1.1 200 OK\r\nX-F: a\r\n b\r\nContent-Length: 2\r\n\r\nok", 200, "", "X-F", "a b"},
		{"103 not relayed", "HTTP/1.1 103 Early Hints\r\nLink: </a.css>; rel=preload\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", 200, "", "Link", ""},
		// README: up to 8 interim answers are skipped, a ninth is a 502.
		{"8 interim answers skipped", strings.Repeat("HTTP/1.1 100 Continue\r\n\r\n", 8) + "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", 200, "", "", ""},
		{"a ninth interim answer refused", strings.Repeat("HTTP/1.1 100 Continue\r\n\r\n", 9) + "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", 502, CodeUpstreamBadHeader, "", ""},
		{"trailer not relayed", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTrailer: X-T\r\n\r\n2\r\nok\r\n0\r\nX-T: 1\r\n\r\n", 200, "", "X-T", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			host := h.route("answers", rawBackend(t, tc.answer))
			resp, body := rawRequest(t, h.addr, "GET /x HTTP/1.1\r\nHost: "+host+"\r\nConnection: close\r\n\r\n")
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d (%s), want %d", resp.StatusCode, body, tc.status)
			}
			if tc.code != "" {
				var e struct{ Code string }
				if err := json.Unmarshal([]byte(body), &e); err != nil || e.Code != tc.code {
					t.Errorf("body %q, want code %s", body, tc.code)
				}
				return
			}
			if body != "ok" {
				t.Errorf("body %q, want ok", body)
			}
			got := strings.Join(append(resp.Header.Values(tc.field), resp.Trailer.Values(tc.field)...), "|")
			if got != tc.value {
				t.Errorf("client got %s %q, want %q", tc.field, got, tc.value)
			}
		})
	}
}
