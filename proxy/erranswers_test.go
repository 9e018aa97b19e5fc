package proxy

import (
	"bufio"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
)

// Every refusal the proxy writes itself, to malformed and odd input sent
// over a raw socket, keeps the README's contract (Errors): its status and
// code, a JSON body with exactly the documented fields (sandbox_id only for
// a valid id), Content-Type, Cache-Control, a Content-Length that matches,
// X-Cube-Request-Id and X-Cube-Retcode, no body at all for a HEAD, the
// connection kept or closed as the case requires (a kept one serves the
// next request cleanly, a closed one sends nothing more), and an access
// log line with the same status and code.
func TestErrorAnswersKeepContract(t *testing.T) {
	h, logs := logHarness(t, "json")
	port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	host := h.route("errs", port)
	ln := listen(t, "127.0.0.1:0")
	refused := h.route("errsdead", uint16(ln.Addr().(*net.TCPAddr).Port))
	ln.Close()
	p := itoa(port)
	ws := "Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
	shared := "Host: 127.0.0.1\r\nX-Cube-Sandbox-Id: "
	for _, tc := range []struct {
		name    string
		raw     string
		status  int
		code    string
		sandbox string // the sandbox_id the body names; "" = none
		asked   bool   // a sandbox was asked: X-Cube-Retcode 330<status>
		closes  bool
	}{
		{"host port 0", "GET / HTTP/1.1\r\nHost: 0-errs.cube.test\r\n\r\n", 400, "invalid_port", "", false, false},
		{"host port 65536", "GET / HTTP/1.1\r\nHost: 65536-errs.cube.test\r\n\r\n", 400, "invalid_port", "", false, false},
		{"host port with a sign", "GET / HTTP/1.1\r\nHost: +" + p + "-errs.cube.test\r\n\r\n", 400, "invalid_port", "", false, false},
		{"host id over 128 bytes", "GET / HTTP/1.1\r\nHost: " + p + "-" + strings.Repeat("a", 129) + ".cube.test\r\n\r\n", 400, "invalid_sandbox_id", "", false, false},
		{"header port 0", "GET / HTTP/1.1\r\n" + shared + "errs\r\nX-Cube-Sandbox-Port: 000\r\n\r\n", 400, "invalid_port", "", false, false},
		{"header port of 11 digits", "GET / HTTP/1.1\r\n" + shared + "errs\r\nX-Cube-Sandbox-Port: 000000" + p + "\r\n\r\n", 400, "invalid_port", "", false, false},
		{"header id with a quote", "GET / HTTP/1.1\r\n" + shared + "er\"<rs>\r\nX-Cube-Sandbox-Port: " + p + "\r\n\r\n", 400, "invalid_sandbox_id", "", false, false},
		{"shared host without target headers", "GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", 400, "missing_target_headers", "", false, false},
		{"unknown sandbox", "GET / HTTP/1.1\r\nHost: 80-nosuch.cube.test\r\n\r\n", 404, "sandbox_not_found", "nosuch", false, false},
		{"unknown sandbox, HEAD", "HEAD / HTTP/1.1\r\nHost: 80-nosuch.cube.test\r\n\r\n", 404, "sandbox_not_found", "nosuch", false, false},
		{"unknown sandbox, HTTP/1.0", "GET / HTTP/1.0\r\nHost: 80-nosuch.cube.test\r\n\r\n", 404, "sandbox_not_found", "nosuch", false, true},
		{"unknown sandbox, Connection: close", "GET / HTTP/1.1\r\nHost: 80-nosuch.cube.test\r\nConnection: close\r\n\r\n", 404, "sandbox_not_found", "nosuch", false, true},
		{"unknown sandbox, WebSocket upgrade", "GET / HTTP/1.1\r\nHost: 80-nosuch.cube.test\r\n" + ws + "\r\n", 404, "sandbox_not_found", "nosuch", false, false},
		{"port not mapped, WebSocket upgrade", "GET / HTTP/1.1\r\nHost: 1-errs.cube.test\r\n" + ws + "\r\n", 404, "port_not_mapped", "errs", false, false},
		{"refused connect, HEAD", "HEAD / HTTP/1.1\r\nHost: " + refused + "\r\n\r\n", 502, "upstream_connect_failed", "errsdead", true, false},
		{"refused connect, WebSocket upgrade", "GET / HTTP/1.1\r\nHost: " + refused + "\r\n" + ws + "\r\n", 502, "upstream_connect_failed", "errsdead", true, false},
		{"header line without a colon", "GET / HTTP/1.1\r\nHost: " + host + "\r\nNoColon\r\n\r\n", 400, "bad_request", "", false, true},
		{"two Content-Length lines", "POST / HTTP/1.1\r\nHost: " + host + "\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nxx", 400, "bad_request", "", false, true},
		{"Content-Length with a sign", "POST / HTTP/1.1\r\nHost: " + host + "\r\nContent-Length: +1\r\n\r\nx", 400, "bad_request", "", false, true},
		{"bad chunk size", "POST / HTTP/1.1\r\nHost: " + host + "\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n", 400, "bad_request_body", "errs", false, true},
		{"header over client.max_header_size", "GET / HTTP/1.1\r\nHost: " + host + "\r\nX-A: " + strings.Repeat("a", 70000) + "\r\n\r\n", 431, "request_header_too_large", "", false, true},
		{"more than 1000 header lines, HEAD", "HEAD / HTTP/1.1\r\nHost: " + host + "\r\n" + strings.Repeat("X-A: b\r\n", 1001) + "\r\n", 431, "request_header_too_large", "", false, true},
		{"HTTP/2.0 request line, HEAD", "HEAD / HTTP/2.0\r\nHost: " + host + "\r\n\r\n", 505, "http_version_not_supported", "", false, true},
		{"CONNECT", "CONNECT " + host + ":443 HTTP/1.1\r\nHost: " + host + ":443\r\n\r\n", 405, "method_not_allowed", "", false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := dialRaw(t, h.addr)
			if _, err := io.WriteString(c, tc.raw); err != nil {
				t.Fatal(err)
			}
			br := bufio.NewReader(c)
			head := strings.HasPrefix(tc.raw, "HEAD ")
			resp, err := http.ReadResponse(br, &http.Request{Method: strings.Fields(tc.raw)[0]})
			if err != nil {
				t.Fatal(err)
			}
			body, err := io.ReadAll(resp.Body)
			if err != nil {
				t.Fatalf("reading the body: %v", err)
			}
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, tc.status, body)
			}
			for name, want := range map[string]string{"Content-Type": "application/json", "Cache-Control": "no-store"} {
				if got := resp.Header.Get(name); got != want {
					t.Errorf("%s %q, want %q", name, got, want)
				}
			}
			retcode := "310"
			if tc.asked {
				retcode = "330"
			}
			if got, want := resp.Header.Values(HeaderRetcode), []string{retcode + strconv.Itoa(tc.status)}; len(got) != 1 || got[0] != want[0] {
				t.Errorf("%s %q, want %q", HeaderRetcode, got, want)
			}
			id := resp.Header.Get(HeaderRequestID)
			if id == "" {
				t.Errorf("no %s", HeaderRequestID)
			}
			// A HEAD's answer has the headers its GET would have, and no body.
			if head {
				if resp.ContentLength <= 0 {
					t.Errorf("HEAD answer's Content-Length %d, want the JSON body's", resp.ContentLength)
				}
			} else {
				if resp.ContentLength != int64(len(body)) {
					t.Errorf("Content-Length %d, body %d bytes", resp.ContentLength, len(body))
				}
				var got map[string]any
				if err := json.Unmarshal(body, &got); err != nil {
					t.Fatalf("body is not JSON: %v: %q", err, body)
				}
				want := map[string]bool{"error": true, "code": true, "sandbox_id": tc.sandbox != ""}
				for k := range got {
					if !want[k] {
						t.Errorf("body has %q, not a documented field: %s", k, body)
					}
				}
				if msg, _ := got["error"].(string); msg == "" {
					t.Errorf("no error message: %s", body)
				}
				if got["code"] != tc.code {
					t.Errorf("code %v, want %q", got["code"], tc.code)
				}
				if sid, _ := got["sandbox_id"].(string); sid != tc.sandbox {
					t.Errorf("sandbox_id %q, want %q", sid, tc.sandbox)
				}
			}
			if resp.Close != tc.closes {
				t.Errorf("answer closes the connection: %v, want %v", resp.Close, tc.closes)
			}
			if tc.closes {
				// Nothing after the answer: a HEAD's body would show here.
				if rest, _ := io.ReadAll(br); len(rest) > 0 {
					t.Errorf("%d bytes after the answer: %q", len(rest), rest)
				}
			} else {
				// The next answer parses where this one ended: a HEAD's
				// body, or a part of the request left unread, would not.
				keptRequest(t, c, br, "GET / HTTP/1.1\r\nHost: "+host+"\r\n\r\n")
			}
			entry := logs.waitJSON(t, id)
			if entry["status"] != float64(tc.status) || entry["error_code"] != tc.code {
				t.Errorf("access log status %v, code %v; want %d %s", entry["status"], entry["error_code"], tc.status, tc.code)
			}
			if head && entry["body_bytes_sent"] != float64(0) {
				t.Errorf("HEAD logged body_bytes_sent %v, want 0", entry["body_bytes_sent"])
			}
		})
	}
}
