package telemetry

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math"
	"net/netip"
	"strings"
	"testing"

	"github.com/valyala/fasthttp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

const (
	clientTraceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	clientSpanID  = "00f067aa0ba902b7"
)

func inbound(method, traceparent string) *fasthttp.RequestHeader {
	h := &fasthttp.RequestHeader{}
	h.SetMethod(method)
	if traceparent != "" {
		h.Set("Traceparent", traceparent)
	}
	return h
}

func TestTracingOffByDefault(t *testing.T) {
	tel := newTestTelemetry(t, Config{})
	if tel.TracingEnabled() {
		t.Fatal("tracing on with no OTEL_TRACES_EXPORTER")
	}
	in := inbound("GET", "00-"+clientTraceID+"-"+clientSpanID+"-01")
	ctx, span := tel.StartServerSpan(in, false, netip.Addr{})
	if span.IsRecording() || span.SpanContext().IsValid() {
		t.Errorf("tracing off: span recording=%v valid=%v", span.IsRecording(), span.SpanContext().IsValid())
	}
	if ctx != context.Background() {
		t.Error("tracing off: StartServerSpan must return context.Background()")
	}
	out := &fasthttp.RequestHeader{}
	tel.StartClientSpan(ctx, out, netip.MustParseAddrPort("10.0.0.2:80"))
	if v := out.Peek("traceparent"); v != nil {
		t.Errorf("tracing off injected traceparent %q", v)
	}

	// The client's own trace context is an end-to-end header like any
	// other: with the proxy's tracing off (the default) it reaches the
	// sandbox as sent, so an agent's tracing still spans the proxy.
	clientTP := "00-" + clientTraceID + "-" + clientSpanID + "-01"
	out = &fasthttp.RequestHeader{}
	out.Set("traceparent", clientTP)
	out.Set("tracestate", "vendor=opaque")
	tel.StartClientSpan(ctx, out, netip.MustParseAddrPort("10.0.0.2:80"))
	if tp, ts := string(out.Peek("traceparent")), string(out.Peek("tracestate")); tp != clientTP || ts != "vendor=opaque" {
		t.Errorf("tracing off: the client's traceparent %q / tracestate %q reached the sandbox as %q / %q", clientTP, "vendor=opaque", tp, ts)
	}
}

func TestServerAndClientSpansExported(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tel := newTestTelemetry(t, Config{SpanExporter: exp})
	if !tel.TracingEnabled() {
		t.Fatal("tracing off with an injected exporter")
	}
	in := inbound("POST", "00-"+clientTraceID+"-"+clientSpanID+"-00")
	ctx, server := tel.StartServerSpan(in, false, netip.Addr{})
	out := &fasthttp.RequestHeader{}
	out.SetMethod("POST")
	out.Set("traceparent", "00-ffffffffffffffffffffffffffffffff-ffffffffffffffff-01") // the client's copy, to be replaced
	client := tel.StartClientSpan(ctx, out, netip.MustParseAddrPort("10.0.0.2:32001"))
	EndClientSpan(client, 502, "upstream_reset", errors.New("connection reset"))
	EndServerSpan(server, &SpanResult{
		SandboxID: "sb-1", Port: 50005, Kind: RouteSSE, Status: 502, Upstream: "10.0.0.2:32001",
		BytesIn: 12, BytesOut: 34, Retries: 1, Cache: CacheHit, ErrorCode: "upstream_reset",
	})

	spans := exp.GetSpans()
	if len(spans) != 2 {
		t.Fatalf("exported %d spans, want 2", len(spans))
	}
	c, s := spans[0], spans[1] // the client span ends first
	if s.Name != "proxy POST" || s.SpanKind != trace.SpanKindServer {
		t.Errorf("server span: name %q kind %v", s.Name, s.SpanKind)
	}
	if c.Name != "upstream POST" || c.SpanKind != trace.SpanKindClient {
		t.Errorf("client span: name %q kind %v", c.Name, c.SpanKind)
	}
	if got := s.SpanContext.TraceID().String(); got != clientTraceID {
		t.Errorf("server trace id %s, want the client's %s", got, clientTraceID)
	}
	if got := s.Parent.SpanID().String(); got != clientSpanID || !s.Parent.IsRemote() {
		t.Errorf("server parent %s remote=%v, want remote %s", got, s.Parent.IsRemote(), clientSpanID)
	}
	if c.Parent.SpanID() != s.SpanContext.SpanID() {
		t.Errorf("client span parent %s, want server span %s", c.Parent.SpanID(), s.SpanContext.SpanID())
	}
	wantTP := "00-" + clientTraceID + "-" + c.SpanContext.SpanID().String() + "-01"
	if got := string(out.Peek("traceparent")); got != wantTP {
		t.Errorf("upstream traceparent %q, want %q", got, wantTP)
	}
	assertAttrs(t, "server", s.Attributes, map[attribute.Key]any{
		"http.request.method":       "POST",
		AttrSandboxID:               "sb-1",
		AttrSandboxPort:             int64(50005),
		AttrRouteKind:               "sse",
		"http.response.status_code": int64(502),
		AttrUpstream:                "10.0.0.2:32001",
		"http.request.body.size":    int64(12),
		"http.response.body.size":   int64(34),
		AttrRetries:                 int64(1),
		AttrCacheResult:             "hit",
		AttrErrorCode:               "upstream_reset",
	})
	assertAttrs(t, "client", c.Attributes, map[attribute.Key]any{
		"http.request.method":       "POST",
		"server.address":            "10.0.0.2",
		"server.port":               int64(32001),
		"http.response.status_code": int64(502),
	})
	if s.Status.Code != codes.Error || c.Status.Code != codes.Error {
		t.Errorf("status codes server=%v client=%v, want Error for a 502", s.Status.Code, c.Status.Code)
	}
	if len(c.Events) == 0 || c.Events[0].Name != "exception" {
		t.Errorf("client span events %v, want the recorded error", c.Events)
	}
}

func assertAttrs(t *testing.T, which string, got []attribute.KeyValue, want map[attribute.Key]any) {
	t.Helper()
	m := make(map[attribute.Key]any, len(got))
	for _, kv := range got {
		m[kv.Key] = kv.Value.AsInterface()
	}
	for k, v := range want {
		if m[k] != v {
			t.Errorf("%s span %s = %v (%T), want %v", which, k, m[k], m[k], v)
		}
	}
}

// TestSamplerIgnoresClientFlag proves the client's sampled flag decides
// nothing: the ratio does.
func TestSamplerIgnoresClientFlag(t *testing.T) {
	tests := []struct {
		name        string
		ratio       float64
		env         map[string]string
		traceparent string
		sampled     bool
	}{
		{"ratio 0 ignores -01", 0, map[string]string{"OTEL_TRACES_SAMPLER_ARG": "0"}, "00-" + clientTraceID + "-" + clientSpanID + "-01", false},
		{"ratio 1 ignores -00", 1, nil, "00-" + clientTraceID + "-" + clientSpanID + "-00", true},
		{"ratio 1 with -01", 1, nil, "00-" + clientTraceID + "-" + clientSpanID + "-01", true},
		{"ratio 1 root", 1, nil, "", true},
		{"ratio 0 root", 0, map[string]string{"OTEL_TRACES_SAMPLER_ARG": "0"}, "", false},
		// The trace id's low 63 bits decide: ...0001 is far below 1 %, a3ce... far above.
		{"1% low trace id sampled despite -00", 0.01, nil, "00-4bf92f3577b34da60000000000000001-" + clientSpanID + "-00", true},
		{"1% high trace id unsampled despite -01", 0.01, nil, "00-" + clientTraceID + "-" + clientSpanID + "-01", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			exp := tracetest.NewInMemoryExporter()
			tel := newTestTelemetry(t, Config{SpanExporter: exp, TraceSampleRatio: tt.ratio, Env: envMap(tt.env)})
			ctx, server := tel.StartServerSpan(inbound("GET", tt.traceparent), false, netip.Addr{})
			out := &fasthttp.RequestHeader{}
			client := tel.StartClientSpan(ctx, out, netip.MustParseAddrPort("10.0.0.2:80"))
			if server.SpanContext().IsSampled() != tt.sampled || client.SpanContext().IsSampled() != tt.sampled {
				t.Errorf("sampled server=%v client=%v, want %v", server.SpanContext().IsSampled(), client.SpanContext().IsSampled(), tt.sampled)
			}
			EndClientSpan(client, 200, "", nil)
			EndServerSpan(server, &SpanResult{Status: 200})
			want := 0
			if tt.sampled {
				want = 2
			}
			if n := len(exp.GetSpans()); n != want {
				t.Errorf("exported %d spans, want %d", n, want)
			}
			flag := "-00"
			if tt.sampled {
				flag = "-01"
			}
			if tp := string(out.Peek("traceparent")); !strings.HasSuffix(tp, flag) {
				t.Errorf("upstream traceparent %q, want flag %s", tp, flag)
			}
		})
	}
}

func TestPropagatorRoundTrip(t *testing.T) {
	tel := newTestTelemetry(t, Config{})
	tp := "00-" + clientTraceID + "-" + clientSpanID + "-01"
	in := inbound("GET", tp)
	in.Set("Tracestate", "vendor=abc")
	in.Add("Baggage", "tenant=a")
	in.Add("Baggage", "user=b")
	c := HeaderCarrier{H: in}
	if got := c.Values("baggage"); len(got) != 2 || got[0] != "tenant=a" || got[1] != "user=b" {
		t.Errorf("Values(baggage) = %q", got)
	}
	keys := strings.Join(c.Keys(), ",")
	if !strings.Contains(keys, "Traceparent") || !strings.Contains(keys, "Baggage") {
		t.Errorf("Keys() = %s", keys)
	}

	ctx := tel.Propagator().Extract(context.Background(), c)
	if sc := trace.SpanContextFromContext(ctx); sc.TraceID().String() != clientTraceID || !sc.IsRemote() {
		t.Fatalf("extracted span context %v", sc)
	}
	out := &fasthttp.RequestHeader{}
	tel.Propagator().Inject(ctx, HeaderCarrier{H: out})
	if got := string(out.Peek("traceparent")); got != tp {
		t.Errorf("injected traceparent %q, want %q", got, tp)
	}
	if got := string(out.Peek("tracestate")); got != "vendor=abc" {
		t.Errorf("injected tracestate %q", got)
	}
	// Baggage is the client's, passed as sent: the propagator neither
	// reads nor writes it.
	if got := out.Peek("baggage"); got != nil {
		t.Errorf("injected baggage %q, want none", got)
	}
}

func TestSpanNamesBounded(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tel := newTestTelemetry(t, Config{SpanExporter: exp})
	for _, m := range []string{"GET", "PROPFIND", "X-RANDOM-12345"} {
		_, span := tel.StartServerSpan(inbound(m, ""), false, netip.Addr{})
		EndServerSpan(span, &SpanResult{Status: 200})
	}
	var names []string
	for _, s := range exp.GetSpans() {
		names = append(names, s.Name)
	}
	if got := strings.Join(names, ","); got != "proxy GET,proxy OTHER,proxy OTHER" {
		t.Errorf("span names %s", got)
	}
}

func TestTraceConfig(t *testing.T) {
	tests := []struct {
		name    string
		env     map[string]string
		ratio   float64
		wantErr string
		on      bool
	}{
		{"unset is off", nil, 0, "", false},
		{"none is off", map[string]string{"OTEL_TRACES_EXPORTER": "none"}, 0, "", false},
		{"otlp default http", map[string]string{"OTEL_TRACES_EXPORTER": "otlp"}, 0, "", true},
		{"otlp grpc", map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, 0, "", true},
		{"traces protocol wins", map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "bogus", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf"}, 0, "", true},
		{"unsupported exporter", map[string]string{"OTEL_TRACES_EXPORTER": "zipkin"}, 0, "OTEL_TRACES_EXPORTER", false},
		{"unsupported protocol", map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, 0, "protocol", false},
		{"ratio above 1", map[string]string{"OTEL_TRACES_EXPORTER": "otlp"}, 1.5, "ratio", false},
		{"bad sampler arg", map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_TRACES_SAMPLER_ARG": "lots"}, 0, "OTEL_TRACES_SAMPLER_ARG", false},
		{"NaN sampler arg", map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_TRACES_SAMPLER_ARG": "NaN"}, 0, "OTEL_TRACES_SAMPLER_ARG", false},
		{"NaN ratio", map[string]string{"OTEL_TRACES_EXPORTER": "otlp"}, math.NaN(), "ratio", false},
		{"sdk disabled", map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_SDK_DISABLED": "TRUE"}, 0, "", false},
		{"sdk not disabled", map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_SDK_DISABLED": "false"}, 0, "", true},
		{"sampler always_off", map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_TRACES_SAMPLER": "always_off"}, 0.5, "", false},
		{"sampler parentbased_always_off", map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_TRACES_SAMPLER": "parentbased_always_off"}, 0, "", false},
		{"sampler ratio", map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_TRACES_SAMPLER": "parentbased_traceidratio"}, 0, "", true},
		{"unsupported sampler", map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_TRACES_SAMPLER": "jaeger_remote"}, 0, "OTEL_TRACES_SAMPLER", false},
		{"sampler without exporter", map[string]string{"OTEL_TRACES_SAMPLER": "jaeger_remote"}, 0, "", false},
		// An endpoint the exporter cannot use: no trace would ever arrive.
		{"endpoint URL", map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, 0, "", true},
		{"endpoint without scheme", map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_ENDPOINT": "collector:4318"}, 0,
			`OTEL_EXPORTER_OTLP_ENDPOINT="collector:4318": want an http or https URL`, false},
		{"grpc endpoint without scheme", map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_EXPORTER_OTLP_ENDPOINT": "collector:4317"}, 0,
			"OTEL_EXPORTER_OTLP_ENDPOINT", false},
		{"unparsable traces endpoint", map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "::bad"}, 0,
			"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", false},
		// The exporters drop a URL's userinfo, and the error never shows it.
		{"endpoint with userinfo", map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://user:s3cret@collector:4318"}, 0,
			"OTEL_EXPORTER_OTLP_ENDPOINT (not shown: it holds an @, as user:password@ would): the exporter does not send a URL's user:password@", false},
		{"endpoint without scheme with userinfo", map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "user:s3cret@collector:4318"}, 0,
			"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT (not shown", false},
		// The exporters drop a URL's query too (a key in it never reached
		// the collector), and the error never shows it.
		{"endpoint with a query", map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "https://collector/v1/traces?api_key=s3cret"}, 0,
			"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT (not shown: it holds a query, as ?api_key= would): the exporter does not send a URL's query", false},
		{"grpc endpoint with an empty query", map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4317?"}, 0,
			"does not send a URL's query", false},
		{"endpoint with a fragment", map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318#s3cret"}, 0,
			"does not send a URL's query or fragment", false},
		{"traces endpoint wins", map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_ENDPOINT": "collector:4318",
			"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "https://collector:4318/v1/traces"}, 0, "", true},
		// The exporters take OTEL_EXPORTER_OTLP_INSECURE over the scheme,
		// and anything but "true" as false (TLS).
		{"insecure true with http", map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318", "OTEL_EXPORTER_OTLP_INSECURE": "true"}, 0, "", true},
		{"insecure false with https", map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_ENDPOINT": "https://collector:4318", "OTEL_EXPORTER_OTLP_INSECURE": "FALSE"}, 0, "", true},
		{"insecure false with http", map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318", "OTEL_EXPORTER_OTLP_INSECURE": "false"}, 0,
			"OTEL_EXPORTER_OTLP_INSECURE=false contradicts the http endpoint", false},
		{"insecure 1 with http", map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318", "OTEL_EXPORTER_OTLP_INSECURE": "1"}, 0,
			`OTEL_EXPORTER_OTLP_INSECURE="1": want true or false`, false},
		{"insecure true with https", map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_EXPORTER_OTLP_ENDPOINT": "https://collector:4317", "OTEL_EXPORTER_OTLP_INSECURE": "true"}, 0,
			"contradicts the https endpoint", false},
		{"traces insecure wins", map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces",
			"OTEL_EXPORTER_OTLP_INSECURE": "false", "OTEL_EXPORTER_OTLP_TRACES_INSECURE": "true"}, 0, "", true},
		{"traces insecure contradicts", map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318",
			"OTEL_EXPORTER_OTLP_INSECURE": "true", "OTEL_EXPORTER_OTLP_TRACES_INSECURE": "false"}, 0, "OTEL_EXPORTER_OTLP_TRACES_INSECURE", false},
		{"insecure without endpoint", map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_INSECURE": "true"}, 0, "", true},
		{"insecure yes without endpoint", map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_INSECURE": "yes"}, 0, "OTEL_EXPORTER_OTLP_INSECURE", false},
		{"bad insecure while tracing is off", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318", "OTEL_EXPORTER_OTLP_INSECURE": "false"}, 0, "", false},
		{"bad endpoint while tracing is off", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "collector:4318"}, 0, "", false},
		// The exporters send anything but "gzip" uncompressed.
		{"compression gzip", map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_COMPRESSION": "gzip", "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION": "none"}, 0, "", true},
		{"compression zstd", map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_COMPRESSION": "zstd"}, 0, `OTEL_EXPORTER_OTLP_COMPRESSION="zstd": want gzip or none`, false},
		{"traces compression GZIP", map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION": "GZIP"}, 0, "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION", false},
		{"bad compression while tracing is off", map[string]string{"OTEL_EXPORTER_OTLP_COMPRESSION": "zstd"}, 0, "", false},
		// The exporters skip a header entry they cannot use, quoting it in
		// the log: the error names the entry, never its value.
		{"headers", map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_HEADERS": " Authorization=Bearer%20tok , x-team=a=b,x-end=c%0A,",
			"OTEL_EXPORTER_OTLP_TRACES_HEADERS": "api-key=k"}, 0, "", true},
		{"header without =", map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_HEADERS": "a=b,x-api-key:s3cret"}, 0,
			`OTEL_EXPORTER_OTLP_HEADERS: entry 2 has no "="`, false},
		{"header bad escape", map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_TRACES_HEADERS": "Authorization=Bearer s3cret%"}, 0,
			`OTEL_EXPORTER_OTLP_TRACES_HEADERS: the value of "Authorization" has a bad percent escape`, false},
		{"header bad name", map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_HEADERS": "api key=s3cret"}, 0,
			`entry 1: the name "api" is followed by " "`, false},
		// A ':' for the '=' and base64's padding: the credential is in the
		// name, which is not shown past its ':'.
		{"header name holding the credential", map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_HEADERS": "Authorization:Basic s3cretdXNlcjpw=="}, 0,
			`entry 1: the name "Authorization" is followed by ":"`, false},
		{"header without a name", map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_HEADERS": "a=b, =s3cret"}, 0,
			`entry 2 has no name`, false},
		// gRPC refuses, at every call, a name outside [0-9a-z-_.] and a
		// value that is not printable ASCII (but in a -bin header), which
		// the HTTP client sends.
		{"grpc header value not ASCII", map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_EXPORTER_OTLP_HEADERS": "x-api-key=s3cret-t%C3%B6ken"}, 0,
			`OTEL_EXPORTER_OTLP_HEADERS: the value of "x-api-key" is not printable ASCII`, false},
		{"grpc header name", map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc", "OTEL_EXPORTER_OTLP_TRACES_HEADERS": "X-Api-Key=k, x!team=s3cret"}, 0,
			`OTEL_EXPORTER_OTLP_TRACES_HEADERS: the name "x!team" holds "!"`, false},
		{"grpc header -bin value", map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_EXPORTER_OTLP_HEADERS": "X-Api-Key=k, x-tok-BIN=t%C3%B6ken"}, 0, "", true},
		{"http header value not ASCII", map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_HEADERS": "x-api-key=t%C3%B6ken, x!team=a"}, 0, "", true},
		{"header control character", map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_HEADERS": "k=s3%0Acret%0A"}, 0,
			`the value of "k" holds a control character`, false},
		{"bad headers while tracing is off", map[string]string{"OTEL_EXPORTER_OTLP_HEADERS": "x-api-key:s3cret"}, 0, "", false},
		// Switched off, the exporter setting is not looked at: OTEL_SDK_DISABLED
		// is how an operator turns a broken telemetry setup off.
		{"sdk disabled, unsupported exporter", map[string]string{"OTEL_TRACES_EXPORTER": "zipkin", "OTEL_SDK_DISABLED": "true"}, 0, "", false},
		{"always_off, unsupported exporter", map[string]string{"OTEL_TRACES_EXPORTER": "jaeger", "OTEL_TRACES_SAMPLER": "always_off"}, 0, "", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tel, err := New(context.Background(), Config{Env: envMap(tt.env), TraceSampleRatio: tt.ratio})
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("New error %v, want one mentioning %q", err, tt.wantErr)
				}
				if strings.Contains(err.Error(), "s3cret") {
					t.Errorf("New error %q shows a header's value", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("New: %v", err)
			}
			defer tel.Shutdown(context.Background())
			if tel.TracingEnabled() != tt.on {
				t.Errorf("TracingEnabled = %v, want %v", tel.TracingEnabled(), tt.on)
			}
		})
	}
}

// TestBatchSettingsFromProcessEnv: the batch processor's variables, read
// from the process environment as the SDK read them, unchecked: a negative
// queue or batch size panicked in New ("makeslice: cap out of range"),
// taking serve down with a stack trace instead of an error naming the
// variable; a zero schedule delay started an export loop that spun; a word
// was replaced by the default, said nowhere. check refuses what serve does.
func TestBatchSettingsFromProcessEnv(t *testing.T) {
	for _, tt := range []struct {
		env     map[string]string
		wantErr string // "" accepted
		on      bool
	}{
		{map[string]string{"OTEL_BSP_MAX_QUEUE_SIZE": "4096"}, "", true},
		{map[string]string{"OTEL_BSP_MAX_QUEUE_SIZE": "-1"}, "OTEL_BSP_MAX_QUEUE_SIZE", true},
		{map[string]string{"OTEL_BSP_MAX_QUEUE_SIZE": "0"}, "OTEL_BSP_MAX_QUEUE_SIZE", true},
		{map[string]string{"OTEL_BSP_MAX_QUEUE_SIZE": "1000000000"}, "OTEL_BSP_MAX_QUEUE_SIZE", true},
		{map[string]string{"OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "-1"}, "OTEL_BSP_MAX_EXPORT_BATCH_SIZE", true},
		{map[string]string{"OTEL_BSP_MAX_QUEUE_SIZE": "100", "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "1000"}, "", true},
		{map[string]string{"OTEL_BSP_SCHEDULE_DELAY": "0"}, "OTEL_BSP_SCHEDULE_DELAY", true},
		{map[string]string{"OTEL_BSP_SCHEDULE_DELAY": "5s"}, "OTEL_BSP_SCHEDULE_DELAY", true},
		{map[string]string{"OTEL_BSP_EXPORT_TIMEOUT": "0"}, "", true},
		{map[string]string{"OTEL_BSP_EXPORT_TIMEOUT": "-1"}, "OTEL_BSP_EXPORT_TIMEOUT", true},
		// Tracing off: not looked at.
		{map[string]string{"OTEL_BSP_MAX_QUEUE_SIZE": "-1"}, "", false},
	} {
		t.Run(fmt.Sprint(tt.env, tt.on), func(t *testing.T) {
			if tt.on {
				t.Setenv("OTEL_TRACES_EXPORTER", "otlp")
			} else {
				t.Setenv("OTEL_TRACES_EXPORTER", "none")
			}
			t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1")
			for k, v := range tt.env {
				t.Setenv(k, v)
			}
			var tel *Telemetry
			var err error
			func() {
				defer func() {
					if p := recover(); p != nil {
						err = fmt.Errorf("panic: %v", p)
					}
				}()
				tel, err = New(context.Background(), Config{})
			}()
			checkErr := (Config{}).Check()
			if tt.wantErr == "" {
				if err != nil || checkErr != nil {
					t.Fatalf("New: %v; Check: %v; want both to accept", err, checkErr)
				}
				defer tel.Shutdown(context.Background())
				if tel.TracingEnabled() != tt.on {
					t.Errorf("TracingEnabled = %v, want %v", tel.TracingEnabled(), tt.on)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("New: %v, want an error naming %s", err, tt.wantErr)
			}
			if checkErr == nil || !strings.Contains(checkErr.Error(), tt.wantErr) {
				t.Errorf("Check: %v, want it refused as serve refuses it", checkErr)
			}
			if err == nil {
				tel.Shutdown(context.Background())
			}
		})
	}
}

func TestSampleRatioResolution(t *testing.T) {
	exp := tracetest.NewNoopExporter()
	tests := []struct {
		name string
		cfg  Config
		env  map[string]string
		want float64
	}{
		{"otlp default", Config{}, nil, DefaultSampleRatio},
		{"injected exporter default", Config{SpanExporter: exp}, nil, 1},
		{"config wins", Config{TraceSampleRatio: 0.5}, map[string]string{"OTEL_TRACES_SAMPLER_ARG": "0.2"}, 0.5},
		{"env arg", Config{}, map[string]string{"OTEL_TRACES_SAMPLER_ARG": "0.2"}, 0.2},
		{"env arg zero", Config{SpanExporter: exp}, map[string]string{"OTEL_TRACES_SAMPLER_ARG": "0"}, 0},
		{"always_on", Config{}, map[string]string{"OTEL_TRACES_SAMPLER": "always_on", "OTEL_TRACES_SAMPLER_ARG": "0.2"}, 1},
		{"config wins over always_on", Config{TraceSampleRatio: 0.5}, map[string]string{"OTEL_TRACES_SAMPLER": "always_on"}, 0.5},
		{"parentbased_always_on", Config{}, map[string]string{"OTEL_TRACES_SAMPLER": " ParentBased_Always_On", "OTEL_TRACES_SAMPLER_ARG": "0.2"}, 1},
		{"traceidratio takes the arg", Config{}, map[string]string{"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.2"}, 0.2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := tt.cfg.sampleRatio(envMap(tt.env))
			if err != nil || got != tt.want {
				t.Errorf("sampleRatio = %v, %v; want %v", got, err, tt.want)
			}
		})
	}
}

// An export batch is never larger than the queue, as the SDK makes it for
// the variables it reads itself: the proxy's options win over its
// reading, so without the clamp here OTEL_BSP_MAX_EXPORT_BATCH_SIZE over
// the queue size would reach the processor as set.
func TestBatchSettingsBatchWithinQueue(t *testing.T) {
	for _, tt := range []struct {
		env          map[string]string
		queue, batch int
	}{
		{nil, 2048, 512},
		{map[string]string{"OTEL_BSP_MAX_QUEUE_SIZE": "100", "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "1000"}, 100, 100},
		{map[string]string{"OTEL_BSP_MAX_QUEUE_SIZE": "300"}, 300, 300},
		{map[string]string{"OTEL_BSP_MAX_QUEUE_SIZE": "4096", "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "3000"}, 4096, 3000},
		{map[string]string{"OTEL_BSP_MAX_QUEUE_SIZE": "4096", "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "5000"}, 4096, 512},
	} {
		s, err := readBatchSettings(envMap(tt.env))
		if err != nil || s.queue != tt.queue || s.batch != tt.batch {
			t.Errorf("%v: queue %d batch %d (%v), want queue %d batch %d", tt.env, s.queue, s.batch, err, tt.queue, tt.batch)
		}
	}
}

// The proxy's trace context replaces every copy the client sent: a second
// traceparent, or a tracestate whose traceparent was invalid, would
// otherwise reach the sandbox next to the proxy's.
func TestInjectReplacesEveryClientCopy(t *testing.T) {
	tel := newTestTelemetry(t, Config{SpanExporter: tracetest.NewInMemoryExporter()})
	for _, tc := range []struct {
		name        string
		traceparent []string
		tracestate  string
	}{
		{"two traceparents", []string{"00-" + clientTraceID + "-" + clientSpanID + "-01", "00-ffffffffffffffffffffffffffffffff-ffffffffffffffff-01"}, ""},
		{"tracestate of an invalid traceparent", []string{"garbage"}, "vendor=forged"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := &fasthttp.RequestHeader{}
			h.SetMethod("GET")
			for _, v := range tc.traceparent {
				h.Add("traceparent", v)
			}
			if tc.tracestate != "" {
				h.Set("tracestate", tc.tracestate)
			}
			ctx, server := tel.StartServerSpan(h, false, netip.Addr{})
			client := tel.StartClientSpan(ctx, h, netip.MustParseAddrPort("10.0.0.2:80"))
			EndClientSpan(client, 200, "", nil)
			EndServerSpan(server, &SpanResult{Status: 200})
			want := "00-" + client.SpanContext().TraceID().String() + "-" + client.SpanContext().SpanID().String() + "-01"
			if got := h.PeekAll("traceparent"); len(got) != 1 || string(got[0]) != want {
				t.Errorf("traceparent sent upstream %q, want only %q", got, want)
			}
			if got := h.PeekAll("tracestate"); len(got) != 0 {
				t.Errorf("tracestate sent upstream %q, want none", got)
			}
		})
	}
	// The client's baggage is not the proxy's: it passes as sent, whether
	// OpenTelemetry could carry it or not.
	for _, bag := range []string{"not a member", "k=" + strings.Repeat("v", 9000), "b=2,a=1", "k=a%2Fb"} {
		h := &fasthttp.RequestHeader{}
		h.SetMethod("GET")
		h.Set("baggage", bag)
		ctx, server := tel.StartServerSpan(h, false, netip.Addr{})
		client := tel.StartClientSpan(ctx, h, netip.MustParseAddrPort("10.0.0.2:80"))
		EndClientSpan(client, 200, "", nil)
		EndServerSpan(server, &SpanResult{Status: 200})
		if got := string(h.Peek("baggage")); got != bag {
			t.Errorf("baggage %.40q (%d bytes) became %.40q (%d bytes)", bag, len(bag), got, len(got))
		}
	}
}

// The proxy's trace context takes the place of the client's lines, and
// every other line stays where it was: deleting the client's traceparent
// moved the head's last line into its place (fasthttp's swap delete), and
// a field sent on several lines reached the sandbox reordered (RFC 9110
// 5.3) whenever a client sent a trace context with tracing on.
func TestInjectKeepsOtherLinesInOrder(t *testing.T) {
	tel := newTestTelemetry(t, Config{SpanExporter: tracetest.NewInMemoryExporter()})
	valid := "00-" + clientTraceID + "-" + clientSpanID + "-01"
	for _, tc := range []struct{ name, trace string }{
		{"traceparent", "Traceparent: " + valid + "\r\n"},
		{"traceparent and tracestate", "Traceparent: " + valid + "\r\nTracestate: a=1\r\n"},
		{"two traceparents", "Traceparent: " + valid + "\r\nTraceparent: " + valid + "\r\n"},
		// Not a tracestate the span does not inherit (its traceparent
		// invalid): deleted, it still moves the head's last line.
	} {
		t.Run(tc.name, func(t *testing.T) {
			var h fasthttp.RequestHeader
			raw := "GET / HTTP/1.1\r\nHost: a\r\n" + tc.trace + "Accept: a\r\nX-Other: 1\r\nAccept: b\r\nAccept: c\r\n\r\n"
			if err := h.Read(bufio.NewReader(strings.NewReader(raw))); err != nil {
				t.Fatal(err)
			}
			ctx, server := tel.StartServerSpan(&h, false, netip.Addr{})
			client := tel.StartClientSpan(ctx, &h, netip.MustParseAddrPort("10.0.0.2:80"))
			EndClientSpan(client, 200, "", nil)
			EndServerSpan(server, &SpanResult{Status: 200})
			if got := fmt.Sprintf("%q", h.PeekAll("Accept")); got != `["a" "b" "c"]` {
				t.Errorf("Accept lines sent upstream %s, want a, b, c: %q", got, h.Header())
			}
			if got := h.PeekAll("traceparent"); len(got) != 1 || !strings.Contains(string(got[0]), client.SpanContext().SpanID().String()) {
				t.Errorf("traceparent sent upstream %q, want only the proxy's", got)
			}
		})
	}
}

// url.path is the path the client asked for, never its query (where a
// signed token may travel), whatever the form of the request target, nor
// the userinfo of a target whose path begins with an authority ("//user:pw@
// host/p", which fasthttp reads as one and the access log redacts); an
// https listener's spans say so in url.scheme; client.address names the
// connection's peer.
func TestServerSpanURL(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tel := newTestTelemetry(t, Config{SpanExporter: exp})
	tests := []struct {
		target, path string
		tls          bool
	}{
		{"/", "/", false},
		{"/mcp/sse?cube_sig=secret", "/mcp/sse", true},
		{"/a%2Fb/../c", "/a%2Fb/../c", false},
		{"http://8080-sb.cube.test/x/y?z=1", "/x/y", false},
		{"https://8080-sb.cube.test", "/", true},
		{"*", "*", false},
		{"//user:secret@8080-sb.cube.test/x?y=1", "//REDACTED@8080-sb.cube.test/x", false},
		{"//secret@8080-sb.cube.test", "//REDACTED@8080-sb.cube.test", false},
		{"//a@b@8080-sb.cube.test/x@y", "//REDACTED@8080-sb.cube.test/x@y", false},
		{"//8080-sb.cube.test/x@y", "//8080-sb.cube.test/x@y", false},
		{"/x//user:pw@h/y", "/x//user:pw@h/y", false}, // a path, no authority
	}
	for _, tc := range tests {
		t.Run(tc.target, func(t *testing.T) {
			exp.Reset()
			h := inbound("OPTIONS", "")
			h.SetRequestURI(tc.target)
			client := netip.MustParseAddr("2001:db8::7")
			_, span := tel.StartServerSpan(h, tc.tls, client)
			EndServerSpan(span, &SpanResult{Status: 200})
			spans := exp.GetSpans()
			if len(spans) != 1 {
				t.Fatalf("%d spans", len(spans))
			}
			scheme := "http"
			if tc.tls {
				scheme = "https"
			}
			assertAttrs(t, "server", spans[0].Attributes, map[attribute.Key]any{"url.path": tc.path, "url.scheme": scheme, "client.address": client.String()})
		})
	}
}
