package telemetry

import (
	"strings"
	"testing"
	"time"
)

// The platform proxy's families come out under its names and labels
// (its tests/metrics_test.lua's series): GET and POST counted by result,
// any other method only in flight, buckets up to 8.192 s.
func TestEnvdFamiliesAsThePlatformExportsThem(t *testing.T) {
	tel := newTestTelemetry(t, Config{})
	m := tel.Metrics

	m.EnvdStarted(EnvdExec)
	m.EnvdDone(EnvdExec, EnvdPOST, 200, 120*time.Millisecond)
	m.EnvdStarted(EnvdFiles)
	m.EnvdStarted(EnvdFiles)
	m.EnvdDone(EnvdFiles, EnvdGET, 503, 900*time.Millisecond)
	m.EnvdStarted(EnvdFiles) // a DELETE, still running
	m.EnvdStarted(EnvdNone)
	m.EnvdDone(EnvdNone, EnvdGET, 200, time.Second)

	v := values(scrape(t, tel))
	for key, want := range map[string]float64{
		`cube_proxy_request_total{method="POST",result="success",route="sandbox_exec"}`:                              1,
		`cube_proxy_request_total{method="GET",result="fail",route="sandbox_files"}`:                                 1,
		`cube_proxy_request_total{method="GET",result="success",route="sandbox_files"}`:                              0,
		`cube_proxy_inflight_requests{route="sandbox_exec"}`:                                                         0,
		`cube_proxy_inflight_requests{route="sandbox_files"}`:                                                        2,
		`cube_proxy_request_duration_seconds_bucket{le="0.128",method="POST",result="success",route="sandbox_exec"}`: 1,
		`cube_proxy_request_duration_seconds_bucket{le="0.064",method="POST",result="success",route="sandbox_exec"}`: 0,
		`cube_proxy_request_duration_seconds_bucket{le="8.192",method="GET",result="fail",route="sandbox_files"}`:    1,
		`cube_proxy_request_duration_seconds_sum{method="POST",result="success",route="sandbox_exec"}`:               0.12,
		`cube_proxy_request_duration_seconds_count{method="GET",result="fail",route="sandbox_files"}`:                1,
	} {
		got, ok := v[key]
		if !ok || got != want {
			t.Errorf("%s = %v (present %v), want %v", key, got, ok, want)
		}
	}
	for key := range v {
		if strings.HasPrefix(key, "cube_proxy") && (strings.Contains(key, `method="DELETE"`) || strings.Contains(key, `route=""`)) {
			t.Errorf("series %s: the platform counts GET and POST of its two routes alone", key)
		}
	}
}

// The route of a request's path, as the platform tells it from $uri.
func TestClassifyEnvd(t *testing.T) {
	for path, want := range map[string]EnvdRoute{
		"/process.Process/Start":    EnvdExec,
		"/process.Process/Connect":  EnvdExec,
		"/process.Process/":         EnvdExec, // as the platform's "^/process%.Process/"
		"/process.Process":          EnvdNone,
		"/files":                    EnvdFiles,
		"/files/":                   EnvdNone,
		"/filesystem.Filesystem/Ls": EnvdNone,
		"/":                         EnvdNone,
		"":                          EnvdNone,
	} {
		if got := ClassifyEnvd([]byte(path)); got != want {
			t.Errorf("ClassifyEnvd(%q) = %d, want %d", path, got, want)
		}
	}
}
