package proxy

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/cube-sandbox/cubeproxy/accesslog"
	"github.com/cube-sandbox/cubeproxy/auth"
)

// A client that sends "Expect: 100-continue" waits for the go-ahead before
// its body. A request the proxy refuses from its head (an unknown, paused
// or killed sandbox, a missing token, a declared size over the limit) is
// answered then, before the body is sent, as nginx answers it; one that
// passes gets 100, and its body reaches the sandbox, which never sees the
// expectation. Each client here sends its head alone and waits: without
// the check it reads "100 Continue" where the refusal should be.
func TestExpectContinueRefusedBeforeTheBody(t *testing.T) {
	h, buf := logHarness(t, accesslog.FormatJSON, func(o *harnessOpts) { o.cfg.MaxRequestBodySize = 1 << 20 })
	var sawExpect atomic.Int64
	port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Expect") != "" {
			sawExpect.Add(1)
		}
		b, _ := io.ReadAll(r.Body)
		fmt.Fprintf(w, "got %d bytes", len(b))
	}))
	const token = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	putAuthRoute(h, "expopen", "", port, 8080)
	putAuthRoute(h, "exptoken", token, port, 8080)
	putAuthRoute(h, "exppaused", "", port, 8080)
	putAuthRoute(h, "expkilled", "", port, 8080)
	if code, body := h.adminDo("POST", "/admin/state", `{"sandbox_id":"exppaused","state":"paused"}`, ""); code != 200 {
		t.Fatalf("pause: %d %s", code, body)
	}
	if code, body := h.adminDo("POST", "/admin/meta/delete", `{"sandbox_id":"expkilled"}`, ""); code != 200 {
		t.Fatalf("kill: %d %s", code, body)
	}

	for _, tc := range []struct {
		name, id, extra string
		size            int
		status          int
		code            string // error code; "" for the sandbox's answer
	}{
		{"unknown sandbox", "expnone", "", 4096, 404, CodeNotFound},
		{"token missing", "exptoken", "", 4096, 403, auth.CodeTrafficTokenMissing},
		{"token wrong", "exptoken", "cube-traffic-access-token: " + strings.Repeat("0", 64) + "\r\n", 4096, 403, auth.CodeTrafficTokenInvalid},
		{"paused", "exppaused", "", 4096, 503, CodeSandboxPausing},
		{"killed", "expkilled", "", 4096, 410, CodeSandboxKilled},
		{"port not mapped", "expopen", "", 4096, 404, CodePortNotMapped},
		{"declared size over the limit", "expopen", "", 2 << 20, 413, CodeBodyTooLarge},
		{"admitted", "expopen", "", 4096, 200, ""},
		{"admitted with its token", "exptoken", "cube-traffic-access-token: " + token + "\r\n", 4096, 200, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			host := "8080-" + tc.id + ".cube.test"
			if tc.code == CodePortNotMapped {
				host = "9090-" + tc.id + ".cube.test"
			}
			reqID := "expect-" + strings.ReplaceAll(tc.name, " ", "-")
			c := dialRaw(t, h.addr)
			fmt.Fprintf(c, "PUT /upload HTTP/1.1\r\nHost: %s\r\nX-Cube-Request-Id: %s\r\n%sContent-Length: %d\r\nExpect: 100-continue\r\n\r\n",
				host, reqID, tc.extra, tc.size)
			br := bufio.NewReader(c)
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatalf("no answer to the head: %v", err)
			}
			if tc.code != "" {
				// Refused: the answer came while the body was held back.
				b, _ := io.ReadAll(resp.Body)
				var e struct{ Error, Code string }
				if resp.StatusCode != tc.status || json.Unmarshal(b, &e) != nil || e.Code != tc.code {
					t.Fatalf("got %d %s, want %d with code %s before the body", resp.StatusCode, b, tc.status, tc.code)
				}
				if resp.Header.Get("X-Cube-Request-Id") != reqID {
					t.Errorf("X-Cube-Request-Id %q, want %q", resp.Header.Get("X-Cube-Request-Id"), reqID)
				}
				entry := buf.waitJSON(t, reqID)
				if entry["status"] != float64(tc.status) || entry["error_code"] != tc.code || entry["bytes_in"] != float64(0) {
					t.Errorf("access log %v: want status %d, error_code %s, bytes_in 0", entry, tc.status, tc.code)
				}
				return
			}
			if resp.StatusCode != http.StatusContinue {
				t.Fatalf("got %d, want 100 Continue", resp.StatusCode)
			}
			if _, err := c.Write(make([]byte, tc.size)); err != nil {
				t.Fatal(err)
			}
			resp, err = http.ReadResponse(br, nil)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			if want := fmt.Sprintf("got %d bytes", tc.size); resp.StatusCode != 200 || string(b) != want {
				t.Fatalf("got %d %q, want 200 %q", resp.StatusCode, b, want)
			}
			entry := buf.waitJSON(t, reqID)
			if entry["status"] != float64(200) || entry["bytes_in"] != float64(tc.size) {
				t.Errorf("access log %v: want status 200, bytes_in %d", entry, tc.size)
			}
			// The head judged alone is not a request of its own.
			// The log is written in order: once a later request's line is
			// there, so is every line of this one.
			later := h.req("GET", "8080-expopen.cube.test", "/", nil)
			later.Header.Set("X-Cube-Request-Id", reqID+"-later")
			resp = h.do(later)
			resp.Body.Close()
			buf.waitJSON(t, reqID+"-later")
			if n := strings.Count(buf.String(), `"x_cube_request_id":"`+reqID+`"`); n != 1 {
				t.Errorf("%d access log lines for the request, want 1", n)
			}
		})
	}
	if n := sawExpect.Load(); n != 0 {
		t.Errorf("the sandbox saw Expect on %d requests", n)
	}
}

// A client that stops waiting for 100 and sends its body anyway still
// reads the refusal: the proxy reads and drops what comes (a lingering
// close) rather than closing on unread bytes, which the client would get
// as a reset, failing its upload's write and the read of the answer.
func TestExpectContinueRefusalWhileTheBodyComes(t *testing.T) {
	h := newHarness(t)
	c := dialRaw(t, h.addr)
	const size = 14 << 20 // more than the socket buffers hold, under lingerLimit
	fmt.Fprintf(c, "PUT /upload HTTP/1.1\r\nHost: 8080-expgone.cube.test\r\nContent-Length: %d\r\nExpect: 100-continue\r\n\r\n", size)
	// The whole body first, the answer after: as a client that sends
	// before it reads.
	if _, err := c.Write(make([]byte, size)); err != nil {
		t.Fatalf("sending the body: %v", err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("no answer after the body: %v", err)
	}
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 404 || !strings.Contains(string(b), CodeNotFound) {
		t.Fatalf("got %d %s, want 404 %s", resp.StatusCode, b, CodeNotFound)
	}
}
