package proxy

import (
	"io"
	"net"
	"testing"
)

// gaugeValue is one gauge of a scrape (summed over its labels).
func gaugeValue(t *testing.T, admin, name string) float64 {
	t.Helper()
	v, ok := metricValue(scrapeMetrics(t, admin), name, nil)
	if !ok {
		t.Fatalf("%s: no such series", name)
	}
	return v
}

// rawProxyConn dials the proxy and sends head (a whole request).
func rawProxyConn(t *testing.T, h *harness, head string) *net.TCPConn {
	t.Helper()
	c, err := net.Dial("tcp", h.addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if _, err := io.WriteString(c, head); err != nil {
		t.Fatal(err)
	}
	return c.(*net.TCPConn)
}

// reset closes c with a RST, as a client that crashes does.
func reset(c *net.TCPConn) {
	_ = c.SetLinger(0)
	_ = c.Close()
}

// An open WebSocket holds an upstream connection that is busy, not idle:
// idle_connections must not count it.
func TestMetricsIdleConnsExcludeTunnels(t *testing.T) {
	tel := obsTelemetry(t, nil)
	h := newHarness(t, func(o *harnessOpts) { o.cfg.Telemetry = tel })
	admin := obsMetricsAdmin(t, h, tel)
	wsEnded := make(chan error, 1)
	ws := dialWS(t, h, h.route("sbxidletunnel", wsBackend(t, wsEnded)))
	defer ws.CloseNow()
	if got := poolConns(h); got != 1 {
		t.Fatalf("%d upstream connections with one WebSocket open, want 1", got)
	}
	if v := gaugeValue(t, admin, "cubeproxy_websockets_open"); v != 1 {
		t.Fatalf("websockets_open = %v, want 1", v)
	}
	if v := gaugeValue(t, admin, "cubeproxy_upstream_idle_connections"); v != 0 {
		t.Errorf("upstream_idle_connections = %v with only a WebSocket's connection open, want 0", v)
	}
}
