package proxy

import (
	"bufio"
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/cube-sandbox/cubeproxy/telemetry"
)

// otlpCollector is an OTLP/HTTP trace collector that keeps every span it
// receives, as the wire carried it.
type otlpCollector struct {
	mu    sync.Mutex
	spans []*tracepb.Span
}

func (c *otlpCollector) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	req := &coltracepb.ExportTraceServiceRequest{}
	if err := proto.Unmarshal(body, req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	c.mu.Lock()
	for _, rs := range req.GetResourceSpans() {
		for _, ss := range rs.GetScopeSpans() {
			c.spans = append(c.spans, ss.GetSpans()...)
		}
	}
	c.mu.Unlock()
	out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	w.Write(out)
}

// all returns the received spans of kind.
func (c *otlpCollector) all(kind tracepb.Span_SpanKind) []*tracepb.Span {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []*tracepb.Span
	for _, s := range c.spans {
		if s.GetKind() == kind {
			out = append(out, s)
		}
	}
	return out
}

// trace returns the received spans of trace id (32 hex digits) of kind.
func (c *otlpCollector) trace(id string, kind tracepb.Span_SpanKind) []*tracepb.Span {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []*tracepb.Span
	for _, s := range c.spans {
		if hex.EncodeToString(s.GetTraceId()) == id && s.GetKind() == kind {
			out = append(out, s)
		}
	}
	return out
}

// otlpTracing starts an OTLP/HTTP collector on a loopback port and a
// telemetry exporting every trace to it, through the batch processor as
// in production. flush shuts the telemetry down, which exports every
// span ended by then.
func otlpTracing(t *testing.T) (col *otlpCollector, tel *telemetry.Telemetry, flush func()) {
	t.Helper()
	col = &otlpCollector{}
	srv := httptest.NewServer(col)
	t.Cleanup(srv.Close)
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", srv.URL) // read by otlptracehttp itself
	t.Setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "")
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "")
	t.Setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "")
	env := map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_TRACES_SAMPLER": "always_on"}
	tel, err := telemetry.New(context.Background(), telemetry.Config{Env: func(k string) string { return env[k] }})
	if err != nil {
		t.Fatal(err)
	}
	return col, tel, func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := tel.Shutdown(ctx); err != nil {
			t.Fatalf("telemetry Shutdown (flushes the spans): %v", err)
		}
	}
}

// otlpSandbox is otlpTracing with a proxy exporting to it and a sandbox
// id that answers "ok", at host.
func otlpSandbox(t *testing.T, id string) (col *otlpCollector, h *harness, host string, flush func()) {
	t.Helper()
	col, tel, flush := otlpTracing(t)
	h = newHarness(t, func(o *harnessOpts) { o.cfg.Telemetry = tel })
	port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "ok")
	}))
	return col, h, h.route(id, port), flush
}

// sendTraced sends "GET target" to host, with the header lines extra, as
// part of trace traceID (sampled) on a connection of its own, and fails
// the test unless the sandbox answers 200.
func sendTraced(t *testing.T, h *harness, target, host, extra, traceID string) {
	t.Helper()
	head := "GET " + target + " HTTP/1.1\r\nHost: " + host + "\r\n" + extra +
		"Traceparent: 00-" + traceID + "-00f067aa0ba902b7-01\r\nConnection: close\r\n\r\n"
	if st := roundTripRaw(t, h, head); st != 200 {
		t.Fatalf("GET %.40s: status %d, want 200", target, st)
	}
}

// otlpAttr returns the value of attribute k of s as a string ("" when
// absent), and whether it is there.
func otlpAttr(s *tracepb.Span, k string) (string, bool) {
	for _, a := range s.GetAttributes() {
		if a.GetKey() == k {
			return anyValueString(a.GetValue()), true
		}
	}
	return "", false
}

func anyValueString(v *commonpb.AnyValue) string {
	switch x := v.GetValue().(type) {
	case *commonpb.AnyValue_StringValue:
		return x.StringValue
	case *commonpb.AnyValue_IntValue:
		return fmt.Sprint(x.IntValue)
	case *commonpb.AnyValue_BoolValue:
		return fmt.Sprint(x.BoolValue)
	}
	return v.String()
}

// roundTripRaw sends head on a new connection to the proxy and returns
// the answer's status, its body read.
func roundTripRaw(t *testing.T, h *harness, head string) int {
	t.Helper()
	c := rawProxyConn(t, h, head)
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// The server span carries the HTTP semantic conventions' server.address
// and server.port, the host and port the client addressed (the request
// target's in absolute form, else Host's; the scheme's default port when
// it names none), and user_agent.original. Without them a trace could not
// say which name a request came in by (a sandbox host, a shared host
// with override headers, an IP literal), nor which client sent it.
func TestTracingServerSpanHostAndUserAgent(t *testing.T) {
	col, h, host, flush := otlpSandbox(t, "hostattrs")
	port := host[:strings.IndexByte(host, '-')] // the sandbox's port, as its host names it
	tests := []struct {
		name, target, headers string
		address, port, ua     string // "" = absent
	}{
		{"host without port", "/a", "Host: " + host + "\r\nUser-Agent: curl/8.5.0\r\n", host, "80", "curl/8.5.0"},
		{"host with port", "/a", "Host: " + strings.ToUpper(host) + ":8443\r\nUser-Agent: Mozilla/5.0 (X11)\r\n", strings.ToUpper(host), "8443", "Mozilla/5.0 (X11)"},
		{"absolute form", "http://" + host + ":81/a", "Host: " + host + "\r\n", host, "81", ""},
		{"ipv4 literal", "/a", "Host: 127.0.0.1:9000\r\nX-Cube-Sandbox-Id: hostattrs\r\nX-Cube-Sandbox-Port: " + port + "\r\n", "127.0.0.1", "9000", ""},
		{"ipv6 literal", "/a", "Host: [::1]:9001\r\nX-Cube-Sandbox-Id: hostattrs\r\nX-Cube-Sandbox-Port: " + port + "\r\n", "::1", "9001", ""},
	}
	for i, tc := range tests {
		traceID := fmt.Sprintf("%032x", 0x4057a0+i)
		head := "GET " + tc.target + " HTTP/1.1\r\n" + tc.headers + "Traceparent: 00-" + traceID + "-00f067aa0ba902b7-01\r\nConnection: close\r\n\r\n"
		if st := roundTripRaw(t, h, head); st != 200 {
			t.Fatalf("%s: status %d, want 200", tc.name, st)
		}
	}
	flush()
	for i, tc := range tests {
		traceID := fmt.Sprintf("%032x", 0x4057a0+i)
		spans := col.trace(traceID, tracepb.Span_SPAN_KIND_SERVER)
		if len(spans) != 1 {
			t.Errorf("%s: %d server spans received, want 1", tc.name, len(spans))
			continue
		}
		for _, a := range []struct{ key, want string }{
			{"server.address", tc.address}, {"server.port", tc.port}, {"user_agent.original", tc.ua},
		} {
			if got, _ := otlpAttr(spans[0], a.key); got != a.want {
				t.Errorf("%s: server span %s %q, want %q", tc.name, a.key, got, a.want)
			}
		}
	}
}

// A User-Agent may be as large as client.max_header_size allows: the span
// keeps its first telemetry.MaxHeaderAttr bytes, cut on a character
// boundary and valid UTF-8 (OTLP refuses a batch with a string that is
// not), so that one client cannot fill the export batches with its
// header, nor make them fail; the spans of the other requests in the
// batch arrive too. The query string, which may carry a signed
// cube_token, is in no attribute of either span.
func TestTracingLargeUserAgentTruncated(t *testing.T) {
	col, h, host, flush := otlpSandbox(t, "bigua")
	// Multi-byte characters straddle the cut, and an invalid byte comes
	// before it.
	ua := "bot/1.0 \xff " + strings.Repeat("é", 6000)
	const secret = "cube_token=s3cr3t-value"
	tests := []struct{ traceID, ua string }{
		{fmt.Sprintf("%032x", 0xb16a0), ua},
		{fmt.Sprintf("%032x", 0xb16a1), "small/1.0"},
	}
	for _, tc := range tests {
		sendTraced(t, h, "/p?"+secret+"&x=1", host, "User-Agent: "+tc.ua+"\r\n", tc.traceID)
	}
	flush()
	for i, tc := range tests {
		server := col.trace(tc.traceID, tracepb.Span_SPAN_KIND_SERVER)
		client := col.trace(tc.traceID, tracepb.Span_SPAN_KIND_CLIENT)
		if len(server) != 1 || len(client) != 1 {
			t.Fatalf("request %d: %d server and %d client spans received, want 1 and 1", i, len(server), len(client))
		}
		got, ok := otlpAttr(server[0], "user_agent.original")
		if !ok {
			t.Fatalf("request %d: no user_agent.original", i)
		}
		if !utf8.ValidString(got) {
			t.Errorf("request %d: user_agent.original is not valid UTF-8", i)
		}
		want := strings.ToValidUTF8(tc.ua, "\uFFFD")
		if len(want) > telemetry.MaxHeaderAttr {
			if len(got) > telemetry.MaxHeaderAttr || len(got) < telemetry.MaxHeaderAttr-utf8.UTFMax || !strings.HasPrefix(want, got) {
				t.Errorf("request %d: user_agent.original of %d bytes (%q...), want the first %d bytes or a character less of %q...",
					i, len(got), got[:min(len(got), 20)], telemetry.MaxHeaderAttr, want[:20])
			}
		} else if got != want {
			t.Errorf("request %d: user_agent.original %q, want %q", i, got, want)
		}
		for _, s := range append(server, client...) {
			for _, a := range s.GetAttributes() {
				if v := anyValueString(a.GetValue()); strings.Contains(v, "s3cr3t") || strings.Contains(v, "x=1") {
					t.Errorf("request %d: %v span attribute %s = %q carries the query string", i, s.GetKind(), a.GetKey(), v)
				}
			}
		}
	}
}

// url.path is cut at telemetry.MaxPathAttr, on a character boundary, as
// the user agent is: a path may be as long as client.max_header_size, and
// a batch of spans carrying 12 KiB paths was over what a collector takes,
// so the other requests' spans in it were lost too.
func TestTracingLongPathTruncated(t *testing.T) {
	col, h, host, flush := otlpSandbox(t, "longpath")
	long := "/" + strings.Repeat("%C3%A9", 2000) // 12 KiB as sent
	tests := []struct{ traceID, path string }{
		{fmt.Sprintf("%032x", 0x1a7a0), long},
		{fmt.Sprintf("%032x", 0x1a7a1), "/short"},
	}
	for _, tc := range tests {
		sendTraced(t, h, tc.path+"?q=1", host, "", tc.traceID)
	}
	flush()
	for i, tc := range tests {
		server := col.trace(tc.traceID, tracepb.Span_SPAN_KIND_SERVER)
		if len(server) != 1 {
			t.Fatalf("request %d: %d server spans received, want 1", i, len(server))
		}
		got, _ := otlpAttr(server[0], "url.path")
		want := tc.path
		if len(want) > telemetry.MaxPathAttr {
			want = want[:telemetry.MaxPathAttr]
		}
		if got != want {
			t.Errorf("request %d: url.path of %d bytes (%.20q...), want the first %d of %d", i, len(got), got, len(want), len(tc.path))
		}
	}
}

// http.request.method_original, the method as sent beside an "_OTHER"
// http.request.method, is cut at telemetry.MaxHeaderAttr as the user agent
// is: fasthttp takes a method as long as client.max_header_size allows,
// and it went whole into both spans of the request, so that a few such
// requests made a batch larger than a collector takes, and the other
// requests' spans in it were lost too.
func TestTracingLongMethodTruncated(t *testing.T) {
	col, h, host, flush := otlpSandbox(t, "longmethod")
	long := "PROPFIND" + strings.Repeat("X", 20000)
	tests := []struct{ traceID, method string }{
		{fmt.Sprintf("%032x", 0x3e7a0), long},
		{fmt.Sprintf("%032x", 0x3e7a1), "PROPFIND"},
	}
	for _, tc := range tests {
		head := tc.method + " / HTTP/1.1\r\nHost: " + host + "\r\n" +
			"Traceparent: 00-" + tc.traceID + "-00f067aa0ba902b7-01\r\nConnection: close\r\n\r\n"
		if st := roundTripRaw(t, h, head); st != 200 {
			t.Fatalf("%.20s...: status %d, want 200 (the test needs the proxy to forward the method)", tc.method, st)
		}
	}
	flush()
	for i, tc := range tests {
		want := tc.method[:min(len(tc.method), telemetry.MaxHeaderAttr)]
		spans := append(col.trace(tc.traceID, tracepb.Span_SPAN_KIND_SERVER), col.trace(tc.traceID, tracepb.Span_SPAN_KIND_CLIENT)...)
		if len(spans) != 2 {
			t.Fatalf("request %d: %d spans received, want a server and a client span", i, len(spans))
		}
		for _, s := range spans {
			if got, _ := otlpAttr(s, "http.request.method_original"); got != want {
				t.Errorf("request %d: %v span http.request.method_original of %d bytes (%.20q...), want the first %d of %d",
					i, s.GetKind(), len(got), got, len(want), len(tc.method))
			}
		}
	}
}
