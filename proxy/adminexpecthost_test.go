package proxy

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
)

// Without an admin token, the Expect judgement of a head reads the Host
// line, as the request's own judgement does, not an absolute-form
// target's host, which fasthttp copies over it (README: "an
// absolute-form target's host does not count"). It read the target's:
// a local tool's PUT http://<name>/admin/routes/<id> with Host: 127.0.0.1
// was run at once without its body and answered 400 "empty body", and a
// head whose Host line names a page's host (a browser's, as DNS
// rebinding has it) and whose target names 127.0.0.1 got the 100 and
// sent its body, only to read the 403 the head had earned.
func TestAdminExpectJudgesTheHostLine(t *testing.T) {
	h := newHarness(t)
	body := `{"HostIP":"127.0.0.1","3000":"3000"}`
	for _, tc := range []struct {
		name, target, host string
		status             int // 100: the body is asked for, then answered 200
	}{
		{"local Host line, other target host", "http://tool.example/admin/routes/fromtool", "127.0.0.1", 100},
		{"page's Host line, loopback target host", "http://127.0.0.1/admin/routes/frompage", "rebound.example", 403},
		{"origin-form", "/admin/routes/plain", "localhost", 100},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := dialRaw(t, h.admin)
			br := bufio.NewReader(c)
			fmt.Fprintf(c, "PUT %s HTTP/1.1\r\nHost: %s\r\nExpect: 100-continue\r\nContent-Length: %d\r\n\r\n", tc.target, tc.host, len(body))
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatal(err)
			}
			got, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != tc.status {
				t.Fatalf("head: %d %s, want %d", resp.StatusCode, got, tc.status)
			}
			if tc.status != 100 {
				return
			}
			io.WriteString(c, body)
			resp, err = http.ReadResponse(br, nil)
			if err != nil {
				t.Fatal(err)
			}
			got, _ = io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 || !strings.Contains(string(got), `"ok":true`) {
				t.Fatalf("after the body: %d %s, want 200", resp.StatusCode, got)
			}
		})
	}
}
