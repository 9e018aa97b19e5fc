package proxy

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"

	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"

	"github.com/cube-sandbox/cubeproxy/telemetry"
)

// A client's tracestate longer than telemetry.MaxTraceState is cut as W3C
// Trace Context (3.3.1.5) lets a vendor cut it: entries over 128
// characters go first, then entries from the end. Whole, a valid one of 32
// entries is some 16 KiB, carried in both spans of the request and sent on
// to the sandbox: the user agent's reason (MaxHeaderAttr), a client could
// make a batch larger than a collector takes, and lose the other
// requests' spans with its own. One within the limit passes whole.
func TestTracingLongTraceStateTruncated(t *testing.T) {
	col, tel, flush := otlpTracing(t)
	h := newHarness(t, func(o *harnessOpts) { o.cfg.Telemetry = tel })
	saw := make(chan []string, 2)
	port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		saw <- r.Header.Values("Tracestate")
	}))
	host := h.route("longstate", port)

	var long, cut []string
	long = append(long, "congo=t61rcWkgMzE", "big="+strings.Repeat("b", 200))
	cut = append(cut, "congo=t61rcWkgMzE")
	for i := range 30 {
		e := fmt.Sprintf("v%02d=%s", i, strings.Repeat("v", 40)) // 44 characters, 45 with its comma
		long = append(long, e)
		if i < 11 { // 17 + 11*45 = 512
			cut = append(cut, e)
		}
	}
	short := "a=1,b=" + strings.Repeat("x", 200) // one entry over 128, but the whole within the limit
	tests := []struct{ traceID, sent, want string }{
		{fmt.Sprintf("%032x", 0x75a0), strings.Join(long, ","), strings.Join(cut, ",")},
		{fmt.Sprintf("%032x", 0x75a1), short, short},
	}
	if n := len(tests[0].want); n != telemetry.MaxTraceState {
		t.Fatalf("the cut tracestate is %d characters, want the test to fill the limit, %d", n, telemetry.MaxTraceState)
	}
	for _, tc := range tests {
		sendTraced(t, h, "/", host, "Tracestate: "+tc.sent+"\r\n", tc.traceID)
		if got := <-saw; !slices.Equal(got, []string{tc.want}) {
			t.Errorf("sandbox got tracestate %.60q... (%d characters), want %.60q... (%d)",
				got, len(strings.Join(got, ",")), tc.want, len(tc.want))
		}
	}
	flush()
	for i, tc := range tests {
		spans := append(col.trace(tc.traceID, tracepb.Span_SPAN_KIND_SERVER), col.trace(tc.traceID, tracepb.Span_SPAN_KIND_CLIENT)...)
		if len(spans) != 2 {
			t.Fatalf("request %d: %d spans received, want a server and a client span", i, len(spans))
		}
		for _, s := range spans {
			if got := s.GetTraceState(); got != tc.want {
				t.Errorf("request %d: %v span trace_state of %d characters, want %d", i, s.GetKind(), len(got), len(tc.want))
			}
		}
	}
}
