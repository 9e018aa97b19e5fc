package telemetry

import (
	"net/netip"
	"testing"

	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// A server span is an error from 500 up (the semantic conventions' rule
// for server spans), the sandbox's own 500 included, and a client span
// from 400 up: a 500 left unmarked hid the commonest sandbox failure from
// a trace view's error filter.
func TestSpanStatusEdges(t *testing.T) {
	for _, tc := range []struct {
		status      int
		server, cli codes.Code
	}{
		{399, codes.Unset, codes.Unset},
		{400, codes.Unset, codes.Error},
		{499, codes.Unset, codes.Error},
		{500, codes.Error, codes.Error},
	} {
		exp := tracetest.NewInMemoryExporter()
		tel := newTestTelemetry(t, Config{SpanExporter: exp})
		ctx, server := tel.StartServerSpan(inbound("GET", ""), false, netip.Addr{})
		out, _ := testRequestHeaders()
		client := tel.StartClientSpan(ctx, out, netip.MustParseAddrPort("10.0.0.2:8080"))
		EndClientSpan(client, tc.status, "", nil)
		EndServerSpan(server, &SpanResult{Kind: RouteHTTP, Status: tc.status, Upstream: "10.0.0.2:8080"})
		spans := exp.GetSpans()
		if len(spans) != 2 {
			t.Fatalf("%d: exported %d spans, want 2", tc.status, len(spans))
		}
		if c, s := spans[0].Status.Code, spans[1].Status.Code; c != tc.cli || s != tc.server {
			t.Errorf("status %d: client span %v, server span %v; want %v, %v", tc.status, c, s, tc.cli, tc.server)
		}
	}
}
