package telemetry

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/otlptranslator"
	"go.opentelemetry.io/otel/attribute"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/metric"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
)

// histogramNames are the families histograms exposes.
var histogramNames = []string{requestDurationMetric, responseDurationMetric, streamDurationMetric, storeDurationMetric}

// The histograms read as the OTel SDK's did through its Prometheus
// exporter, line for line: names, help, labels, buckets (a value on a
// bound counts in that bound's bucket), counts and sums, and no series for
// a label combination never measured. Dashboards and alerts keep their
// queries.
func TestHistogramsExposedAsTheOTelSDKDid(t *testing.T) {
	tel := newTestTelemetry(t, Config{})
	ref := newOTelHistograms(t)

	durations := []time.Duration{0, 7 * time.Microsecond, time.Millisecond, time.Millisecond + 1, 2500 * time.Microsecond,
		300 * time.Second, 301 * time.Second, 26 * time.Hour}
	for _, d := range durations {
		for _, status := range []int{101, 200, 404, 503} {
			kind := RouteHTTP
			switch status {
			case 101:
				kind = RouteWebSocket
			case 404:
				kind = RouteError
			}
			tel.Metrics.RequestDone(status, kind, d)
			ref.record(t, "cubeproxy.request.duration", d, "status_class", statusClassNames[statusClassIndex(status)], "route_kind", routeKindNames[kind])
		}
		tel.Metrics.ResponseDone(200, RouteSSE, d)
		ref.record(t, "cubeproxy.response.duration", d, "status_class", "2xx", "route_kind", "sse")
		tel.Metrics.StreamOpened(RouteWebSocket)
		tel.Metrics.StreamClosed(RouteWebSocket, d)
		ref.record(t, "cubeproxy.stream.duration", d, "route_kind", "websocket")
		tel.Metrics.StoreLookup(StoreRedis, d, false)
		ref.record(t, "cubeproxy.store.duration", d, "store", "redis")
	}

	got := histogramLines(t, tel.MetricsHandler())
	want := histogramLines(t, promhttp.HandlerFor(ref.reg, promhttp.HandlerOpts{}))
	if got != want {
		t.Fatalf("exposition differs from the OTel SDK's\ngot:\n%s\nwant:\n%s", got, want)
	}
	// What the comparison rests on: every family is there, and a pair
	// never measured is not.
	for _, name := range histogramNames {
		if !strings.Contains(got, name+"_count{") {
			t.Errorf("no %s series", name)
		}
	}
	if strings.Contains(got, `status_class="5xx",route_kind="websocket"`) || strings.Contains(got, `route_kind="websocket",status_class="5xx"`) {
		t.Errorf("a pair never measured is exposed:\n%s", got)
	}
}

// otelHistograms are the histograms as the proxy made them through the
// OTel SDK before, exported to their own registry.
type otelHistograms struct {
	reg *prometheus.Registry
	h   map[string]metric.Float64Histogram
}

// newOTelHistograms makes them, with the proxy's help texts and buckets.
func newOTelHistograms(t *testing.T) *otelHistograms {
	t.Helper()
	reg := prometheus.NewRegistry()
	exp, err := otelprom.New(otelprom.WithRegisterer(reg),
		otelprom.WithTranslationStrategy(otlptranslator.UnderscoreEscapingWithSuffixes),
		otelprom.WithoutScopeInfo(), otelprom.WithoutTargetInfo())
	if err != nil {
		t.Fatal(err)
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exp))
	t.Cleanup(func() { mp.Shutdown(context.Background()) })
	meter := mp.Meter(instrumentationName)
	o := &otelHistograms{reg: reg, h: map[string]metric.Float64Histogram{}}
	for _, x := range []struct {
		name, help string
		buckets    []float64
	}{
		{"cubeproxy.request.duration", requestDurationMetricHelp, requestBuckets},
		{"cubeproxy.response.duration", responseDurationMetricHelp, requestBuckets},
		{"cubeproxy.stream.duration", streamDurationMetricHelp, streamBuckets},
		{"cubeproxy.store.duration", storeDurationMetricHelp, storeBuckets},
	} {
		h, err := meter.Float64Histogram(x.name, metric.WithUnit("s"), metric.WithDescription(x.help),
			metric.WithExplicitBucketBoundaries(x.buckets...))
		if err != nil {
			t.Fatal(err)
		}
		o.h[x.name] = h
	}
	return o
}

func (o *otelHistograms) record(t *testing.T, name string, d time.Duration, labels ...string) {
	t.Helper()
	var kvs []attribute.KeyValue
	for i := 0; i < len(labels); i += 2 {
		kvs = append(kvs, attribute.String(labels[i], labels[i+1]))
	}
	o.h[name].Record(context.Background(), d.Seconds(), metric.WithAttributes(kvs...))
}

// histogramLines is the text exposition of the histogram families only.
func histogramLines(t *testing.T, h http.Handler) string {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	var b strings.Builder
	for line := range strings.Lines(rec.Body.String()) {
		for _, name := range histogramNames {
			if strings.HasPrefix(line, name) || strings.HasPrefix(line, "# HELP "+name+" ") || strings.HasPrefix(line, "# TYPE "+name+" ") {
				b.WriteString(line)
			}
		}
	}
	return b.String()
}
