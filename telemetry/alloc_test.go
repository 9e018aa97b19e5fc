package telemetry

import (
	"net/netip"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// recordAll calls every recording method once, as one request might.
func recordAll(m *Metrics) {
	m.ConnOpened()
	m.CacheLookup(CacheHit)
	m.StoreLookup(StoreRedis, 300*time.Microsecond, false)
	m.UpstreamRetry()
	m.UpstreamConnectError()
	m.AuthRejected(AuthTrafficTokenInvalid)
	m.RequestDone(200, RouteSSE, 2*time.Millisecond)
	m.StreamOpened(RouteSSE)
	m.Bytes(RouteSSE, 100, 4096)
	m.StreamClosed(RouteSSE, 90*time.Second)
	m.StreamEnded(RouteSSE, StreamClient)
	m.StreamOpened(RouteWebSocket)
	m.StreamClosed(RouteWebSocket, time.Hour)
	m.StreamEnded(RouteWebSocket, StreamComplete)
	m.ResponseDone(404, RouteError, time.Millisecond)
	m.StreamOpened(RouteHTTP)
	m.DownloadDone(200, RouteHTTP, 30*time.Millisecond)
	m.AccessLogDropped()
	m.ConnClosed()
}

// spanCycle is the proxy's per-request tracing work.
func spanCycle(tel *Telemetry, in, out *fasthttp.RequestHeader, r *SpanResult) {
	ctx, server := tel.StartServerSpan(in, false, netip.Addr{})
	client := tel.StartClientSpan(ctx, out, netip.MustParseAddrPort("10.0.0.2:8080"))
	EndClientSpan(client, 200, "", nil)
	EndServerSpan(server, r)
}

func testRequestHeaders() (in, out *fasthttp.RequestHeader) {
	in, out = &fasthttp.RequestHeader{}, &fasthttp.RequestHeader{}
	in.SetMethod("GET")
	in.Set("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	out.SetMethod("GET")
	return in, out
}

func TestRecordingDoesNotAllocate(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are not meaningful under -race; run without -race (BenchmarkMetricsRecordAll)")
	}
	tel := newTestTelemetry(t, Config{})
	recordAll(tel.Metrics) // create every series first
	if n := testing.AllocsPerRun(200, func() { recordAll(tel.Metrics) }); n != 0 {
		t.Errorf("metric recording: %v allocs per request, want 0", n)
	}
	in, out := testRequestHeaders()
	r := &SpanResult{SandboxID: "sb1", Port: 8080, Kind: RouteHTTP, Status: 200}
	if n := testing.AllocsPerRun(200, func() { spanCycle(tel, in, out, r) }); n != 0 {
		t.Errorf("span helpers with tracing off: %v allocs per request, want 0", n)
	}
	if len(out.Peek("traceparent")) != 0 {
		t.Errorf("tracing off must not inject traceparent, got %q", out.Peek("traceparent"))
	}
}

func BenchmarkMetricsRequestDone(b *testing.B) {
	tel := newTestTelemetry(b, Config{})
	b.ReportAllocs()
	for b.Loop() {
		tel.Metrics.RequestDone(200, RouteHTTP, time.Millisecond)
	}
}

func BenchmarkMetricsRecordAll(b *testing.B) {
	tel := newTestTelemetry(b, Config{})
	b.ReportAllocs()
	for b.Loop() {
		recordAll(tel.Metrics)
	}
}

func BenchmarkMetricsParallel(b *testing.B) {
	tel := newTestTelemetry(b, Config{})
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			tel.Metrics.RequestDone(200, RouteHTTP, time.Millisecond)
		}
	})
}

// BenchmarkSpansOff is the per-request span cost with tracing off (0 allocs).
func BenchmarkSpansOff(b *testing.B) {
	tel := newTestTelemetry(b, Config{})
	in, out := testRequestHeaders()
	r := &SpanResult{SandboxID: "sb1", Port: 8080, Kind: RouteHTTP, Status: 200}
	b.ReportAllocs()
	for b.Loop() {
		spanCycle(tel, in, out, r)
	}
}

// BenchmarkSpansSampled is the cost when a request is traced, for contrast.
func BenchmarkSpansSampled(b *testing.B) {
	tel := newTestTelemetry(b, Config{SpanExporter: tracetest.NewNoopExporter()})
	in, out := testRequestHeaders()
	r := &SpanResult{SandboxID: "sb1", Port: 8080, Kind: RouteHTTP, Status: 200, Upstream: "10.0.0.2:8080"}
	b.ReportAllocs()
	for b.Loop() {
		spanCycle(tel, in, out, r)
	}
}

// BenchmarkSpansUnsampled is tracing on, request not sampled (ratio ~0).
func BenchmarkSpansUnsampled(b *testing.B) {
	tel := newTestTelemetry(b, Config{SpanExporter: tracetest.NewNoopExporter(), TraceSampleRatio: 1e-9})
	in, out := testRequestHeaders()
	r := &SpanResult{SandboxID: "sb1", Port: 8080, Kind: RouteHTTP, Status: 200}
	b.ReportAllocs()
	for b.Loop() {
		spanCycle(tel, in, out, r)
	}
}
