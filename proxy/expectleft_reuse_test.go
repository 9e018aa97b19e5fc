package proxy

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"testing"

	"github.com/cube-sandbox/cubeproxy/accesslog"
)

// The head an Expect upload leaves with its connection (admittedHead) is
// let go of once the upload's body has come: a later request on the same
// kept-alive connection whose body fasthttp fails to read is that
// request's failure, not the upload's. Kept, the later 499 was logged as
// the earlier upload, with its target and request id.
func TestExpectHeadNotReusedByALaterFailure(t *testing.T) {
	h, logs := logHarness(t, accesslog.FormatJSON)
	port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		_, _ = io.WriteString(w, "stored")
	}))
	host := h.route("sbxexpectreuse", port)
	c := dialRaw(t, h.addr)
	br := bufio.NewReader(c)

	const body = "the whole body"
	fmt.Fprintf(c, "POST /files?path=/first HTTP/1.1\r\nHost: %s\r\nContent-Length: %d\r\nX-Cube-Request-Id: rid-first\r\n"+
		"Expect: 100-continue\r\n\r\n", host, len(body))
	if resp, b := readExpectAnswer(t, br); resp.StatusCode != http.StatusContinue {
		t.Fatalf("head answered %d %q, want 100", resp.StatusCode, b)
	}
	io.WriteString(c, body)
	if resp, b := readExpectAnswer(t, br); resp.StatusCode != 200 || b != "stored" {
		t.Fatalf("upload answered %d %q, want 200 from the sandbox", resp.StatusCode, b)
	}
	logs.waitJSON(t, "rid-first")

	// A second upload, without Expect, whose client leaves inside the
	// part of its body fasthttp reads before the handler.
	fmt.Fprintf(c, "POST /files?path=/second HTTP/1.1\r\nHost: %s\r\nContent-Length: 4096\r\nX-Cube-Request-Id: rid-second\r\n\r\npart", host)
	c.Close()
	e := logs.waitJSONLine(t, `"status":499`)
	if e["x_cube_request_id"] == "rid-first" || e["request_uri"] == "/files?path=/first" {
		t.Errorf("the second request's 499 was logged as the first upload: request id %v, target %v", e["x_cube_request_id"], e["request_uri"])
	}
}
