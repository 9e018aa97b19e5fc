package proxy

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/accesslog"
)

// The access log's x_forwarded_for is every X-Forwarded-For line the
// client sent, joined with ", " as the proxy joins them for the sandbox
// and as nginx's $http_x_forwarded_for logs them. Behind a balancer that
// adds a line of its own (HAProxy's option forwardfor) after the client's,
// the first line alone was the client's claim, and the address the
// balancer saw, the one to trust, was in no line of the log.
func TestAccessLogJoinsForwardedForLines(t *testing.T) {
	got := make(chan string, 8)
	for _, format := range []string{accesslog.FormatCube, accesslog.FormatJSON} {
		t.Run(format, func(t *testing.T) {
			h, buf := logHarness(t, format)
			port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				got <- strings.Join(r.Header.Values("X-Forwarded-For"), "|")
			}))
			host := h.route("xffjoin", port)
			for i, tc := range []struct {
				lines []string
				want  string
			}{
				{[]string{"6.6.6.6"}, "6.6.6.6"},
				{[]string{"6.6.6.6", "203.0.113.9"}, "6.6.6.6, 203.0.113.9"},
				{[]string{"6.6.6.6, 10.0.0.1", "", "203.0.113.9"}, "6.6.6.6, 10.0.0.1, 203.0.113.9"},
			} {
				id := fmt.Sprintf("xff-%s-%d", format, i)
				var head strings.Builder
				fmt.Fprintf(&head, "GET / HTTP/1.1\r\nHost: %s\r\nX-Cube-Request-Id: %s\r\n", host, id)
				for _, l := range tc.lines {
					fmt.Fprintf(&head, "X-Forwarded-For: %s\r\n", l)
				}
				head.WriteString("Connection: close\r\n\r\n")
				c, err := net.Dial("tcp", h.addr)
				if err != nil {
					t.Fatal(err)
				}
				_ = c.SetDeadline(time.Now().Add(10 * time.Second))
				if _, err := c.Write([]byte(head.String())); err != nil {
					t.Fatal(err)
				}
				resp, err := http.ReadResponse(bufio.NewReader(c), nil)
				c.Close()
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				if resp.StatusCode != 200 {
					t.Fatalf("%q: status %d", tc.lines, resp.StatusCode)
				}
				if sent, want := <-got, tc.want+", 127.0.0.1"; sent != want {
					t.Errorf("%q: the sandbox got X-Forwarded-For %q, want %q", tc.lines, sent, want)
				}
				var logged string
				if format == accesslog.FormatCube {
					logged = buf.wait(t, id)[3]
				} else {
					logged, _ = buf.waitJSON(t, id)["x_forwarded_for"].(string)
				}
				if logged != tc.want {
					t.Errorf("%q: x_forwarded_for %q, want %q", tc.lines, logged, tc.want)
				}
			}
		})
	}
}
