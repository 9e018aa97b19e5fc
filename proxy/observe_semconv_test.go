package proxy

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"

	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
	"github.com/cube-sandbox/cubeproxy/telemetry"
)

// The upstream (client) span follows the HTTP semantic conventions on
// error.type, which they require for every request that ended in an
// error: the sandbox's status as a string for a 4xx or 5xx it answered
// (client spans take 4xx as errors), else the proxy's error code for the
// exchange, the one the server span and the access log carry. Without it,
// a trace backend's error breakdown of upstream calls (grouped by
// error.type) had nothing to group by. A method outside the known set is
// "_OTHER" in http.request.method, and the conventions then require the
// method as sent in http.request.method_original, on both spans.
func TestTracingSpansFollowHTTPConventions(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tel := obsTelemetry(t, exp)
	h := newHarness(t, func(o *harnessOpts) {
		o.cfg.Telemetry = tel
		o.cfg.ResponseHeaderTimeout = 300 * time.Millisecond
	})
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/teapot":
			w.WriteHeader(418)
		case "/unavailable":
			w.WriteHeader(503)
		case "/slow":
			select {
			case <-release:
			case <-r.Context().Done():
			}
		case "/cut":
			// A chunked answer whose connection the sandbox drops
			// halfway, after the client has its first event.
			f := sseHeaders(w)
			io.WriteString(w, "data: one\n\n")
			f.Flush()
			c, _, err := http.NewResponseController(w).Hijack()
			if err == nil {
				c.Close()
			}
		default:
			io.WriteString(w, "ok")
		}
	}))
	host := h.route("semconv", port)
	dead := freePort(t)
	h.put("semconvdead", map[string]string{"HostIP": "127.0.0.1", "CreatedAt": "1", itoa(dead): itoa(dead)})
	deadHost := itoa(dead) + "-semconvdead.cube.test"

	type want struct {
		status  codes.Code
		errType string // "" = absent
	}
	tests := []struct {
		name           string
		method, target string
		host           string
		status         int
		server, client want
		methodAttr     string
		original       string // http.request.method_original, "" = absent
		upStatus       string // the client span's http.response.status_code, "" = none came
	}{
		{"200", "GET", "/", host, 200, want{codes.Unset, ""}, want{codes.Unset, ""}, "GET", "", "200"},
		{"sandbox 418", "GET", "/teapot", host, 418, want{codes.Unset, ""}, want{codes.Error, "418"}, "GET", "", "418"},
		{"sandbox 503", "GET", "/unavailable", host, 503, want{codes.Error, "503"}, want{codes.Error, "503"}, "GET", "", "503"},
		{"504 header timeout", "GET", "/slow", host, 504, want{codes.Error, CodeUpstreamTimeout}, want{codes.Error, CodeUpstreamTimeout}, "GET", "", ""},
		{"502 connect refused", "GET", "/", deadHost, 502, want{codes.Error, CodeUpstreamConnect}, want{codes.Error, CodeUpstreamConnect}, "GET", "", ""},
		{"sandbox cut its stream", "GET", "/cut", host, 200, want{codes.Error, CodeUpstreamReset}, want{codes.Error, CodeUpstreamReset}, "GET", "", "200"},
		{"unknown method", "PROPFIND", "/dav", host, 200, want{codes.Unset, ""}, want{codes.Unset, ""}, "_OTHER", "PROPFIND", "200"},
		{"lower-case method", "get", "/", host, 200, want{codes.Unset, ""}, want{codes.Unset, ""}, "_OTHER", "get", "200"},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			exp.Reset()
			traceID := fmt.Sprintf("%032x", 0x5e0c00+i)
			tid, _ := trace.TraceIDFromHex(traceID)
			c := rawProxyConn(t, h, tc.method+" "+tc.target+" HTTP/1.1\r\nHost: "+tc.host+
				"\r\nTraceparent: 00-"+traceID+"-00f067aa0ba902b7-01\r\nConnection: close\r\n\r\n")
			_ = c.SetDeadline(time.Now().Add(10 * time.Second))
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d, want %d", resp.StatusCode, tc.status)
			}
			// A refused connect is retried: a client span per attempt, the
			// last one's checked here (observe_resend_test.go checks them
			// all).
			attempts := 1
			if tc.host == deadHost {
				attempts = 2
			}
			var server, client tracetest.SpanStub
			testenv.WaitFor(t, 10*time.Second, "server and client spans", func() bool {
				s := spanByKind(exp.GetSpans(), tid, trace.SpanKindServer)
				cs := spanByKind(exp.GetSpans(), tid, trace.SpanKindClient)
				if len(s) == 1 && len(cs) == attempts {
					server, client = s[0], lastStarted(cs)
					return true
				}
				return false
			})
			for _, sp := range []struct {
				name string
				span tracetest.SpanStub
				want want
			}{{"server", server, tc.server}, {"client", client, tc.client}} {
				if sp.span.Status.Code != sp.want.status {
					t.Errorf("%s span status %v (%q), want %v", sp.name, sp.span.Status.Code, sp.span.Status.Description, sp.want.status)
				}
				if got := attrOf(sp.span, "error.type"); got != sp.want.errType {
					t.Errorf("%s span error.type %q, want %q", sp.name, got, sp.want.errType)
				}
				if got := attrOf(sp.span, "http.request.method"); got != tc.methodAttr {
					t.Errorf("%s span http.request.method %q, want %q", sp.name, got, tc.methodAttr)
				}
				if got := attrOf(sp.span, "http.request.method_original"); got != tc.original {
					t.Errorf("%s span http.request.method_original %q, want %q", sp.name, got, tc.original)
				}
			}
			if got := attrOf(client, "http.response.status_code"); got != tc.upStatus {
				t.Errorf("client span http.response.status_code %q, want %q (the sandbox's, none when it sent none)", got, tc.upStatus)
			}
			if got := attrOf(server, telemetry.AttrErrorCode); tc.server.errType != "" && tc.client.errType != "" &&
				tc.client.errType[0] > '9' && got != tc.client.errType {
				t.Errorf("client span error.type %q, server span cube.error.code %q: one code for one failure", tc.client.errType, got)
			}
		})
	}
}
