package main

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// scrapeFamilies GETs the binary's /metrics and parses it with
// Prometheus' own text parser (strict: a sample without its TYPE, a
// repeated series or family, a bad name or escape is an error), and lints
// the cubeproxy_ families as promtool does (units, _total, base units).
func scrapeFamilies(t *testing.T, admin string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get("http://" + admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("GET /metrics: %d %v", resp.StatusCode, err)
	}
	parser := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := parser.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		t.Fatalf("/metrics is no valid Prometheus text: %v", err)
	}
	problems, err := promlint.New(bytes.NewReader(body)).Lint()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		if strings.HasPrefix(p.Metric, "cubeproxy_") {
			t.Errorf("promlint: %s: %s", p.Metric, p.Text)
		}
	}
	return fams
}

// series lists every cubeproxy_ series of fams as name{labels} -> value
// (a histogram's buckets, sum and count each one series).
func series(fams map[string]*dto.MetricFamily) map[string]float64 {
	out := map[string]float64{}
	for name, f := range fams {
		if !strings.HasPrefix(name, "cubeproxy_") {
			continue
		}
		for _, m := range f.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, l.GetName()+"="+strconv.Quote(l.GetValue()))
			}
			key := name + "{" + strings.Join(labels, ",") + "}"
			switch f.GetType() {
			case dto.MetricType_COUNTER:
				out[key] = m.GetCounter().GetValue()
			case dto.MetricType_GAUGE:
				out[key] = m.GetGauge().GetValue()
			case dto.MetricType_HISTOGRAM:
				h := m.GetHistogram()
				for _, b := range h.GetBucket() {
					out[key+"_bucket{le="+strconv.FormatFloat(b.GetUpperBound(), 'g', -1, 64)+"}"] = float64(b.GetCumulativeCount())
				}
				out[key+"_sum"] = h.GetSampleSum()
				out[key+"_count"] = float64(h.GetSampleCount())
			default:
				out[key] = m.GetUntyped().GetValue()
			}
		}
	}
	return out
}

// An operator's view of the scrape, on the real binary: Prometheus' own
// parser takes it, promlint finds nothing in the cubeproxy_ families, the
// number of series does not grow with the sandboxes, hosts, paths,
// methods and statuses clients and sandboxes choose (1,000 distinct
// sandboxes, then 1,000 more, add no series), no counter goes down across
// a SIGHUP, and the gauges are back at 0 once the clients are gone.
func TestScrapeValidBoundedAndMonotonic(t *testing.T) {
	// Parallel: it waits on a child process of its own (signals go to the
	// child), on ports picked by the kernel.
	t.Parallel()
	bin := buildBinary(t)
	port := sandboxServer(t, func(w http.ResponseWriter, r *http.Request) {
		code, _ := strconv.Atoi(r.URL.Query().Get("status"))
		if code == 0 {
			code = 200
		}
		w.WriteHeader(code)
		io.WriteString(w, r.URL.Path)
	})
	routes := boxRoutes(t, t.TempDir(), port)
	cmd, logs, exited := startBinary(t, bin, "serve", "--http-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0",
		"--routes", routes, "--access-log-format", "off")
	traffic, admin := waitListening(t, logs, exited)

	raw := func(req string) {
		c, err := net.Dial("tcp", traffic)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := io.WriteString(c, req); err != nil {
			t.Fatal(err)
		}
		if _, err := http.ReadResponse(bufio.NewReader(c), nil); err != nil {
			t.Fatalf("%q: %v", req, err)
		}
	}
	sandboxes := func(from int) {
		for i := from; i < from+1000; i++ {
			raw(fmt.Sprintf("GET /p%d HTTP/1.1\r\nHost: %d-sbx%d.localhost\r\nConnection: close\r\n\r\n", i, 1+i%65535, i))
		}
	}
	// Everything else a client or a sandbox chooses, once each.
	for i, status := range []int{200, 201, 204, 299, 301, 404, 418, 499, 500, 503, 599} {
		raw(fmt.Sprintf("GET /s%d?status=%d HTTP/1.1\r\nHost: %d-box.localhost\r\nConnection: close\r\n\r\n", i, status, port))
	}
	for i, req := range []string{
		"PROPFIND /dav HTTP/1.1\r\nHost: %[1]d-box.localhost\r\nConnection: close\r\n\r\n",
		"X%[2]d /odd HTTP/1.1\r\nHost: %[1]d-box.localhost\r\nConnection: close\r\n\r\n",
		"GET /h HTTP/1.1\r\nHost: bogus%[2]d.example\r\nConnection: close\r\n\r\n",
		"GET /h HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Cube-Sandbox-Id: hdr%[2]d\r\nX-Cube-Sandbox-Port: 80\r\nConnection: close\r\n\r\n",
		"GARBAGE%[2]d\r\n\r\n",
		"GET /h HTTP/1.1\r\nHost: 99999-x.localhost\r\nConnection: close\r\n\r\n",
	} {
		raw(fmt.Sprintf(req, port, i))
	}
	sandboxes(0)
	first := series(scrapeFamilies(t, admin))
	t.Logf("%d cubeproxy_ series after 1,000 sandboxes", len(first))
	sandboxes(1000)
	before := series(scrapeFamilies(t, admin))
	if len(before) != len(first) {
		t.Errorf("%d cubeproxy_ series after 1,000 sandboxes, %d after 1,000 more: a label follows the sandbox", len(first), len(before))
	}
	for key := range before {
		if strings.Contains(key, "sbx") || strings.Contains(key, "bogus") || strings.Contains(key, "/") || strings.Contains(key, "PROPFIND") {
			t.Errorf("series %s carries a client's or sandbox's value", key)
		}
	}
	if n := before[`cubeproxy_requests_total{route_kind="error",status_class="4xx"}`]; n < 2000 {
		t.Errorf("404s of unknown sandboxes counted %v, want >= 2000", n)
	}

	if err := cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	raw(fmt.Sprintf("GET /after HTTP/1.1\r\nHost: %d-box.localhost\r\nConnection: close\r\n\r\n", port))
	var after map[string]float64
	testenv.WaitFor(t, 10*time.Second, "the gauges to return to 0", func() bool {
		after = series(scrapeFamilies(t, admin))
		for _, g := range []string{"cubeproxy_connections_open{}", `cubeproxy_streams_open{route_kind="http"}`, `cubeproxy_streams_open{route_kind="sse"}`, "cubeproxy_websockets_open{}"} {
			if v, ok := after[g]; !ok || v != 0 {
				return false
			}
		}
		return true
	})
	for key, v := range before {
		if strings.Contains(key, "_open") || strings.Contains(key, "upstream_pools") || strings.Contains(key, "idle_connections") {
			continue // gauges
		}
		if after[key] < v {
			t.Errorf("%s went down across SIGHUP: %v -> %v", key, v, after[key])
		}
	}
	sigtermAndWait(t, cmd, exited, logs)
}
