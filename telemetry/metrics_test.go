package telemetry

import (
	"os"
	"regexp"
	"runtime"
	"strings"
	"testing"
	"time"
)

type L = map[string]string

func TestMetricsCountExactly(t *testing.T) {
	tel := newTestTelemetry(t, Config{})
	m := tel.Metrics
	before := values(scrape(t, tel))

	// A known mix: three 200s, two 404s from the proxy, a 403, a WebSocket,
	// an SSE stream, and the supporting cache/store/upstream events.
	for range 3 {
		m.RequestDone(200, RouteHTTP, 2*time.Millisecond)
		m.ResponseDone(200, RouteHTTP, 3*time.Millisecond)
		m.Bytes(RouteHTTP, 10, 100)
	}
	for range 2 {
		m.RequestDone(404, RouteError, 200*time.Microsecond)
		m.CacheLookup(CacheNegativeHit)
	}
	m.AuthRejected(AuthTrafficTokenMissing)
	m.RequestDone(403, RouteError, 300*time.Microsecond)
	m.RequestDone(101, RouteWebSocket, 4*time.Millisecond)
	m.StreamOpened(RouteWebSocket)
	m.StreamOpened(RouteSSE)
	m.RequestDone(200, RouteSSE, 4*time.Millisecond)
	m.StreamOpened(RouteHTTP)
	m.StreamClosed(RouteHTTP, 2*time.Second)
	m.StreamEnded(RouteHTTP, StreamSandbox)
	m.StreamEnded(RouteSSE, StreamDrain)
	m.StreamEnded(RouteSSE, StreamDrain)
	m.StreamEnded(RouteWebSocket, StreamKilled)
	m.Bytes(RouteWebSocket, 5, 7)
	m.CacheLookup(CacheHit)
	m.CacheLookup(CacheMiss)
	m.CacheLookup(CacheStale)
	m.CacheLookup(CacheNone) // not a lookup: ignored
	m.StoreLookup(StoreRedis, time.Millisecond, false)
	m.StoreLookup(StoreRedis, 2*time.Millisecond, true)
	m.UpstreamConnectError()
	m.UpstreamResourceError()
	m.UpstreamResourceError()
	m.UpstreamRetry()
	m.AccessLogDropped()
	m.AccessLogReopenFailed()
	m.AccessLogCloseFailed()
	m.AccessLogTruncated()
	m.AccessLogTruncated()
	m.ConnRefused()
	m.ConnsReclaimed(3)
	m.StreamLimitWait(WaitSlot)
	m.StreamLimitWait(WaitSlot)
	m.StreamLimitWait(WaitRefused)
	m.StreamLimitWait(WaitState)
	m.StreamLimitWait(WaitState)
	m.StreamLimitWait(WaitState)
	m.SandboxResume(ResumeResumed)
	m.SandboxResume(ResumeFailed)
	m.SandboxResume(ResumeFailed)
	m.ConnOpened()
	m.ConnOpened()
	m.ConnClosed()

	after := values(scrape(t, tel))
	want := []struct {
		name   string
		labels L
		delta  float64
	}{
		{"cubeproxy_requests_total", L{"status_class": "2xx", "route_kind": "http"}, 3},
		{"cubeproxy_requests_total", L{"status_class": "4xx", "route_kind": "error"}, 3},
		{"cubeproxy_requests_total", L{"status_class": "1xx", "route_kind": "websocket"}, 1},
		{"cubeproxy_requests_total", L{"status_class": "2xx", "route_kind": "sse"}, 1},
		{"cubeproxy_requests_total", L{"status_class": "5xx", "route_kind": "http"}, 0},
		{"cubeproxy_request_duration_seconds_count", L{"status_class": "2xx", "route_kind": "http"}, 3},
		{"cubeproxy_request_duration_seconds_bucket", L{"status_class": "2xx", "route_kind": "http", "le": "0.001"}, 0},
		{"cubeproxy_request_duration_seconds_bucket", L{"status_class": "2xx", "route_kind": "http", "le": "0.0025"}, 3},
		{"cubeproxy_request_duration_seconds_count", L{"status_class": "4xx", "route_kind": "error"}, 3},
		{"cubeproxy_response_duration_seconds_count", L{"status_class": "2xx", "route_kind": "http"}, 3},
		{"cubeproxy_response_duration_seconds_bucket", L{"status_class": "2xx", "route_kind": "http", "le": "0.005"}, 3},
		{"cubeproxy_stream_duration_seconds_count", L{"route_kind": "http"}, 1},
		{"cubeproxy_stream_duration_seconds_bucket", L{"route_kind": "http", "le": "1"}, 0},
		{"cubeproxy_stream_duration_seconds_bucket", L{"route_kind": "http", "le": "5"}, 1},
		{"cubeproxy_received_bytes_total", L{"route_kind": "http"}, 30},
		{"cubeproxy_sent_bytes_total", L{"route_kind": "http"}, 300},
		{"cubeproxy_received_bytes_total", L{"route_kind": "websocket"}, 5},
		{"cubeproxy_sent_bytes_total", L{"route_kind": "websocket"}, 7},
		{"cubeproxy_websockets_open", nil, 1},
		{"cubeproxy_streams_open", L{"route_kind": "sse"}, 1},
		{"cubeproxy_streams_open", L{"route_kind": "http"}, 0},
		{"cubeproxy_connections_open", nil, 1},
		{"cubeproxy_streams_ended_total", L{"route_kind": "http", "reason": "sandbox"}, 1},
		{"cubeproxy_streams_ended_total", L{"route_kind": "http", "reason": "complete"}, 0},
		{"cubeproxy_streams_ended_total", L{"route_kind": "sse", "reason": "drain"}, 2},
		{"cubeproxy_streams_ended_total", L{"route_kind": "websocket", "reason": "killed"}, 1},
		{"cubeproxy_streams_ended_total", L{"route_kind": "websocket", "reason": "timeout"}, 0},
		{"cubeproxy_route_cache_lookups_total", L{"result": "hit"}, 1},
		{"cubeproxy_route_cache_lookups_total", L{"result": "miss"}, 1},
		{"cubeproxy_route_cache_lookups_total", L{"result": "negative_hit"}, 2},
		{"cubeproxy_route_cache_lookups_total", L{"result": "stale"}, 1},
		{"cubeproxy_store_duration_seconds_count", L{"store": "redis"}, 2},
		{"cubeproxy_store_errors_total", L{"store": "redis"}, 1},
		{"cubeproxy_store_errors_total", L{"store": "memory"}, 0},
		{"cubeproxy_upstream_connect_errors_total", nil, 1},
		{"cubeproxy_upstream_resource_errors_total", nil, 2},
		{"cubeproxy_upstream_retries_total", nil, 1},
		{"cubeproxy_auth_rejections_total", L{"reason": "traffic_token_missing"}, 1},
		{"cubeproxy_auth_rejections_total", L{"reason": "traffic_token_invalid"}, 0},
		{"cubeproxy_accesslog_dropped_total", nil, 1},
		{"cubeproxy_accesslog_reopen_errors_total", nil, 1},
		{"cubeproxy_accesslog_close_errors_total", nil, 1},
		{"cubeproxy_accesslog_truncations_total", nil, 2},
		{"cubeproxy_connections_refused_total", nil, 1},
		{"cubeproxy_connections_reclaimed_total", nil, 3},
		{"cubeproxy_stream_limit_waits_total", L{"outcome": "slot"}, 2},
		{"cubeproxy_stream_limit_waits_total", L{"outcome": "refused"}, 1},
		{"cubeproxy_stream_limit_waits_total", L{"outcome": "state"}, 3},
		{"cubeproxy_sandbox_resumes_total", L{"outcome": "resumed"}, 1},
		{"cubeproxy_sandbox_resumes_total", L{"outcome": "failed"}, 2},
	}
	for _, w := range want {
		k := seriesKey(w.name, w.labels)
		got, ok := after[k]
		if !ok {
			t.Errorf("%s: missing from scrape", k)
			continue
		}
		if d := got - before[k]; d != w.delta {
			t.Errorf("%s moved by %v, want %v", k, d, w.delta)
		}
	}
}

// TestMetricLabelsBounded feeds out-of-range and client-like values to
// every method and checks that only the fixed label names and values appear.
func TestMetricLabelsBounded(t *testing.T) {
	tel := newTestTelemetry(t, Config{})
	m := tel.Metrics
	m.RequestDone(0, RouteKind(200), time.Millisecond)
	m.RequestDone(999, RouteKind(4), time.Millisecond)
	// Just outside 100..599, as a sandbox's status line may be: a class
	// index of 6 is past the table (a panic), 0 is "other".
	m.RequestDone(600, RouteError, time.Millisecond)
	m.RequestDone(99, RouteError, time.Millisecond)
	m.ResponseDone(-1, RouteKind(9), time.Millisecond)
	m.Bytes(RouteKind(255), 1, 1)
	m.StreamOpened(RouteKind(77))
	m.StreamClosed(RouteKind(77), time.Second)
	m.StreamEnded(RouteKind(77), StreamEnd(200))
	m.StreamEnded(RouteError, StreamTimeout)
	m.CacheLookup(CacheResult(99))
	m.StreamLimitWait(WaitOutcome(9))
	m.SandboxResume(ResumeOutcome(9))
	m.StoreLookup(StoreKind(9), time.Millisecond, true)
	m.AuthRejected("8080-sb-secret-id.example.com")
	m.AuthRejected("signed_token_made_up")
	m.AuthRejected("")

	allowed := map[string]map[string]bool{
		"status_class": set("other", "1xx", "2xx", "3xx", "4xx", "5xx"),
		"route_kind":   set("http", "sse", "websocket", "error"),
		"result":       set("hit", "miss", "negative_hit", "stale"),
		"store":        set("memory", "redis"),
		"outcome":      set("slot", "refused", "state", "resumed", "failed"),
		"reason": set("traffic_token_missing", "traffic_token_invalid", "traffic_token_not_configured",
			"signed_token_malformed", "signed_token_invalid", "signed_token_wrong_target", "signed_token_expired",
			"signed_cookie_foreign_origin", "credential_revoked",
			"admin", "other",
			"complete", "client", "sandbox", "timeout", "drain", "killed", "error", "route_changed"),
	}
	n := 0
	for _, s := range scrape(t, tel) {
		if !strings.HasPrefix(s.name, "cubeproxy_") {
			continue
		}
		n++
		for k, v := range s.labels {
			if k == "le" {
				continue
			}
			if !allowed[k][v] {
				t.Errorf("%s: label %s=%q outside the fixed set", s.key(), k, v)
			}
		}
	}
	if n == 0 {
		t.Fatal("no cubeproxy_ samples scraped")
	}
	got := values(scrape(t, tel))
	for k, want := range map[string]float64{
		seriesKey("cubeproxy_requests_total", L{"status_class": "other", "route_kind": "error"}): 4,
		seriesKey("cubeproxy_auth_rejections_total", L{"reason": "other"}):                       3,
		seriesKey("cubeproxy_route_cache_lookups_total", L{"result": "miss"}):                    1,
		seriesKey("cubeproxy_store_errors_total", L{"store": "memory"}):                          1,
		seriesKey("cubeproxy_streams_open", L{"route_kind": "http"}):                             0,
		seriesKey("cubeproxy_streams_ended_total", L{"route_kind": "http", "reason": "error"}):   1,
		seriesKey("cubeproxy_streams_ended_total", L{"route_kind": "http", "reason": "timeout"}): 1,
	} {
		if got[k] != want {
			t.Errorf("%s = %v, want %v", k, got[k], want)
		}
	}
}

func set(vs ...string) map[string]bool {
	m := make(map[string]bool, len(vs))
	for _, v := range vs {
		m[v] = true
	}
	return m
}

func TestPoolStatsGauges(t *testing.T) {
	tel := newTestTelemetry(t, Config{})
	if _, ok := values(scrape(t, tel))["cubeproxy_upstream_pools"]; ok {
		t.Error("pool gauges reported before SetPoolStats")
	}
	pools, idle := int64(3), int64(7)
	tel.Metrics.SetPoolStats(func() (int64, int64) { return pools, idle })
	got := values(scrape(t, tel))
	if got["cubeproxy_upstream_pools"] != 3 || got["cubeproxy_upstream_idle_connections"] != 7 {
		t.Errorf("pools=%v idle=%v, want 3 and 7", got["cubeproxy_upstream_pools"], got["cubeproxy_upstream_idle_connections"])
	}
	pools, idle = 1, 0 // read at every scrape, not cached
	got = values(scrape(t, tel))
	if got["cubeproxy_upstream_pools"] != 1 || got["cubeproxy_upstream_idle_connections"] != 0 {
		t.Errorf("after change: pools=%v idle=%v, want 1 and 0", got["cubeproxy_upstream_pools"], got["cubeproxy_upstream_idle_connections"])
	}
}

func TestNilMetricsIsNoop(t *testing.T) {
	var m *Metrics
	recordAll(m) // must not panic
	m.AccessLogTruncated()
	m.SandboxResume(ResumeFailed)
	m.SetPoolStats(func() (int64, int64) { return 0, 0 })
	m.SetHeldBodyBytes(func() int64 { return 0 })
}

// The README promises the process's metrics beside the proxy's, and sizes
// client.max_conns from process_resident_memory_bytes: a scrape without
// them leaves that advice unusable.
func TestScrapeHasRuntimeAndResource(t *testing.T) {
	tel := newTestTelemetry(t, Config{ServiceName: "cubeproxy-test", ServiceVersion: "1.2.3", InstanceID: "node-a"})
	var sawGo, sawTarget bool
	sawRSS := runtime.GOOS != "linux" // the process collector reads /proc
	for _, s := range scrape(t, tel) {
		switch s.name {
		case "go_goroutines":
			sawGo = true
		case "process_resident_memory_bytes":
			sawRSS = s.value > 0
		case "target_info":
			sawTarget = true
			if s.labels["service_name"] != "cubeproxy-test" || s.labels["service_version"] != "1.2.3" || s.labels["service_instance_id"] != "node-a" {
				t.Errorf("target_info labels = %v", s.labels)
			}
		}
		if strings.HasPrefix(s.name, "cubeproxy_") && s.labels["otel_scope_name"] != "" {
			t.Errorf("%s carries scope labels", s.key())
		}
	}
	if !sawGo || !sawTarget || !sawRSS {
		t.Errorf("go_goroutines seen=%v, target_info seen=%v, process_resident_memory_bytes seen=%v; want all", sawGo, sawTarget, sawRSS)
	}
}

// TestAuthReasonsMapToThemselves guards the switch in authReasonIndex
// against drifting from the authReasons order.
func TestAuthReasonsMapToThemselves(t *testing.T) {
	for i, r := range authReasons {
		if got := authReasonIndex(r); got != i {
			t.Errorf("authReasonIndex(%q) = %d, want %d", r, got, i)
		}
	}
	tel := newTestTelemetry(t, Config{})
	for _, r := range authReasons {
		tel.Metrics.AuthRejected(r)
	}
	got := values(scrape(t, tel))
	for _, r := range authReasons {
		if k := seriesKey("cubeproxy_auth_rejections_total", L{"reason": r}); got[k] != 1 {
			t.Errorf("%s = %v, want 1", k, got[k])
		}
	}
}

// The certificate expiry is a date, in seconds, while there is one: the
// acme source has none until its certificates are in memory, and a zero
// (1970) would fire every expiry alert.
func TestCertExpiryGauge(t *testing.T) {
	const name = "cubeproxy_tls_certificate_expiry_timestamp_seconds"
	for _, tc := range []struct {
		name    string
		at      time.Time
		present bool
	}{
		{"a date", time.Unix(1_800_000_000, 0), true},
		{"none yet", time.Time{}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tel := newTestTelemetry(t, Config{})
			tel.Metrics.SetCertExpiry(func() time.Time { return tc.at })
			v, ok := values(scrape(t, tel))[seriesKey(name, L{})]
			if ok != tc.present || (ok && v != float64(tc.at.Unix())) {
				t.Fatalf("%s = %v (present %v), want %v (present %v)", name, v, ok, tc.at.Unix(), tc.present)
			}
		})
	}
}

// TestDocListsEveryMetric keeps the list in doc.go (which the README
// points operators to) in step with what a scrape exposes: every
// cubeproxy_ family, and the platform's cube_proxy_ ones, once every
// method has recorded, and nothing more.
func TestDocListsEveryMetric(t *testing.T) {
	src, err := os.ReadFile("doc.go")
	if err != nil {
		t.Fatal(err)
	}
	documented := map[string]bool{}
	for _, name := range regexp.MustCompile(`cube_?proxy_[a-z_]+`).FindAllString(string(src), -1) {
		documented[name] = true
	}
	tel := newTestTelemetry(t, Config{})
	recordAll(tel.Metrics)
	// Not in recordAll, which the allocation tests share: one envd call,
	// so the platform's duration histogram has a series to expose.
	tel.Metrics.EnvdStarted(EnvdFiles)
	tel.Metrics.EnvdDone(EnvdFiles, EnvdGET, 200, time.Millisecond)
	tel.Metrics.AcceptError()
	tel.Metrics.SetPoolStats(func() (int64, int64) { return 1, 1 })
	tel.Metrics.SetInvalidationStats(func() InvalidationStats { return InvalidationStats{Subscribed: true, Subscriptions: 1} })
	tel.Metrics.SetCertExpiry(func() time.Time { return time.Unix(2e9, 0) })
	scraped := map[string]bool{}
	for _, s := range scrape(t, tel) {
		if !strings.HasPrefix(s.name, "cubeproxy_") && !strings.HasPrefix(s.name, "cube_proxy_") {
			continue
		}
		name := s.name
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			if strings.HasSuffix(name, "_seconds"+suffix) {
				name = strings.TrimSuffix(name, suffix)
			}
		}
		scraped[name] = true
	}
	for name := range scraped {
		if !documented[name] {
			t.Errorf("%s is exposed but not listed in doc.go", name)
		}
	}
	for name := range documented {
		if !scraped[name] {
			t.Errorf("doc.go lists %s, which no scrape exposes", name)
		}
	}
}

// TestREADMENamesRealMetrics: every cubeproxy_ metric the READMEs name
// (alerts and dashboards are written from them) is one doc.go lists, and
// TestDocListsEveryMetric ties that list to what a scrape exposes. A
// renamed metric would otherwise leave the README pointing operators at
// a series that never appears.
func TestREADMENamesRealMetrics(t *testing.T) {
	src, err := os.ReadFile("doc.go")
	if err != nil {
		t.Fatal(err)
	}
	name := regexp.MustCompile(`cubeproxy_[a-z_]+`)
	documented := map[string]bool{}
	for _, n := range name.FindAllString(string(src), -1) {
		documented[n] = true
	}
	named := 0
	for _, f := range []string{"../README.md", "../bench/README.md"} {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range name.FindAllString(string(raw), -1) {
			named++
			// A histogram's series are named by its family.
			for _, suffix := range []string{"_bucket", "_sum", "_count"} {
				if strings.HasSuffix(n, "_seconds"+suffix) {
					n = strings.TrimSuffix(n, suffix)
				}
			}
			if !documented[n] {
				t.Errorf("%s names %s: no such metric (telemetry/doc.go lists what a scrape has)", f, n)
			}
		}
	}
	if named < 5 {
		t.Fatalf("the READMEs name %d metrics: is the pattern still right?", named)
	}
}
