package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"
)

// metrics_addr, the platform proxy's CUBE_PROXY_METRICS_LISTEN, serves the
// admin listener's scrape without the token, and nothing else: not the
// admin API (with the token either), not the health checks, and no
// sandbox traffic routed at it.
func TestMetricsAddrServesTheScrapeAlone(t *testing.T) {
	port := sandboxServer(t, func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })
	const token = "metrics-addr-test-token"
	r := runServe(t, []string{
		"--http-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0", "--metrics-addr", "127.0.0.1:0",
		"--routes", boxRoutes(t, t.TempDir(), port), "--admin-token", token,
	}, noEnv)
	if r.a.metricsLn == nil {
		t.Fatal("metrics_addr set, but no metrics listener")
	}
	metrics := r.a.metricsLn.Addr().String()
	admin := r.a.adminLn.Addr().String()
	client := &http.Client{Timeout: 10 * time.Second}
	do := func(method, addr, host, path, body string) (*http.Response, string) {
		t.Helper()
		req, err := http.NewRequest(method, "http://"+addr+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		if host != "" {
			req.Host = host
		}
		req.Header.Set("X-Cube-Admin-Token", token)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("%s %s%s: %v", method, addr, path, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp, string(b)
	}
	if resp, _ := do("GET", r.a.httpLn.Addr().String(), fmt.Sprintf("%d-box.cube.test", port), "/", ""); resp.StatusCode != 200 {
		t.Fatalf("sandbox request: %d", resp.StatusCode)
	}

	// The scrape itself, on a request without the token: the admin
	// listener's families, the request above counted.
	fromMetrics := scrapeFamilies(t, metrics)
	if f := fromMetrics["cubeproxy_requests_total"]; f == nil || len(f.GetMetric()) == 0 {
		t.Fatal("the metrics listener's scrape has no cubeproxy_requests_total")
	}
	types := func(body string) []string {
		var out []string
		for _, line := range strings.Split(body, "\n") {
			if strings.HasPrefix(line, "# TYPE ") {
				out = append(out, line)
			}
		}
		return out
	}
	resp, adminBody := do("GET", admin, "", "/metrics", "")
	_, metricsBody := do("GET", metrics, "", "/metrics", "")
	if resp.StatusCode != 200 || len(types(adminBody)) < 20 || !slices.Equal(types(metricsBody), types(adminBody)) {
		t.Errorf("the two listeners' scrapes differ in families:\nadmin %q\nmetrics %q", types(adminBody), types(metricsBody))
	}
	if resp, body := do("HEAD", metrics, "", "/metrics", ""); resp.StatusCode != 200 || body != "" {
		t.Errorf("HEAD /metrics: %d, %d bytes of body", resp.StatusCode, len(body))
	}

	// Everything else is refused, with the token sent: a scraper's network
	// must not reach the admin API through it.
	for _, tc := range []struct {
		method, path string
		status       int
		allow        string
	}{
		{"POST", "/metrics", 405, "GET, HEAD"},
		{"GET", "/readyz", 404, ""},
		{"GET", "/admin/healthz", 404, ""},
		{"GET", "/admin/routes", 404, ""},
		{"PUT", "/admin/routes/evil", 404, ""},
		{"GET", "/", 404, ""},
	} {
		resp, body := do(tc.method, metrics, "", tc.path, `{"HostIP":"127.0.0.1","80":"80"}`)
		var e struct {
			Error string `json:"error"`
		}
		if resp.StatusCode != tc.status || resp.Header.Get("Allow") != tc.allow || json.Unmarshal([]byte(body), &e) != nil || e.Error == "" {
			t.Errorf("%s %s on the metrics listener: %d Allow %q %s", tc.method, tc.path, resp.StatusCode, resp.Header.Get("Allow"), body)
		}
	}
	if resp, _ := do("GET", admin, "", "/admin/routes/evil", ""); resp.StatusCode != 404 {
		t.Errorf("the PUT on the metrics listener stored a route: GET it on the admin listener: %d", resp.StatusCode)
	}

	// The listener is the proxy's own: a route naming it is a loop.
	_, metricsPort, _ := strings.Cut(metrics, ":")
	if resp, body := do("PUT", admin, "", "/admin/routes/loop", fmt.Sprintf(`{"HostIP":"127.0.0.1","%[1]s":"%[1]s"}`, metricsPort)); resp.StatusCode != 200 {
		t.Fatalf("PUT route: %d %s", resp.StatusCode, body)
	}
	if resp, body := do("GET", r.a.httpLn.Addr().String(), metricsPort+"-loop.cube.test", "/metrics", ""); resp.StatusCode != 508 {
		t.Errorf("request routed to the metrics listener: %d %s, want 508", resp.StatusCode, body)
	}
}
