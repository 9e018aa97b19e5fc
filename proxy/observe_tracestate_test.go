package proxy

import (
	"bufio"
	"net/http"
	"slices"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// With tracing on, a tracestate sent as several field lines reaches the
// sandbox whole, combined into one line in field order (W3C Trace Context
// 3.3.1.1, RFC 9110 5.3): the proxy read only the first line, removed
// them all and sent the first alone, so every vendor entry after it was
// lost. Two traceparent lines combine into a value that is no
// traceparent: the proxy starts a new trace, as for any invalid one,
// rather than guess which line the client meant.
func TestTracingCombinesTraceContextLines(t *testing.T) {
	const (
		traceID  = "4bf92f3577b34da6a3ce929d0e0e4736"
		parent   = "00-" + traceID + "-00f067aa0ba902b7-01"
		otherTP  = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
		tpLength = len(parent)
	)
	type seen struct{ tp, ts []string }
	saw := make(chan seen, 1)
	port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		saw <- seen{r.Header.Values("Traceparent"), r.Header.Values("Tracestate")}
	}))
	h := newHarness(t, func(o *harnessOpts) { o.cfg.Telemetry = obsTelemetry(t, tracetest.NewInMemoryExporter()) })
	host := h.route("tracelines", port)

	tests := []struct {
		name       string
		tp, ts     []string
		wantTrace  string // trace id the sandbox's traceparent carries; "" = a new one
		wantStates []string
	}{
		{"one tracestate line", []string{parent}, []string{"a=1,b=2"}, traceID, []string{"a=1,b=2"}},
		{"two tracestate lines", []string{parent}, []string{"a=1", "b=2"}, traceID, []string{"a=1,b=2"}},
		{"two traceparent lines", []string{parent, otherTP}, []string{"a=1"}, "", nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			head := "GET / HTTP/1.1\r\nHost: " + host + "\r\nConnection: close\r\n"
			for _, v := range tc.tp {
				head += "Traceparent: " + v + "\r\n"
			}
			for _, v := range tc.ts {
				head += "Tracestate: " + v + "\r\n"
			}
			c := dialRaw(t, h.addr)
			if _, err := c.Write([]byte(head + "\r\n")); err != nil {
				t.Fatal(err)
			}
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil || resp.StatusCode != 200 {
				t.Fatalf("response %v, %v", resp, err)
			}
			got := <-saw
			if len(got.tp) != 1 || len(got.tp[0]) != tpLength {
				t.Fatalf("sandbox got traceparent %q, want one", got.tp)
			}
			tid := strings.Split(got.tp[0], "-")[1]
			switch {
			case tc.wantTrace != "" && tid != tc.wantTrace:
				t.Errorf("sandbox's trace %s, want the client's %s", tid, tc.wantTrace)
			case tc.wantTrace == "" && slices.ContainsFunc(tc.tp, func(v string) bool { return strings.Contains(v, tid) }):
				t.Errorf("sandbox's trace %s is one of the client's ambiguous lines, want a new trace", tid)
			}
			if !slices.Equal(got.ts, tc.wantStates) {
				t.Errorf("sandbox got tracestate %q, want %q", got.ts, tc.wantStates)
			}
		})
	}
}
