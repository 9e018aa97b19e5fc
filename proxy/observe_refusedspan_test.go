package proxy

import (
	"bufio"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// A request fasthttp refuses before the handler runs (400, 431) has a
// server span that claims no method or path: fasthttp has dropped the head
// by then, and what its header holds are its defaults ("GET", "/"). The
// span said "proxy GET" with url.path "/" for a POST or a DELETE, where
// the access log (noHead) says nothing, so an operator reading traces of a
// 431 flood looked for GET requests to "/".
func TestParserRefusedSpanClaimsNoMethodOrPath(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tel := obsTelemetry(t, exp)
	h := newHarness(t, func(o *harnessOpts) { o.cfg.Telemetry = tel })
	rln := listen(t, "127.0.0.1:0")
	go h.server.ServeRedirect(rln, "8443")

	tests := []struct {
		name, head string
		status     int
	}{
		{"431 POST", "POST /upload HTTP/1.1\r\nHost: 80-a.cube.test\r\nX-Big: " + strings.Repeat("b", 70<<10) + "\r\n\r\n", 431},
		{"400 PUT", "PUT /p HTTP/1.1\r\nHost: 80-a.cube.test\r\nContent-Length: zz\r\n\r\n", 400},
		{"400 garbage", "GARBAGE\r\n\r\n", 400},
		// Userinfo, a password, in an absolute-form target: fasthttp
		// (since v1.79) refuses it, and no span may carry the target.
		{"400 userinfo", "DELETE http://u:pa55word@80-a.cube.test/p HTTP/1.1\r\nHost: 80-a.cube.test\r\n\r\n", 400},
	}
	for _, l := range []struct{ name, addr string }{{"traffic", h.addr}, {"redirect", rln.Addr().String()}} {
		for _, tc := range tests {
			t.Run(l.name+" "+tc.name, func(t *testing.T) {
				exp.Reset()
				c := dialRaw(t, l.addr)
				if _, err := c.Write([]byte(tc.head)); err != nil {
					t.Fatal(err)
				}
				resp, err := http.ReadResponse(bufio.NewReader(c), nil)
				if err != nil || resp.StatusCode != tc.status {
					t.Fatalf("response %v, %v; want %d", resp, err, tc.status)
				}
				testenv.WaitFor(t, 5*time.Second, "the refused request's span", func() bool { return len(exp.GetSpans()) > 0 })
				spans := exp.GetSpans()
				if len(spans) != 1 || spans[0].SpanKind != trace.SpanKindServer {
					t.Fatalf("%d spans, want one server span", len(spans))
				}
				s := spans[0]
				if s.Name != "proxy OTHER" {
					t.Errorf("span name %q, want \"proxy OTHER\"", s.Name)
				}
				checkAttrs(t, "server span", s.Attributes, map[attribute.Key]string{
					"http.request.method":       "_OTHER",
					"http.response.status_code": strconv.Itoa(tc.status),
					"client.address":            "127.0.0.1",
				})
				if p := attrOf(s, "url.path"); p != "" {
					t.Errorf("url.path %q for a head fasthttp dropped, want none", p)
				}
			})
		}
	}
}

// attrOf returns span attribute k as text, "" when absent.
func attrOf(s tracetest.SpanStub, k attribute.Key) string {
	for _, kv := range s.Attributes {
		if kv.Key == k {
			return kv.Value.String()
		}
	}
	return ""
}
