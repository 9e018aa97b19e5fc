package telemetry

import (
	"context"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/trace"
)

// boundTraceState cuts as W3C Trace Context 3.3.1.5 says, down to no
// entry at all when every entry is over 128 characters.
func TestBoundTraceState(t *testing.T) {
	big := func(k string) string { return k + "=" + strings.Repeat("v", 200) }
	mid := func(k string) string { return k + "=" + strings.Repeat("m", 100) }
	for _, tc := range []struct{ name, in, want string }{
		{"none", "", ""},
		{"within", "a=1," + big("b"), "a=1," + big("b")},
		{"big entries go first", big("a") + "," + big("b") + "," + big("c") + ",d=1", "d=1"},
		{"only big entries", big("a") + "," + big("b") + "," + big("c"), ""},
		{"then from the end", strings.Join([]string{mid("a"), mid("b"), mid("c"), mid("d"), mid("e"), mid("f")}, ","),
			strings.Join([]string{mid("a"), mid("b"), mid("c"), mid("d")}, ",")}, // 5 × 102 + 4 = 514
	} {
		ts, err := trace.ParseTraceState(tc.in)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{1}, SpanID: trace.SpanID{1}, TraceState: ts, Remote: true})
		got := trace.SpanContextFromContext(boundTraceState(trace.ContextWithRemoteSpanContext(context.Background(), sc)))
		if s := got.TraceState().String(); s != tc.want || len(s) > MaxTraceState {
			t.Errorf("%s: %q, want %q", tc.name, s, tc.want)
		}
		if !got.IsRemote() || got.TraceID() != sc.TraceID() || got.SpanID() != sc.SpanID() {
			t.Errorf("%s: span context %v, want %v with another tracestate", tc.name, got, sc)
		}
	}
}
