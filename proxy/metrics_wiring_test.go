package proxy

import (
	"context"
	"testing"

	"github.com/cube-sandbox/cubeproxy/routing"
	"github.com/cube-sandbox/cubeproxy/telemetry"
)

// The proxy feeds the metrics DESIGN.md lists beside the request counters:
// a refused connect is retried once (counted) and then counted as a
// connect error; each store call is timed, and only an outage counts as a
// store error (unknown sandboxes are answers).
func TestMetricsCountConnectRetryAndStoreCalls(t *testing.T) {
	tel := obsTelemetry(t, nil)
	routes := routing.NewMemoryStore()
	h := newHarness(t, func(o *harnessOpts) {
		o.cfg.Telemetry = tel
		o.store = InstrumentStore(routes, tel.Metrics, telemetry.StoreMemory)
	})
	admin := obsMetricsAdmin(t, h, tel)
	port := freePort(t)
	r, err := routing.ParseRoute("refused", map[string]string{"HostIP": "127.0.0.1", itoa(port): itoa(port)})
	if err != nil {
		t.Fatal(err)
	}
	if err := routes.Put(r); err != nil {
		t.Fatal(err)
	}

	before := scrapeMetrics(t, admin)
	if st, body, _ := h.get(itoa(port)+"-refused.cube.test", "/"); st != 502 {
		t.Fatalf("refused backend: %d %s", st, body)
	}
	if st, _, _ := h.get("80-nosuchbox.cube.test", "/"); st != 404 {
		t.Fatalf("unknown sandbox: %d", st)
	}
	if _, err := InstrumentStore(downStore{}, tel.Metrics, telemetry.StoreMemory).Lookup(context.Background(), "x"); err == nil {
		t.Fatal("down store answered")
	}
	after := scrapeMetrics(t, admin)
	mem := map[string]string{"store": "memory"}
	for _, b := range checkDeltas(before, after, []metricDelta{
		{"cubeproxy_upstream_retries_total", nil, 1},
		{"cubeproxy_upstream_connect_errors_total", nil, 1},
		{"cubeproxy_store_duration_seconds_count", mem, 3},
		{"cubeproxy_store_errors_total", mem, 1},
	}) {
		t.Error(b)
	}
}
