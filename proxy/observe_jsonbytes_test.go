package proxy

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/cube-sandbox/cubeproxy/accesslog"
)

// Whatever bytes a client puts in what the access log shows (the target,
// Host, the forwarding headers, User-Agent, X-Cube-Instance-Id), its JSON
// line decodes with encoding/json, the value reads back as encoding/json
// carries the bytes sent (invalid UTF-8 as U+FFFD), and no value adds a
// line: one line per request, through the real listener and parser. A head
// the parser refuses (a control byte) is still one valid line.
func TestAccessLogJSONCarriesAnyByteAClientSends(t *testing.T) {
	t.Parallel()
	h, buf := logHarness(t, accesslog.FormatJSON)
	host := h.route("jsonbytes", backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "ok")
	})))
	values := []struct {
		name, v string
		status  int // what the proxy answers with v in a header
	}{
		{"quotes and backslashes", `a"b\c\\"}{"status":1`, 200},
		{"invalid UTF-8", "\xff\xfe\xc3\x28\xed\xa0\x80", 200},
		{"U+2028 and U+2029", "\u2028x\u2029", 200},
		{"tab", "a\tb", 200},
		{"HTML", "<script>&amp;</script>", 200},
		{"DEL", "a\x7fb", 400},
		{"NUL", "a\x00b", 400},
		{"ESC", "\x1b[31mred", 400},
		{"huge invalid UTF-8", strings.Repeat("\xff", 15<<10), 200},
		{"huge escapes", strings.Repeat(`"\`, 7<<10), 200},
	}
	fields := []struct{ header, key string }{
		{"User-Agent", "user_agent"},
		{"X-Forwarded-For", "x_forwarded_for"},
		{"X-Real-IP", "x_real_ip"},
		{"X-Forwarded-Proto", "x_forwarded_proto"},
		{"X-Cube-Instance-Id", "x_cube_instance_id"},
	}
	send := func(t *testing.T, id, head string) (status int, line map[string]any) {
		t.Helper()
		c := dialRaw(t, h.addr)
		before := len(buf.String())
		io.WriteString(c, head)
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatalf("no answer: %v", err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		// The log is written in order: once a later request's line is
		// there, so is this one's.
		later := h.req("GET", host, "/", nil)
		later.Header.Set("X-Cube-Request-Id", id+"-later")
		lresp := h.do(later)
		_, _ = io.Copy(io.Discard, lresp.Body)
		lresp.Body.Close()
		buf.waitJSON(t, id+"-later")
		var lines []map[string]any
		for _, ln := range strings.Split(strings.TrimSuffix(buf.String()[before:], "\n"), "\n") {
			var e map[string]any
			if err := json.Unmarshal([]byte(ln), &e); err != nil {
				t.Fatalf("line is not JSON (%v): %q", err, ln)
			}
			if e["x_cube_request_id"] != id+"-later" {
				lines = append(lines, e)
			}
		}
		if len(lines) != 1 {
			t.Fatalf("%d lines for the request, want 1: %v", len(lines), lines)
		}
		return resp.StatusCode, lines[0]
	}
	for _, v := range values {
		want := jsonCarried(t, v.v)
		for _, f := range fields {
			t.Run(v.name+"/"+f.header, func(t *testing.T) {
				id := "jsonbytes-" + strings.ReplaceAll(v.name, " ", "-") + "-" + f.header
				status, e := send(t, id, fmt.Sprintf("GET / HTTP/1.1\r\nHost: %s\r\nX-Cube-Request-Id: %s\r\n%s: %s\r\nConnection: close\r\n\r\n", host, id, f.header, v.v))
				if status != v.status {
					t.Fatalf("status %d, want %d", status, v.status)
				}
				if v.status == 200 && e[f.key] != want {
					t.Errorf("%s logged as %q, want %q", f.key, e[f.key], want)
				}
			})
		}
		// In the target only what a request line can hold: no space, no
		// CR or LF (the parser's), and no '?' that would move the value
		// into args.
		if strings.ContainsAny(v.v, " \r\n?#") || v.status != 200 {
			continue
		}
		t.Run(v.name+"/target", func(t *testing.T) {
			id := "jsonbytes-" + strings.ReplaceAll(v.name, " ", "-") + "-target"
			target := "/p/" + v.v + "?q=" + v.v
			status, e := send(t, id, fmt.Sprintf("GET %s HTTP/1.1\r\nHost: %s\r\nX-Cube-Request-Id: %s\r\nConnection: close\r\n\r\n", target, host, id))
			if status == 200 {
				for key, sent := range map[string]string{"request_uri": target, "uri": "/p/" + v.v, "args": "q=" + v.v} {
					if want := jsonCarried(t, sent); e[key] != want {
						t.Errorf("%s logged as %q, want %q", key, e[key], want)
					}
				}
			}
		})
	}
}

// jsonCarried is s as encoding/json writes and reads it back.
func jsonCarried(t *testing.T, s string) string {
	t.Helper()
	b, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	var back string
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	return back
}
