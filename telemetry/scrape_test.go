package telemetry

import (
	"net/http/httptest"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// sample is one line of the Prometheus text exposition.
type sample struct {
	name   string
	labels map[string]string
	value  float64
}

// key renders name{k="v",...} with sorted labels, for map lookups.
func (s sample) key() string { return seriesKey(s.name, s.labels) }

func seriesKey(name string, labels map[string]string) string {
	if len(labels) == 0 {
		return name
	}
	keys := make([]string, 0, len(labels))
	for k := range labels {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	b.WriteString(name)
	b.WriteByte('{')
	for i, k := range keys {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(k + "=" + strconv.Quote(labels[k]))
	}
	b.WriteByte('}')
	return b.String()
}

// scrape GETs h and parses every sample line.
func scrape(t *testing.T, tel *Telemetry) []sample {
	t.Helper()
	rec := httptest.NewRecorder()
	tel.MetricsHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if rec.Code != 200 {
		t.Fatalf("GET /metrics: status %d: %s", rec.Code, rec.Body.String())
	}
	parsed, err := testenv.ParsePromText(rec.Body)
	if err != nil {
		t.Fatal(err)
	}
	out := make([]sample, 0, len(parsed))
	for _, p := range parsed {
		out = append(out, sample{name: p.Name, labels: p.Labels, value: p.Value})
	}
	return out
}

// values indexes samples by key.
func values(samples []sample) map[string]float64 {
	m := make(map[string]float64, len(samples))
	for _, s := range samples {
		m[s.key()] = s.value
	}
	return m
}
