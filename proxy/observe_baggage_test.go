package proxy

import (
	"bufio"
	"net/http"
	"slices"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/cube-sandbox/cubeproxy/telemetry"
)

// The client's baggage reaches the sandbox as it was sent, tracing on or
// off: the proxy adds no baggage of its own, so it is an end-to-end header
// like any other. Re-injected by OpenTelemetry (tracing on), it lost the
// members OpenTelemetry refused, had its values re-encoded and its lines
// merged: turning tracing on to debug an incident changed what the
// sandbox's app was given.
func TestTracingLeavesBaggageAsSent(t *testing.T) {
	saw := make(chan []string, 1)
	port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		saw <- r.Header.Values("Baggage")
	}))
	tests := []struct {
		name string
		bag  []string
	}{
		{"valid", []string{"k1=v1,k2=v2;p=1"}},
		{"one member OpenTelemetry refuses", []string{"k1=v1,k2=v2;p=1, bad"}},
		{"percent-encoded value", []string{"k=a%2Fb%41"}},
		{"spaces around members", []string{"k1=v1 , k2=v2"}},
		{"two lines", []string{"a=1", "b=2"}},
		{"more members than OpenTelemetry keeps", []string{strings.Repeat("m=1,", 70) + "last=1"}},
	}
	for _, tracing := range []bool{true, false} {
		var tel *telemetry.Telemetry
		if tracing {
			tel = obsTelemetry(t, tracetest.NewInMemoryExporter())
		} else {
			tel = obsTelemetry(t, nil)
		}
		h := newHarness(t, func(o *harnessOpts) { o.cfg.Telemetry = tel })
		host := h.route("baggage", port)
		for _, tc := range tests {
			name := tc.name + map[bool]string{true: ", tracing on", false: ", tracing off"}[tracing]
			t.Run(name, func(t *testing.T) {
				head := "GET / HTTP/1.1\r\nHost: " + host + "\r\nConnection: close\r\n" +
					"Traceparent: 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\r\n"
				for _, b := range tc.bag {
					head += "Baggage: " + b + "\r\n"
				}
				c := dialRaw(t, h.addr)
				if _, err := c.Write([]byte(head + "\r\n")); err != nil {
					t.Fatal(err)
				}
				resp, err := http.ReadResponse(bufio.NewReader(c), nil)
				if err != nil || resp.StatusCode != 200 {
					t.Fatalf("response %v, %v", resp, err)
				}
				if got := <-saw; !slices.Equal(got, tc.bag) {
					t.Errorf("sandbox got baggage %q, want %q as sent", got, tc.bag)
				}
			})
		}
	}
}
