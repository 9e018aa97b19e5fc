package telemetry

import (
	"bufio"
	"net/http/httptest"
	"sort"
	"strconv"
	"strings"
	"testing"
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
	var out []sample
	sc := bufio.NewScanner(rec.Body)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		s, err := parseSample(line)
		if err != nil {
			t.Fatalf("parse %q: %v", line, err)
		}
		out = append(out, s)
	}
	return out
}

// parseSample parses `name{a="x",b="y"} value` (label values may contain
// escaped quotes).
func parseSample(line string) (sample, error) {
	s := sample{labels: map[string]string{}}
	sp := strings.LastIndexByte(line, ' ')
	if sp < 0 {
		return s, strconv.ErrSyntax
	}
	v, err := strconv.ParseFloat(line[sp+1:], 64)
	if err != nil {
		return s, err
	}
	s.value = v
	series := line[:sp]
	br := strings.IndexByte(series, '{')
	if br < 0 {
		s.name = series
		return s, nil
	}
	s.name = series[:br]
	rest := strings.TrimSuffix(series[br+1:], "}")
	for rest != "" {
		eq := strings.IndexByte(rest, '=')
		if eq < 0 {
			return s, strconv.ErrSyntax
		}
		name := rest[:eq]
		val, err := strconv.QuotedPrefix(rest[eq+1:])
		if err != nil {
			return s, err
		}
		uq, err := strconv.Unquote(val)
		if err != nil {
			return s, err
		}
		s.labels[name] = uq
		rest = strings.TrimPrefix(rest[eq+1+len(val):], ",")
	}
	return s, nil
}

// values indexes samples by key.
func values(samples []sample) map[string]float64 {
	m := make(map[string]float64, len(samples))
	for _, s := range samples {
		m[s.key()] = s.value
	}
	return m
}
