package telemetry

import (
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// histograms holds CubeProxy's duration histograms as one Prometheus
// histogram per label combination, made at start: a record is then a few
// atomics (≈ 20 ns). Through the OTel SDK a record cost ≈ 130 ns, since the
// SDK normalises the attribute set and looks its aggregator up on every
// call, and a request makes two. The exposition is the same: name, help,
// labels and buckets.
//
// Like the SDK's, a scrape shows only the combinations that have had a
// measurement: all 20 status class and route kind pairs of the two
// request histograms would be ≈ 800 lines, most of them zeros that never
// move (a 5xx WebSocket upgrade).
type histograms struct {
	all []prometheus.Histogram
}

// add makes the histogram of one label combination.
func (h *histograms) add(name, help string, buckets []float64, labels prometheus.Labels) prometheus.Histogram {
	c := prometheus.NewHistogram(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets, ConstLabels: labels})
	h.all = append(h.all, c)
	return c
}

// Describe implements prometheus.Collector.
func (h *histograms) Describe(ch chan<- *prometheus.Desc) {
	for _, c := range h.all {
		ch <- c.Desc()
	}
}

// Collect implements prometheus.Collector: the combinations measured so
// far. Once measured, a combination stays, as a cumulative series must.
func (h *histograms) Collect(ch chan<- prometheus.Metric) {
	var m dto.Metric
	for _, c := range h.all {
		m.Reset()
		if err := c.Write(&m); err == nil && m.GetHistogram().GetSampleCount() == 0 {
			continue
		}
		ch <- c
	}
}
