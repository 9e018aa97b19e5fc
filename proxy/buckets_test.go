package proxy

import (
	"math"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
	"github.com/cube-sandbox/cubeproxy/telemetry"
)

// The latency histograms must hold the durations the proxy's own default
// timeouts produce in a finite bucket. Prometheus' histogram_quantile
// answers the last finite bound for a quantile that lands in +Inf: with
// buckets up to 60 s, every 504 upstream_timeout of the default 120 s
// response_header_timeout read as a p99 time to headers of 60 s, so an
// alert on a p99 above 100 s never fired and a sandbox that timed out
// looked the same as one that answered in 61 s. Such a 504 comes a
// little after the timeout (the lookup, the connect and its retry come
// first), so the case records the longest way there.
//
// The stream lifetimes have the same need at both ends: a stream the
// default upstream.idle_timeout (7206 s) cut outlived the last bound of
// 7200 s, and an MCP tool call answered as a short SSE stream (the
// lifetime is its latency, as no response duration is recorded for it)
// landed with every other call under 1 s, so its p50 read as 0.5 s
// whether the calls took 20 ms or 900 ms. within, when set, is the
// largest bound the observation may be counted under.
func TestLatencyBucketsHoldTheDefaultTimeouts(t *testing.T) {
	var cfg Config
	cfg.setDefaults()
	for _, tc := range []struct {
		name   string
		metric string
		record func(m *telemetry.Metrics, d time.Duration)
		d      time.Duration
		within float64
	}{
		{"headers of a response_header_timeout 504", "cubeproxy_request_duration_seconds",
			func(m *telemetry.Metrics, d time.Duration) { m.RequestDone(504, telemetry.RouteHTTP, d) }, 2*cfg.ConnectTimeout + cfg.ResponseHeaderTimeout, 0},
		{"whole response_header_timeout 504", "cubeproxy_response_duration_seconds",
			func(m *telemetry.Metrics, d time.Duration) { m.ResponseDone(504, telemetry.RouteHTTP, d) }, 2*cfg.ConnectTimeout + cfg.ResponseHeaderTimeout, 0},
		// The five-minute tool call the buckets are sized for.
		{"a five-minute tool call", "cubeproxy_response_duration_seconds",
			func(m *telemetry.Metrics, d time.Duration) { m.ResponseDone(200, telemetry.RouteHTTP, d) }, 5 * time.Minute, 0},
		{"headers of a connect timeout's 504 (connect and its retry)", "cubeproxy_request_duration_seconds",
			func(m *telemetry.Metrics, d time.Duration) { m.RequestDone(504, telemetry.RouteHTTP, d) }, 2*cfg.ConnectTimeout + time.Second, 0},
		{"an SSE stream the default idle timeout cut", "cubeproxy_stream_duration_seconds",
			func(m *telemetry.Metrics, d time.Duration) { m.StreamClosed(telemetry.RouteSSE, d) }, cfg.IdleStreamTimeout + time.Second, 0},
		{"a WebSocket open for a working day", "cubeproxy_stream_duration_seconds",
			func(m *telemetry.Metrics, d time.Duration) { m.StreamClosed(telemetry.RouteWebSocket, d) }, 8 * time.Hour, 0},
		{"a 40 ms MCP tool call answered as an SSE stream", "cubeproxy_stream_duration_seconds",
			func(m *telemetry.Metrics, d time.Duration) { m.StreamClosed(telemetry.RouteSSE, d) }, 40 * time.Millisecond, 0.05},
		{"a 300 ms MCP tool call answered as an SSE stream", "cubeproxy_stream_duration_seconds",
			func(m *telemetry.Metrics, d time.Duration) { m.StreamClosed(telemetry.RouteSSE, d) }, 300 * time.Millisecond, 0.5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tel := obsTelemetry(t, nil)
			tc.record(tel.Metrics, tc.d)
			rec := httptest.NewRecorder()
			tel.MetricsHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
			samples, err := testenv.ParsePromText(rec.Body)
			if err != nil {
				t.Fatal(err)
			}
			// The smallest finite bound whose bucket holds the observation.
			holding := math.Inf(1)
			for _, s := range samples {
				if s.Name != tc.metric+"_bucket" || s.Value != 1 {
					continue
				}
				le, err := strconv.ParseFloat(s.Labels["le"], 64)
				if err != nil {
					t.Fatalf("%s: le %q: %v", s.Name, s.Labels["le"], err)
				}
				holding = min(holding, le)
			}
			if math.IsInf(holding, 1) {
				t.Fatalf("%s: %v lands in +Inf only: histogram_quantile would report the last finite bound", tc.metric, tc.d)
			}
			if holding < tc.d.Seconds() {
				t.Fatalf("%s: %v counted under le=%v", tc.metric, tc.d, holding)
			}
			if tc.within > 0 && holding > tc.within {
				t.Fatalf("%s: %v first counted under le=%v, want a bound of at most %v", tc.metric, tc.d, holding, tc.within)
			}
		})
	}
}
