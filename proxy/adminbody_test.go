package proxy

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"strings"
	"testing"
	"time"
)

// With an admin token configured, a request that does not carry it is
// refused before its body is read: fasthttp allocates a Content-Length
// body whole as soon as the head has come, so a head declaring 1 MiB
// (about 100 bytes sent) held 1 MiB of the proxy's memory for the 30 s
// read timeout, on a listener whose connections are not capped. 3,000
// such connections from a host without the token took the proxy to
// 3 GB RSS. Such a request may now carry 8 KiB: a larger body is refused
// 413 at once, unread (as a body over 1 MiB is, before the endpoint is
// known); one that carries the token keeps the 1 MiB limit.
func TestAdminDoesNotHoldTokenlessBodies(t *testing.T) {
	const tok = "admin-secret"
	h := newHarness(t, func(o *harnessOpts) { o.token = tok })
	head := func(token, framing string) string {
		s := "POST /admin/state HTTP/1.1\r\nHost: 127.0.0.1\r\n" + framing
		if token != "" {
			s += "X-Cube-Admin-Token: " + token + "\r\n"
		}
		return s + "\r\n"
	}
	refused := func(name string, status int, body string) {
		t.Helper()
		if status != 403 || !strings.Contains(body, `"error":"admin token missing or wrong"`) {
			t.Errorf("%s: %d %s, want 403 admin token missing or wrong", name, status, body)
		}
	}
	tooLarge := func(name string, status int, body string) {
		t.Helper()
		if status != 413 || !strings.Contains(body, `"code":"request_body_too_large"`) {
			t.Errorf("%s: %d %s, want 413 request_body_too_large", name, status, body)
		}
	}

	// The body never comes: the answer must not wait for it.
	resp, body := rawRequest(t, h.admin, head("wrong", "Content-Length: 1048576\r\n"))
	tooLarge("wrong token, 1 MiB declared", resp.StatusCode, body)
	resp, body = rawRequest(t, h.admin, head("", "Content-Length: 1048576\r\n"))
	tooLarge("no token, 1 MiB declared", resp.StatusCode, body)
	// A chunked body is cut short once past what a tokenless request may carry.
	chunk := strings.Repeat("x", 16<<10)
	resp, body = rawRequest(t, h.admin, head("wrong", "Transfer-Encoding: chunked\r\n")+
		fmt.Sprintf("%x\r\n%s\r\n", len(chunk), chunk)+"0\r\n\r\n")
	tooLarge("wrong token, 16 KiB chunked", resp.StatusCode, body)
	// One sent whole reads the answer, not a reset (the lingering close).
	sent := strings.Repeat("x", 200<<10)
	resp, body = rawRequest(t, h.admin, head("wrong", fmt.Sprintf("Content-Length: %d\r\n", len(sent)))+sent)
	tooLarge("wrong token, 200 KiB sent", resp.StatusCode, body)
	// A small body still reaches the handler, which refuses it as before.
	small := `{"sandbox_id":"a","state":"paused"}`
	resp, body = rawRequest(t, h.admin, head("wrong", fmt.Sprintf("Content-Length: %d\r\n", len(small)))+small)
	refused("wrong token, small body", resp.StatusCode, body)

	// Many at once hold no body memory: each is answered from its head.
	const conns = 32
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	cs := make([]net.Conn, conns)
	for i := range cs {
		c, err := net.Dial("tcp", h.admin)
		if err != nil {
			t.Fatal(err)
		}
		cs[i] = c
		if _, err := c.Write([]byte(head("wrong", "Content-Length: 1048576\r\n"))); err != nil {
			t.Fatal(err)
		}
	}
	for i, c := range cs {
		resp, body := rawExchange(t, c, h.admin, "")
		tooLarge(fmt.Sprintf("connection %d", i), resp.StatusCode, body)
	}
	runtime.ReadMemStats(&after)
	if grew := after.TotalAlloc - before.TotalAlloc; grew > conns<<20/2 {
		t.Errorf("%d tokenless 1 MiB heads allocated %d bytes: their bodies were allocated", conns, grew)
	}

	// With the token, a body up to 1 MiB is read and judged as before.
	big := `{"sandbox_id":"a","state":"paused","pad":"` + strings.Repeat("x", 900<<10) + `"}`
	resp, body = rawRequest(t, h.admin, head(tok, fmt.Sprintf("Content-Length: %d\r\nConnection: close\r\n", len(big)))+big)
	if resp.StatusCode != 200 {
		t.Errorf("token, 900 KiB body: %d %s, want 200", resp.StatusCode, body)
	}
	resp, body = rawRequest(t, h.admin, head(tok, "Content-Length: 2097152\r\n"))
	tooLarge("token, 2 MiB declared", resp.StatusCode, body)
	// A tokenless 8 KiB still reaches the handler's 403.
	pad := `{"pad":"` + strings.Repeat("x", 8<<10-10) + `"}`
	resp, body = rawRequest(t, h.admin, head("wrong", fmt.Sprintf("Content-Length: %d\r\n", len(pad)))+pad)
	refused("wrong token, 8 KiB", resp.StatusCode, body)
}

// The admin API reads its bodies as JSON whatever their Content-Type, a
// multipart/form-data one included: fasthttp pre-parsed such a body as a
// form before the handler ran, so a JSON body sent with that type (a
// client's form default) got the parser's 400 "malformed HTTP request"
// on a closed connection, and a well-formed form was parsed before the
// token was judged. The traffic listener never pre-parses either.
func TestAdminBodyIsJSONWhateverItsType(t *testing.T) {
	const tok = "admin-secret"
	h := newHarness(t, func(o *harnessOpts) { o.token = tok })
	for _, tc := range []struct {
		name, ctype, body string
		status            int
		want              string
	}{
		{"json as multipart", "multipart/form-data; boundary=xyz", `{"sandbox_id":"a","state":"paused"}`, 200, `"state":"paused"`},
		{"form as multipart", "multipart/form-data; boundary=xyz",
			"--xyz\r\nContent-Disposition: form-data; name=\"sandbox_id\"\r\n\r\na\r\n--xyz--\r\n", 400, `"error":"invalid JSON body: `},
		{"json as text", "text/plain", `{"sandbox_id":"a","state":"running"}`, 200, `"state":"running"`},
	} {
		req := "POST /admin/state HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Cube-Admin-Token: " + tok + "\r\n" +
			"Content-Type: " + tc.ctype + "\r\n" + fmt.Sprintf("Content-Length: %d\r\n\r\n", len(tc.body)) + tc.body
		resp, body := rawRequest(t, h.admin, req)
		if resp.StatusCode != tc.status || !strings.Contains(body, tc.want) {
			t.Errorf("%s: %d %s, want %d with %s", tc.name, resp.StatusCode, body, tc.status, tc.want)
		}
		if resp.Close {
			t.Errorf("%s: connection closed, want it kept open", tc.name)
		}
	}
}

// The head of an "Expect: 100-continue" request is judged before the
// client is asked for its body, as nginx and the traffic listener judge
// it: a declared body over the limit gets its 413, and a request without
// the token its 403, in place of the 100. The admin listener sent 100 to
// each, so the client sent a body only to have it refused (curl sends 2
// MB after the 100; nginx answers 413 to the head alone).
func TestAdminJudgesExpectHeads(t *testing.T) {
	const tok = "admin-secret"
	h := newHarness(t, func(o *harnessOpts) { o.token = tok })
	for _, tc := range []struct {
		name, path, token string
		length            int
		status            int
		want              string
	}{
		{"token, 2 MiB", "/admin/state", tok, 2 << 20, 413, `"code":"request_body_too_large"`},
		{"no token, 20 KiB", "/admin/state", "", 20 << 10, 413, `"code":"request_body_too_large"`},
		{"wrong token, 2 KiB", "/admin/state", "wrong", 2 << 10, 403, `"error":"admin token missing or wrong"`},
		{"no token, unknown path", "/admin/nope", "", 100, 403, `"error":"admin token missing or wrong"`},
		{"token, 2 KiB", "/admin/state", tok, 2 << 10, 100, ""},
		{"token, exactly 1 MiB", "/admin/state", tok, 1 << 20, 100, ""},
	} {
		req := "POST " + tc.path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nExpect: 100-continue\r\n" +
			fmt.Sprintf("Content-Length: %d\r\n", tc.length)
		if tc.token != "" {
			req += "X-Cube-Admin-Token: " + tc.token + "\r\n"
		}
		resp, body := rawRequest(t, h.admin, req+"\r\n")
		if resp.StatusCode != tc.status || !strings.Contains(body, tc.want) {
			t.Errorf("%s: %d %s, want %d %s", tc.name, resp.StatusCode, body, tc.status, tc.want)
		}
	}
	// Admitted, the body is read and the request answered as usual.
	body := `{"sandbox_id":"a","state":"paused"}`
	c, err := net.Dial("tcp", h.admin)
	if err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(c)
	defer c.Close()
	fmt.Fprintf(c, "POST /admin/state HTTP/1.1\r\nHost: 127.0.0.1\r\nExpect: 100-continue\r\nX-Cube-Admin-Token: %s\r\nContent-Length: %d\r\n\r\n", tok, len(body))
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if resp, err := http.ReadResponse(br, nil); err != nil || resp.StatusCode != 100 {
		t.Fatalf("admitted head: %v %v, want 100", resp, err)
	}
	if _, err := io.WriteString(c, body); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || !strings.Contains(string(got), `"state":"paused"`) {
		t.Errorf("admitted request: %d %s, want 200 paused", resp.StatusCode, got)
	}
}

// A body that is no JSON object is answered with what came instead, in
// words: "EOF" for an empty or cut body, and "got <nil>" for null (sent
// as "got \u003cnil\u003e"), told a caller nothing.
func TestAdminBodyErrorsSayWhatCame(t *testing.T) {
	const tok = "admin-secret"
	h := newHarness(t, func(o *harnessOpts) { o.token = tok })
	for _, tc := range []struct{ body, want string }{
		{``, "invalid JSON body: empty body, want a JSON object"},
		{`  `, "invalid JSON body: empty body, want a JSON object"},
		{`{`, "invalid JSON body: unexpected end of the body"},
		{`{"sandbox_id":"a"`, "invalid JSON body: unexpected end of the body"},
		{`{"sandbox_id":"a",`, "invalid JSON body: unexpected end of the body"},
		{`null`, "invalid JSON body: want a JSON object, got null"},
		{`[]`, "invalid JSON body: want a JSON object, got an array"},
		{`5`, "invalid JSON body: want a JSON object, got a number"},
		{`"a"`, "invalid JSON body: want a JSON object, got a string"},
		{`true`, "invalid JSON body: want a JSON object, got a boolean"},
	} {
		req := "POST /admin/state HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Cube-Admin-Token: " + tok + "\r\n" +
			fmt.Sprintf("Content-Length: %d\r\n\r\n", len(tc.body)) + tc.body
		resp, body := rawRequest(t, h.admin, req)
		var out struct{ Error string }
		if err := json.Unmarshal([]byte(body), &out); err != nil || resp.StatusCode != 400 || out.Error != tc.want {
			t.Errorf("body %q: %d %s, want 400 %q", tc.body, resp.StatusCode, body, tc.want)
		}
	}
}
