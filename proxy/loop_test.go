package proxy

import (
	"encoding/json"
	"io"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/accesslog"
)

// A route that names the proxy's own listener (a host port the control
// plane mapped onto the proxy's, a HostIP of this node with the proxy's
// port) sent each request back into the proxy, which routed it again: a
// thousand hops, one pool slot, two descriptors and an access-log line
// each, until the pool limit answered the innermost one 503 upstream_busy
// ("retry in 1 s"). The proxy now refuses the connection it made to
// itself: one 508 proxy_loop, one log line, nothing counted against the
// sandbox, nothing left open.
func TestRouteToOwnListenerIsALoop(t *testing.T) {
	tel := obsTelemetry(t, nil)
	h, logs := logHarness(t, accesslog.FormatJSON, func(o *harnessOpts) { o.cfg.Telemetry = tel })
	metricsAddr := obsMetricsAdmin(t, h, tel)
	port := func(addr string) uint16 {
		_, p, _ := net.SplitHostPort(addr)
		n, _ := strconv.Atoi(p)
		return uint16(n)
	}
	// A listener on every address (":8081", as configured by default),
	// reached through 127.0.0.1.
	wild := listen(t, ":0")
	t.Cleanup(func() { wild.Close() })
	h.proxy.addListener(wild.Addr())
	for _, tc := range []struct {
		name string
		port uint16
	}{
		{"traffic listener", port(h.addr)},
		{"admin listener", port(h.admin)},
		{"wildcard listener", port(wild.Addr().String())},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id := "loop-" + strings.ReplaceAll(tc.name, " ", "-")
			host := h.route("selfloop", tc.port)
			before := scrapeMetrics(t, metricsAddr)
			req := h.req("GET", host, "/", nil)
			req.Header.Set("X-Cube-Request-Id", id)
			resp := h.do(req)
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			var body map[string]string
			if err := json.Unmarshal(b, &body); err != nil {
				t.Fatalf("status %d, body %q: %v", resp.StatusCode, b, err)
			}
			if resp.StatusCode != 508 || body["code"] != CodeProxyLoop || body["sandbox_id"] != "selfloop" {
				t.Fatalf("got %d %q, want 508 %s for sandbox selfloop", resp.StatusCode, b, CodeProxyLoop)
			}
			if ra := resp.Header.Get("Retry-After"); ra != "" {
				t.Errorf("Retry-After %q: retrying cannot help a loop", ra)
			}

			e := logs.waitJSON(t, id)
			if e["error_code"] != CodeProxyLoop || e["status"] != float64(508) {
				t.Errorf("access log: status %v error_code %v, want 508 %s", e["status"], e["error_code"], CodeProxyLoop)
			}
			n := strings.Count(logs.String(), `"x_cube_request_id":"`+id+`"`)
			if n != 1 {
				t.Errorf("%d access log lines for one request, want 1", n)
			}

			after := scrapeMetrics(t, metricsAddr)
			for _, bad := range checkDeltas(before, after, []metricDelta{
				{"cubeproxy_requests_total", map[string]string{"status_class": "5xx"}, 1},
				{"cubeproxy_requests_total", nil, 1},
				{"cubeproxy_upstream_connect_errors_total", nil, 0},
				{"cubeproxy_upstream_retries_total", nil, 0},
			}) {
				t.Error(bad)
			}
			if _, conns, _ := h.proxy.pools.stats(); conns != 0 {
				t.Errorf("%d sandbox connections left open, want 0", conns)
			}
		})
	}
}

// TestClaimedListenerIsALoopBeforeItServes checks that a listener claimed
// (Server.Claim, as serve does before any listener serves) is the proxy's
// own before its Serve starts: each Serve records its listener in its own
// goroutine, so a request on the first one serving could be sent to the
// admin listener's port, whose loopback rule would take the proxy for a
// local client.
func TestClaimedListenerIsALoopBeforeItServes(t *testing.T) {
	h := newHarness(t, func(o *harnessOpts) { o.cfg.ResponseHeaderTimeout = 2 * time.Second })
	ln := listen(t, "127.0.0.1:0")
	t.Cleanup(func() { ln.Close() })
	h.server.Claim(nil, ln)
	_, p, _ := net.SplitHostPort(ln.Addr().String())
	port, _ := strconv.Atoi(p)
	resp := h.do(h.req("GET", h.route("notyet", uint16(port)), "/", nil))
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 508 || !strings.Contains(string(b), CodeProxyLoop) {
		t.Fatalf("got %d %q, want 508 %s", resp.StatusCode, b, CodeProxyLoop)
	}
}
