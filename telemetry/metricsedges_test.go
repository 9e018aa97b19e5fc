package telemetry

import (
	"testing"
	"time"
)

// The route invalidation gauges show what the store reports: subscribed
// is 1 while the subscription stands and 0 while it is down (what an
// operator alerts on), and the counters are the store's totals.
func TestInvalidationGauges(t *testing.T) {
	for _, tc := range []struct {
		st   InvalidationStats
		want float64
	}{
		{InvalidationStats{Subscribed: true, Subscriptions: 2, Messages: 5}, 1},
		{InvalidationStats{Subscribed: false, Subscriptions: 2, Messages: 5}, 0},
	} {
		tel := newTestTelemetry(t, Config{})
		tel.Metrics.SetInvalidationStats(func() InvalidationStats { return tc.st })
		got := values(scrape(t, tel))
		for name, want := range map[string]float64{
			"cubeproxy_route_invalidation_subscribed":          tc.want,
			"cubeproxy_route_invalidation_subscriptions_total": 2,
			"cubeproxy_route_invalidation_messages_total":      5,
		} {
			if v, ok := got[seriesKey(name, nil)]; !ok || v != want {
				t.Errorf("subscribed=%v: %s = %v (present %v), want %v", tc.st.Subscribed, name, v, ok, want)
			}
		}
	}
}

// Small values count too, an SSE stream's lifetime goes to its own
// series, not to http's, a finished download leaves the open streams, and
// statuses 100 and 599 keep their classes: TestMetricsCountExactly moves
// everything by amounts where an off-by-one or a lost kind would not show.
func TestMetricsCountEdges(t *testing.T) {
	tel := newTestTelemetry(t, Config{})
	m := tel.Metrics
	m.Bytes(RouteHTTP, 1, 1)
	m.StreamOpened(RouteSSE)
	m.StreamClosed(RouteSSE, 2*time.Second)
	// A download is an open stream until its last byte, then a response.
	m.StreamOpened(RouteHTTP)
	m.DownloadDone(200, RouteHTTP, 3*time.Millisecond)
	// The class bounds: 100 and 599 are statuses of their classes.
	m.RequestDone(100, RouteHTTP, time.Millisecond)
	m.RequestDone(599, RouteHTTP, time.Millisecond)
	got := values(scrape(t, tel))
	for _, w := range []struct {
		name   string
		labels L
		want   float64
	}{
		{"cubeproxy_received_bytes_total", L{"route_kind": "http"}, 1},
		{"cubeproxy_sent_bytes_total", L{"route_kind": "http"}, 1},
		{"cubeproxy_stream_duration_seconds_count", L{"route_kind": "sse"}, 1},
		{"cubeproxy_stream_duration_seconds_count", L{"route_kind": "http"}, 0},
		{"cubeproxy_streams_open", L{"route_kind": "sse"}, 0},
		{"cubeproxy_streams_open", L{"route_kind": "http"}, 0},
		{"cubeproxy_response_duration_seconds_count", L{"status_class": "2xx", "route_kind": "http"}, 1},
		{"cubeproxy_requests_total", L{"status_class": "1xx", "route_kind": "http"}, 1},
		{"cubeproxy_requests_total", L{"status_class": "5xx", "route_kind": "http"}, 1},
	} {
		if v := got[seriesKey(w.name, w.labels)]; v != w.want {
			t.Errorf("%s%v = %v, want %v", w.name, w.labels, v, w.want)
		}
	}
}
