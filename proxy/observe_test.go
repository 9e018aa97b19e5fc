package proxy

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/valyala/fasthttp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/cube-sandbox/cubeproxy/accesslog"
	"github.com/cube-sandbox/cubeproxy/internal/testenv"
	"github.com/cube-sandbox/cubeproxy/routing"
	"github.com/cube-sandbox/cubeproxy/telemetry"
)

// obsTelemetry builds telemetry as cmd does, with tracing on only when exp
// is set. The environment is ignored, so OTEL_* variables of the machine
// cannot change what the test sees.
func obsTelemetry(t testing.TB, exp sdktrace.SpanExporter) *telemetry.Telemetry {
	t.Helper()
	tel, err := telemetry.New(context.Background(), telemetry.Config{
		SpanExporter: exp,
		Env:          func(string) string { return "" },
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tel.Shutdown(context.Background()) })
	return tel
}

// obsMetricsAdmin serves the admin API of h's proxy with /metrics wired, as
// cmd does, and returns its address.
//
// Its listener retries accept errors, as ServeAdmin's does: Linux takes the
// new descriptor before it looks for a connection, so at RLIMIT_NOFILE
// every accept fails with EMFILE, queued connection or not, and fasthttp
// gives up serving on it. TestDialShortageCountedApart lowers the limit
// while this accept loop may not have run yet (a goroutine slow to start
// on a loaded machine): its scrape then waited forever for a server that
// had stopped.
func obsMetricsAdmin(t *testing.T, h *harness, tel *telemetry.Telemetry) string {
	t.Helper()
	admin := NewAdmin(AdminConfig{Metrics: tel.MetricsHandler()}, h.proxy)
	srv := &fasthttp.Server{Handler: admin.Handler}
	ln := listen(t, "127.0.0.1:0")
	go srv.Serve(newRetryListener(ln, h.proxy.cfg.Logger, nil))
	t.Cleanup(func() { _ = srv.Shutdown() })
	return ln.Addr().String()
}

// spanByKind returns the exported spans of trace id with the given kind.
func spanByKind(spans tracetest.SpanStubs, id trace.TraceID, kind trace.SpanKind) []tracetest.SpanStub {
	var out []tracetest.SpanStub
	for _, s := range spans {
		if s.SpanContext.TraceID() == id && s.SpanKind == kind {
			out = append(out, s)
		}
	}
	return out
}

// waitSpans waits until the exporter holds one server and one client span
// of trace id and returns them.
func waitSpans(t *testing.T, exp *tracetest.InMemoryExporter, id trace.TraceID) (server, client tracetest.SpanStub) {
	t.Helper()
	testenv.WaitFor(t, 5*time.Second, "server and client span", func() bool {
		spans := exp.GetSpans()
		return len(spanByKind(spans, id, trace.SpanKindServer)) == 1 && len(spanByKind(spans, id, trace.SpanKindClient)) == 1
	})
	spans := exp.GetSpans()
	return spanByKind(spans, id, trace.SpanKindServer)[0], spanByKind(spans, id, trace.SpanKindClient)[0]
}

// lastStarted returns the span of spans that started last: a request's
// last upstream attempt, of its client spans.
func lastStarted(spans []tracetest.SpanStub) tracetest.SpanStub {
	last := spans[0]
	for _, s := range spans[1:] {
		if s.StartTime.After(last.StartTime) {
			last = s
		}
	}
	return last
}

// waitAttempts waits until the exporter holds one server span and n
// client spans of trace id and returns them.
func waitAttempts(t *testing.T, exp *tracetest.InMemoryExporter, id trace.TraceID, n int) (server tracetest.SpanStub, clients []tracetest.SpanStub) {
	t.Helper()
	testenv.WaitFor(t, 5*time.Second, fmt.Sprintf("a server span and %d client spans", n), func() bool {
		spans := exp.GetSpans()
		return len(spanByKind(spans, id, trace.SpanKindServer)) == 1 && len(spanByKind(spans, id, trace.SpanKindClient)) == n
	})
	spans := exp.GetSpans()
	return spanByKind(spans, id, trace.SpanKindServer)[0], spanByKind(spans, id, trace.SpanKindClient)
}

// waitSandboxSpans waits for the server span of a request to sandbox id
// (the exporter holds only one) and its one client span, and returns them.
func waitSandboxSpans(t *testing.T, exp *tracetest.InMemoryExporter, id string) (server, client tracetest.SpanStub) {
	t.Helper()
	testenv.WaitFor(t, 5*time.Second, "spans of sandbox "+id, func() bool {
		for _, s := range exp.GetSpans() {
			if s.SpanKind != trace.SpanKindServer {
				continue
			}
			for _, a := range s.Attributes {
				if a.Key == "cube.sandbox.id" && a.Value.AsString() == id {
					server = s
				}
			}
		}
		if !server.SpanContext.IsValid() {
			return false
		}
		cs := spanByKind(exp.GetSpans(), server.SpanContext.TraceID(), trace.SpanKindClient)
		if len(cs) == 1 {
			client = cs[0]
		}
		return len(cs) == 1
	})
	return server, client
}

// checkAttrs compares span attributes (rendered with Value.String) with want.
func checkAttrs(t *testing.T, what string, got []attribute.KeyValue, want map[attribute.Key]string) {
	t.Helper()
	m := make(map[attribute.Key]string, len(got))
	for _, kv := range got {
		m[kv.Key] = kv.Value.String()
	}
	for k, v := range want {
		if g, ok := m[k]; !ok {
			t.Errorf("%s: attribute %s missing (have %v)", what, k, m)
		} else if g != v {
			t.Errorf("%s: attribute %s = %q, want %q", what, k, g, v)
		}
	}
}

// A request through the proxy is one server span (child of the client's
// traceparent) with one client span under it; the sandbox receives a
// traceparent that names the client span, in the client's trace.
func TestTracingSpansAndPropagation(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tel := obsTelemetry(t, exp)
	h := newHarness(t, func(o *harnessOpts) { o.cfg.Telemetry = tel })

	type seen struct{ traceparent, tracestate string }
	saw := make(chan seen, 1)
	port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		saw <- seen{r.Header.Get("Traceparent"), r.Header.Get("Tracestate")}
		io.WriteString(w, "pong:"+string(body))
	}))
	host := h.route("trace1", port)
	upstream := "127.0.0.1:" + itoa(port)

	tests := []struct {
		method, body, cache string
		traceID             string
	}{
		{"GET", "", "miss", "4bf92f3577b34da6a3ce929d0e0e4736"},
		{"POST", "hello", "hit", "0af7651916cd43dd8448eb211c80319c"},
	}
	const clientSpan = "00f067aa0ba902b7"
	for _, tc := range tests {
		t.Run(tc.method, func(t *testing.T) {
			tid, err := trace.TraceIDFromHex(tc.traceID)
			if err != nil {
				t.Fatal(err)
			}
			req := h.req(tc.method, host, "/t/p?q=1", strings.NewReader(tc.body))
			req.Header.Set("Traceparent", "00-"+tc.traceID+"-"+clientSpan+"-01")
			req.Header.Set("Tracestate", "vendor=abc")
			resp := h.do(req)
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 || string(body) != "pong:"+tc.body {
				t.Fatalf("got %d %q", resp.StatusCode, body)
			}
			var got seen
			select {
			case got = <-saw:
			case <-time.After(5 * time.Second):
				t.Fatal("backend saw no request")
			}

			server, client := waitSpans(t, exp, tid)
			if server.Name != "proxy "+tc.method || client.Name != "upstream "+tc.method {
				t.Errorf("span names %q, %q", server.Name, client.Name)
			}
			if p := server.Parent; !p.IsRemote() || p.TraceID() != tid || p.SpanID().String() != clientSpan {
				t.Errorf("server span parent %v, want the client's remote span %s", p, clientSpan)
			}
			if client.Parent.SpanID() != server.SpanContext.SpanID() {
				t.Errorf("client span parent %s, want the server span %s", client.Parent.SpanID(), server.SpanContext.SpanID())
			}
			checkAttrs(t, "server span", server.Attributes, map[attribute.Key]string{
				telemetry.AttrSandboxID:     "trace1",
				telemetry.AttrSandboxPort:   itoa(port),
				telemetry.AttrRouteKind:     "http",
				telemetry.AttrUpstream:      upstream,
				telemetry.AttrCacheResult:   tc.cache,
				telemetry.AttrRetries:       "0",
				"http.request.method":       tc.method,
				"url.path":                  "/t/p",
				"url.scheme":                "http",
				"client.address":            "127.0.0.1",
				"http.response.status_code": "200",
				"http.request.body.size":    strconv.Itoa(len(tc.body)),
				"http.response.body.size":   strconv.Itoa(len(body)),
			})
			checkAttrs(t, "client span", client.Attributes, map[attribute.Key]string{
				"http.request.method":       tc.method,
				"server.address":            "127.0.0.1",
				"server.port":               itoa(port),
				"http.response.status_code": "200",
			})

			// The sandbox joins the trace under the client span, not under
			// the caller's span (which a pass-through would show).
			parts := strings.Split(got.traceparent, "-")
			if len(parts) != 4 || parts[1] != tc.traceID || parts[2] != client.SpanContext.SpanID().String() || parts[3] != "01" {
				t.Errorf("backend traceparent %q, want 00-%s-%s-01", got.traceparent, tc.traceID, client.SpanContext.SpanID())
			}
			if got.tracestate != "vendor=abc" {
				t.Errorf("backend tracestate %q, want the client's", got.tracestate)
			}
			exp.Reset()
		})
	}
}

// An SSE stream's spans end when the stream ends, not when the handler
// returns: while the backend holds the stream open (waiting for the
// test's ack) no span of its trace is exported.
func TestTracingSSESpanEndsWithStream(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tel := obsTelemetry(t, exp)
	h := newHarness(t, func(o *harnessOpts) { o.cfg.Telemetry = tel })

	const first, last = heldFirst, heldLast
	port, ack := heldSSEBackend(t)
	host := h.route("tracesse", port)

	const traceID = "5bf92f3577b34da6a3ce929d0e0e4736"
	tid, _ := trace.TraceIDFromHex(traceID)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req := h.req("GET", host, "/events", nil).WithContext(ctx)
	req.Header.Set("Traceparent", "00-"+traceID+"-00f067aa0ba902b7-01")
	resp := h.do(req)
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	if ev, err := readEvent(br); err != nil || ev != "data: first\n" {
		t.Fatalf("first event %q, %v", ev, err)
	}
	// The span processor exports synchronously at End: anything ended by
	// now is in the exporter.
	if spans := exp.GetSpans(); len(spans) != 0 {
		t.Fatalf("%d span(s) exported while the stream is open (first: %q); spans must end with the stream", len(spans), spans[0].Name)
	}
	acked := time.Now()
	close(ack)
	if ev, err := readEvent(br); err != nil || ev != "data: last\n" {
		t.Fatalf("last event %q, %v", ev, err)
	}
	if rest, err := io.ReadAll(br); err != nil || len(rest) != 0 {
		t.Fatalf("after last event: %q, %v", rest, err)
	}

	server, client := waitSpans(t, exp, tid)
	if server.EndTime.Before(acked) || client.EndTime.Before(acked) {
		t.Errorf("spans ended at %v / %v, before the last event was released at %v", server.EndTime, client.EndTime, acked)
	}
	checkAttrs(t, "server span", server.Attributes, map[attribute.Key]string{
		telemetry.AttrRouteKind:     "sse",
		telemetry.AttrSandboxID:     "tracesse",
		"http.response.status_code": "200",
		"http.response.body.size":   strconv.Itoa(len(first) + len(last)),
	})
	if client.Parent.SpanID() != server.SpanContext.SpanID() {
		t.Errorf("client span is not the server span's child")
	}
}

// A response the sandbox breaks off after its head (here an event stream
// it resets), or answers with a 5xx, marks the server span as an error
// with its error.type: the client saw a failure even though a 200 went out
// with the head. A proxy's own 4xx is not an error of the server span.
func TestTracingFailedResponseIsServerSpanError(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tel := obsTelemetry(t, exp)
	h := newHarness(t, func(o *harnessOpts) { o.cfg.Telemetry = tel })
	port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/unavailable" {
			w.WriteHeader(503)
			return
		}
		f := sseHeaders(w)
		io.WriteString(w, "data: one\n\n")
		f.Flush()
		c, _, err := w.(http.Hijacker).Hijack()
		if err != nil {
			return
		}
		c.(*net.TCPConn).SetLinger(0) // a reset: the sandbox's process died
		c.Close()
	}))
	host := h.route("tracecut", port)

	tests := []struct {
		name, host, path string
		status           int
		wantCode         codes.Code
		errorType        string // "" means absent
	}{
		{"stream cut after its head", host, "/events", 200, codes.Error, CodeUpstreamReset},
		{"sandbox 5xx", host, "/unavailable", 503, codes.Error, "503"},
		{"proxy 404", "8080-tracecutmissing.cube.test", "/", 404, codes.Unset, ""},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			traceID := fmt.Sprintf("%032x", 0xc0+i)
			req := h.req("GET", tc.host, tc.path, nil)
			req.Header.Set("Traceparent", "00-"+traceID+"-00f067aa0ba902b7-01")
			resp := h.do(req)
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d, want %d", resp.StatusCode, tc.status)
			}
			tid, _ := trace.TraceIDFromHex(traceID)
			var server tracetest.SpanStub
			testenv.WaitFor(t, 5*time.Second, "server span", func() bool {
				s := spanByKind(exp.GetSpans(), tid, trace.SpanKindServer)
				if len(s) == 1 {
					server = s[0]
				}
				return len(s) == 1
			})
			if server.Status.Code != tc.wantCode {
				t.Errorf("server span status %v, want %v", server.Status.Code, tc.wantCode)
			}
			var got string
			for _, kv := range server.Attributes {
				if kv.Key == "error.type" {
					got = kv.Value.AsString()
				}
			}
			if got != tc.errorType {
				t.Errorf("server span error.type %q, want %q", got, tc.errorType)
			}
		})
	}
}

// promSample is one sample line of the Prometheus text exposition.
type promSample struct {
	name   string
	labels map[string]string
	value  float64
}

// scrapeMetrics GETs /metrics from the admin listener and parses it.
func scrapeMetrics(t *testing.T, admin string) []promSample {
	t.Helper()
	req, err := http.NewRequest("GET", "http://"+admin+"/metrics", nil)
	if err != nil {
		t.Fatal(err)
	}
	// Plain text: Go's client asks for gzip unasked, and compressing
	// and inflating each scrape under -race was a tenth of the CPU of
	// tests that scrape per case (TestSmallBodyLeftLogged: 144 scrapes).
	req.Header.Set("Accept-Encoding", "identity")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("GET /metrics: %d %s", resp.StatusCode, b)
	}
	parsed, err := testenv.ParsePromText(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	out := make([]promSample, 0, len(parsed))
	for _, p := range parsed {
		out = append(out, promSample{name: p.Name, labels: p.Labels, value: p.Value})
	}
	return out
}

// metricValue sums the samples of name whose labels include match; found
// is false when no sample matched.
func metricValue(samples []promSample, name string, match map[string]string) (v float64, found bool) {
next:
	for _, s := range samples {
		if s.name != name {
			continue
		}
		for k, want := range match {
			if s.labels[k] != want {
				continue next
			}
		}
		v += s.value
		found = true
	}
	return v, found
}

// metricDelta is one expected change between two scrapes.
type metricDelta struct {
	name   string
	labels map[string]string
	delta  float64
}

// checkDeltas returns a description of every expectation that does not hold.
func checkDeltas(before, after []promSample, want []metricDelta) []string {
	var bad []string
	for _, w := range want {
		a, ok := metricValue(after, w.name, w.labels)
		if !ok {
			bad = append(bad, fmt.Sprintf("%s%v: no such series", w.name, w.labels))
			continue
		}
		b, _ := metricValue(before, w.name, w.labels)
		if a-b != w.delta {
			bad = append(bad, fmt.Sprintf("%s%v moved by %v, want %v", w.name, w.labels, a-b, w.delta))
		}
	}
	return bad
}

// A known mix of requests moves the Prometheus counters by exactly the
// right amounts, the stream gauges go up while streams are open and back
// to 0, and no label carries a sandbox id or host.
func TestMetricsScrapeCountsKnownMix(t *testing.T) {
	tel := obsTelemetry(t, nil)
	h := newHarness(t, func(o *harnessOpts) {
		o.cfg.Telemetry = tel
		o.cache.NegativeTTL = time.Minute // the second unknown lookup must be a negative hit
	})
	admin := obsMetricsAdmin(t, h, tel)

	const okBody = "metrics body"
	okHost := h.route("sbxmetricsok", backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, okBody)
	})))
	privPort := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t.Error("restricted sandbox reached without a token")
	}))
	h.put("sbxmetricspriv", map[string]string{
		"HostIP": "127.0.0.1", "CreatedAt": "1", itoa(privPort): itoa(privPort),
		"AllowPublicTraffic": "false", "TrafficAccessToken": strings.Repeat("ab", 32),
	})
	privHost := itoa(privPort) + "-sbxmetricspriv.cube.test"
	wsEnded := make(chan error, 1)
	wsHost := h.route("sbxmetricsws", wsBackend(t, wsEnded))
	ack := make(chan struct{})
	sseHost := h.route("sbxmetricssse", backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f := sseHeaders(w)
		io.WriteString(w, "data: one\n\n")
		f.Flush()
		select {
		case <-ack:
		case <-r.Context().Done():
			return
		}
		io.WriteString(w, "data: two\n\n")
		f.Flush()
	})))
	ids := []string{"sbxmetricsok", "sbxmetricsmissing", "sbxmetricspriv", "sbxmetricsws", "sbxmetricssse", "cube.test"}

	before := scrapeMetrics(t, admin)
	const n200, n404 = 3, 2
	for range n200 {
		if st, body, _ := h.get(okHost, "/"); st != 200 || body != okBody {
			t.Fatalf("ok sandbox: %d %q", st, body)
		}
	}
	for range n404 {
		if st, _, _ := h.get("8080-sbxmetricsmissing.cube.test", "/"); st != 404 {
			t.Fatalf("unknown sandbox: %d", st)
		}
	}
	if st, _, _ := h.get(privHost, "/"); st != 403 {
		t.Fatalf("restricted sandbox without token: %d", st)
	}

	ws := dialWS(t, h, wsHost)
	during := scrapeMetrics(t, admin)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := ws.Write(ctx, websocket.MessageText, []byte("ping")); err != nil {
		t.Fatal(err)
	}
	if _, msg, err := ws.Read(ctx); err != nil || string(msg) != "ping" {
		t.Fatalf("echo %q, %v", msg, err)
	}
	ws.Close(websocket.StatusNormalClosure, "")
	select {
	case <-wsEnded:
	case <-time.After(5 * time.Second):
		t.Fatal("backend WebSocket did not end")
	}
	if bad := checkDeltas(before, during, []metricDelta{
		{"cubeproxy_websockets_open", nil, 1},
	}); len(bad) > 0 {
		t.Errorf("while the WebSocket is open: %v", bad)
	}

	sresp := h.do(h.req("GET", sseHost, "/events", nil).WithContext(ctx))
	sbr := bufio.NewReader(sresp.Body)
	if ev, err := readEvent(sbr); err != nil || ev != "data: one\n" {
		t.Fatalf("sse first event %q, %v", ev, err)
	}
	during = scrapeMetrics(t, admin)
	if bad := checkDeltas(before, during, []metricDelta{
		{"cubeproxy_streams_open", map[string]string{"route_kind": "sse"}, 1},
	}); len(bad) > 0 {
		t.Errorf("while the SSE stream is open: %v", bad)
	}
	close(ack)
	if rest, err := io.ReadAll(sbr); err != nil || string(rest) != "data: two\n\n" {
		t.Fatalf("sse rest %q, %v", rest, err)
	}
	sresp.Body.Close()

	rk := func(class, kind string) map[string]string {
		return map[string]string{"status_class": class, "route_kind": kind}
	}
	want := []metricDelta{
		{"cubeproxy_requests_total", nil, n200 + n404 + 1 + 1 + 1},
		{"cubeproxy_requests_total", rk("2xx", "http"), n200},
		{"cubeproxy_requests_total", rk("4xx", "error"), n404 + 1},
		{"cubeproxy_requests_total", rk("1xx", "websocket"), 1},
		{"cubeproxy_requests_total", rk("2xx", "sse"), 1},
		{"cubeproxy_request_duration_seconds_count", rk("2xx", "http"), n200},
		{"cubeproxy_response_duration_seconds_count", rk("2xx", "http"), n200},
		{"cubeproxy_stream_duration_seconds_count", map[string]string{"route_kind": "sse"}, 1},
		{"cubeproxy_stream_duration_seconds_count", map[string]string{"route_kind": "websocket"}, 1},
		{"cubeproxy_route_cache_lookups_total", nil, n200 + n404 + 3},
		{"cubeproxy_route_cache_lookups_total", map[string]string{"result": "miss"}, 5}, // ok, missing, priv, ws, sse
		{"cubeproxy_route_cache_lookups_total", map[string]string{"result": "hit"}, n200 - 1},
		{"cubeproxy_route_cache_lookups_total", map[string]string{"result": "negative_hit"}, n404 - 1},
		{"cubeproxy_route_cache_lookups_total", map[string]string{"result": "stale"}, 0},
		{"cubeproxy_auth_rejections_total", nil, 1},
		{"cubeproxy_auth_rejections_total", map[string]string{"reason": "traffic_token_missing"}, 1},
		{"cubeproxy_sent_bytes_total", map[string]string{"route_kind": "http"}, float64(n200 * len(okBody))},
		{"cubeproxy_sent_bytes_total", map[string]string{"route_kind": "sse"}, float64(len("data: one\n\ndata: two\n\n"))},
		{"cubeproxy_websockets_open", nil, 0},
		{"cubeproxy_streams_open", nil, 0},
	}
	// Streams and tunnels finish just after the client sees their end.
	var after []promSample
	var bad []string
	deadline := time.Now().Add(5 * time.Second)
	for {
		after = scrapeMetrics(t, admin)
		if bad = checkDeltas(before, after, want); len(bad) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	for _, b := range bad {
		t.Error(b)
	}
	for _, kind := range []string{"websocket", "sse"} {
		bIn, _ := metricValue(before, "cubeproxy_sent_bytes_total", map[string]string{"route_kind": kind})
		aIn, _ := metricValue(after, "cubeproxy_sent_bytes_total", map[string]string{"route_kind": kind})
		if aIn <= bIn {
			t.Errorf("bytes sent for %s did not grow (%v -> %v)", kind, bIn, aIn)
		}
	}
	if b, _ := metricValue(after, "cubeproxy_received_bytes_total", map[string]string{"route_kind": "websocket"}); b <= 0 {
		t.Errorf("WebSocket bytes received = %v, want > 0", b)
	}

	for _, s := range after {
		for k, v := range s.labels {
			for _, id := range ids {
				if strings.Contains(v, id) {
					t.Errorf("%s has label %s=%q naming a sandbox or host", s.name, k, v)
				}
			}
		}
	}
}

// obsLogBuf is an access log sink the test can read while the logger writes.
type obsLogBuf struct{ testenv.LogBuffer }

// logHarness starts a harness whose access log, in format, goes to the
// returned buffer.
func logHarness(t *testing.T, format string, mods ...func(*harnessOpts)) (*harness, *obsLogBuf) {
	t.Helper()
	buf := new(obsLogBuf)
	al, err := accesslog.New(accesslog.Config{Format: format, Output: buf}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = al.Close() })
	return newHarness(t, append([]func(*harnessOpts){func(o *harnessOpts) { o.cfg.AccessLog = al }}, mods...)...), buf
}

// line returns the fields of the cube line whose x_cube_request_id is id.
func (l *obsLogBuf) line(id string) ([]string, bool) {
	for _, ln := range strings.Split(l.String(), "\n") {
		if f := strings.Split(ln, "||"); len(f) == 22 && f[19] == id {
			return f, true
		}
	}
	return nil, false
}

// wait waits for the line of request id.
func (l *obsLogBuf) wait(t *testing.T, id string) []string {
	t.Helper()
	var f []string
	testenv.WaitFor(t, 5*time.Second, "access log line of "+id, func() bool {
		var ok bool
		f, ok = l.line(id)
		return ok
	})
	return f
}

// barrier sends a request to host under request id and waits for its
// (cube) line: the log is written in order by one goroutine, so every line
// logged before the request is there too.
func (l *obsLogBuf) barrier(t *testing.T, h *harness, host, id string) {
	t.Helper()
	req := h.req("GET", host, "/", nil)
	req.Header.Set("X-Cube-Request-Id", id)
	resp := h.do(req)
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	l.wait(t, id)
}

// waitJSON waits for the JSON access log line of request id and decodes it.
func (l *obsLogBuf) waitJSON(t *testing.T, id string) map[string]any {
	t.Helper()
	return l.waitJSONLine(t, `"x_cube_request_id":"`+id+`"`)
}

// waitJSONLine waits for the first JSON access log line containing match
// and decodes it.
func (l *obsLogBuf) waitJSONLine(t *testing.T, match string) map[string]any {
	t.Helper()
	var entry map[string]any
	testenv.WaitFor(t, 5*time.Second, "access log line with "+match, func() bool {
		for _, ln := range strings.Split(l.String(), "\n") {
			if strings.Contains(ln, match) {
				return json.Unmarshal([]byte(ln), &entry) == nil
			}
		}
		return false
	})
	return entry
}

// cubeFields names the 22 fields of the cube format, in order.
var cubeFields = [22]string{
	"access_time", "host", "x_real_ip", "x_forwarded_for", "server_addr", "x_forwarded_proto",
	"method", "request_uri", "args", "protocol", "uri", "status", "body_bytes_sent", "request_time",
	"connection_requests", "upstream_addr", "upstream_status", "upstream_response_time", "user_agent",
	"x_cube_request_id", "x_cube_instance_id", "backend_ip",
}

// anySeconds and anyTime stand for fields checked separately.
const (
	anySeconds = "<seconds>"
	anyTime    = "<time>"
	bodyLen    = "<length of the body the client received>"
)

func checkCubeLine(t *testing.T, got []string, want [22]string, start, end time.Time) {
	t.Helper()
	for i, w := range want {
		g := got[i]
		switch w {
		case anyTime:
			ts, err := time.ParseInLocation("2006-01-02T15:04:05.000", g, time.Local)
			if err != nil || ts.Before(start.Truncate(time.Second)) || ts.After(end) {
				t.Errorf("%s = %q, want a time in [%v, %v]", cubeFields[i], g, start, end)
			}
		case anySeconds:
			d, err := strconv.ParseFloat(g, 64)
			if err != nil || d < 0 || d > end.Sub(start).Seconds() || len(g) < 5 || g[len(g)-4] != '.' {
				t.Errorf("%s = %q, want seconds with 3 decimals within the request", cubeFields[i], g)
			}
		default:
			if g != w {
				t.Errorf("%s = %q, want %q", cubeFields[i], g, w)
			}
		}
	}
}

// The cube access-log line of a forwarded request and of a proxy error
// match field by field; connection_requests counts requests on the
// client connection.
func TestAccessLogCubeLine(t *testing.T) {
	h, buf := logHarness(t, accesslog.FormatCube)
	port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(201)
		io.WriteString(w, "created!")
	}))
	host := h.route("sbxlog", port)
	p := itoa(port)

	tests := []struct {
		name    string
		host    string
		headers map[string]string
		want    [22]string
	}{
		{
			name: "forwarded",
			host: host,
			headers: map[string]string{
				"User-Agent": "obs-test/1.0", "X-Real-IP": "198.51.100.7", "X-Forwarded-For": "203.0.113.9",
				"X-Forwarded-Proto": "https", "X-Cube-Request-Id": "req-log-1", "X-Cube-Instance-Id": "inst-7",
			},
			want: [22]string{anyTime, host, "198.51.100.7", "203.0.113.9", "127.0.0.1", "https",
				"GET", "/path/x?a=1&b=two", "a=1&b=two", "HTTP/1.1", "/path/x", "201", "8", anySeconds,
				"1", "127.0.0.1:" + p, "201", anySeconds, "obs-test/1.0",
				"req-log-1", "inst-7", "127.0.0.1"},
		},
		{
			// Same connection: the second request on it.
			name:    "forwarded, headers absent",
			host:    host,
			headers: map[string]string{"User-Agent": "obs-test/2.0", "X-Cube-Request-Id": "req-log-2"},
			want: [22]string{anyTime, host, "-", "-", "127.0.0.1", "-",
				"GET", "/path/x?a=1&b=two", "a=1&b=two", "HTTP/1.1", "/path/x", "201", "8", anySeconds,
				"2", "127.0.0.1:" + p, "201", anySeconds, "obs-test/2.0",
				"req-log-2", "-", "127.0.0.1"},
		},
		{
			name:    "unknown sandbox",
			host:    "8080-sbxlogmissing.cube.test",
			headers: map[string]string{"User-Agent": "obs-test/3.0", "X-Cube-Request-Id": "req-log-3"},
			want: [22]string{anyTime, "8080-sbxlogmissing.cube.test", "-", "-", "127.0.0.1", "-",
				"GET", "/path/x?a=1&b=two", "a=1&b=two", "HTTP/1.1", "/path/x", "404", bodyLen, anySeconds,
				"3", "-", "-", "-", "obs-test/3.0",
				"req-log-3", "-", "-"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			req := h.req("GET", tc.host, "/path/x?a=1&b=two", nil)
			for k, v := range tc.headers {
				req.Header.Set(k, v)
			}
			resp := h.do(req)
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if tc.want[12] == bodyLen {
				tc.want[12] = strconv.Itoa(len(body))
			}
			got := buf.wait(t, tc.headers["X-Cube-Request-Id"])
			checkCubeLine(t, got, tc.want, start, time.Now().Add(time.Second))
		})
	}
}

// A stream is logged once, when it ends, with its whole duration and
// bytes: an SSE stream and a WebSocket.
func TestAccessLogStreamsLogWhenTheyEnd(t *testing.T) {
	h, buf := logHarness(t, accesslog.FormatCube)

	const first, last = heldFirst, heldLast
	ssePort, ack := heldSSEBackend(t)
	sseHost := h.route("sbxlogsse", ssePort)
	plainHost := h.route("sbxlogplain", backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "ok")
	})))
	wsEnded := make(chan error, 1)
	wsHost := h.route("sbxlogws", wsBackend(t, wsEnded))

	t.Run("sse", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		start := time.Now()
		req := h.req("GET", sseHost, "/events", nil).WithContext(ctx)
		req.Header.Set("X-Cube-Request-Id", "req-sse-1")
		resp := h.do(req)
		defer resp.Body.Close()
		br := bufio.NewReader(resp.Body)
		if ev, err := readEvent(br); err != nil || ev != "data: first\n" {
			t.Fatalf("first event %q, %v", ev, err)
		}
		// A line the stream had logged at handler return would be there.
		buf.barrier(t, h, plainHost, "req-marker-1")
		if f, ok := buf.line("req-sse-1"); ok {
			t.Fatalf("stream logged while still open: %q", strings.Join(f, "||"))
		}
		// The stream stays open measurably long, so its logged duration
		// shows it covers the whole stream (not an ordering device).
		const hold = 150 * time.Millisecond
		time.Sleep(hold)
		close(ack)
		if rest, err := io.ReadAll(br); err != nil || string(rest) != last {
			t.Fatalf("rest %q, %v", rest, err)
		}
		f := buf.wait(t, "req-sse-1")
		end := time.Now().Add(time.Second)
		checkCubeLine(t, f, [22]string{anyTime, sseHost, "-", "-", "127.0.0.1", "-",
			"GET", "/events", "-", "HTTP/1.1", "/events", "200", strconv.Itoa(len(first) + len(last)), anySeconds,
			f[14], "127.0.0.1:" + itoa(ssePort), "200", anySeconds, "Go-http-client/1.1",
			"req-sse-1", "-", "127.0.0.1"}, start, end)
		if d, _ := strconv.ParseFloat(f[13], 64); d < hold.Seconds() {
			t.Errorf("request_time %s, want >= %v (the stream's lifetime)", f[13], hold)
		}
	})

	t.Run("websocket", func(t *testing.T) {
		start := time.Now()
		ws := dialWS(t, h, wsHost)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		msg := strings.Repeat("x", 100)
		if err := ws.Write(ctx, websocket.MessageText, []byte(msg)); err != nil {
			t.Fatal(err)
		}
		if _, got, err := ws.Read(ctx); err != nil || string(got) != msg {
			t.Fatalf("echo %q, %v", got, err)
		}
		ws.Close(websocket.StatusNormalClosure, "")
		testenv.Recv(t, wsEnded, 10*time.Second, "the tunnel's end at the backend")
		var f []string
		testenv.WaitFor(t, 5*time.Second, "WebSocket access log line", func() bool {
			for _, ln := range strings.Split(buf.String(), "\n") {
				if fs := strings.Split(ln, "||"); len(fs) == 22 && fs[1] == wsHost {
					f = fs
					return true
				}
			}
			return false
		})
		if f[11] != "101" || f[16] != "101" || f[7] != "/ws" || f[15] != "127.0.0.1:"+strings.Split(wsHost, "-")[0] {
			t.Errorf("WebSocket line %q", strings.Join(f, "||"))
		}
		// The request id the proxy generated for the upgrade is logged.
		if id := f[19]; id == "-" || id == "" || !strings.Contains(id, "-") {
			t.Errorf("WebSocket line without its request id: %q", strings.Join(f, "||"))
		}
		// At least the echoed frame (100 bytes payload) went to the client.
		if n, _ := strconv.Atoi(f[12]); n < len(msg) {
			t.Errorf("WebSocket body_bytes_sent %s, want >= %d", f[12], len(msg))
		}
		if d, _ := strconv.ParseFloat(f[13], 64); d < 0 || d > time.Since(start).Seconds()+1 {
			t.Errorf("WebSocket request_time %s", f[13])
		}
	})
}

// The events of heldSSEBackend.
const heldFirst, heldLast = "data: first\n\n", "data: last\n\n"

// heldSSEBackend sends heldFirst, then holds the stream open until ack is
// closed (or sent to), then sends heldLast and ends it.
func heldSSEBackend(t *testing.T) (port uint16, ack chan struct{}) {
	ack = make(chan struct{})
	port = backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f := sseHeaders(w)
		io.WriteString(w, heldFirst)
		f.Flush()
		select {
		case <-ack:
		case <-r.Context().Done():
			return
		}
		io.WriteString(w, heldLast)
		f.Flush()
	}))
	return port, ack
}

// bytes_in is the request body the client sent, chunked bodies included
// (whose Content-Length says nothing), and never what a Content-Length
// claims: a request answered before its body was read counted 1 TB for a
// client that claimed it, and two such requests overflowed the
// received-bytes counter.
func TestAccessLogBytesIn(t *testing.T) {
	h, buf := logHarness(t, accesslog.FormatJSON)
	host := h.route("bytesin", backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
	})))
	logged := func(id string) int64 {
		var e struct {
			BytesIn int64  `json:"bytes_in"`
			ID      string `json:"x_cube_request_id"`
		}
		testenv.WaitFor(t, 5*time.Second, "access log line of "+id, func() bool {
			for _, ln := range strings.Split(buf.String(), "\n") {
				if json.Unmarshal([]byte(ln), &e) == nil && e.ID == id {
					return true
				}
			}
			return false
		})
		return e.BytesIn
	}
	for _, tc := range []struct {
		id      string
		size    int64
		chunked bool
	}{
		{"bytes-fixed", 100 << 10, false},
		{"bytes-chunked", 100 << 10, true},
		{"bytes-small", 100, false}, // read whole by fasthttp, not streamed
	} {
		var body io.Reader = io.LimitReader(zeroReader{}, tc.size)
		req := h.req("POST", host, "/", body)
		if !tc.chunked {
			req.ContentLength = tc.size
		}
		req.Header.Set("X-Cube-Request-Id", tc.id)
		resp := h.do(req)
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if got := logged(tc.id); got != tc.size {
			t.Errorf("%s: bytes_in %d, want %d", tc.id, got, tc.size)
		}
	}

	// A small body to an unknown sandbox: read whole by fasthttp, counted.
	c0, err := net.Dial("tcp", h.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c0.Close()
	fmt.Fprintf(c0, "POST / HTTP/1.1\r\nHost: 50005-nosuchbox.cube.test\r\nX-Cube-Request-Id: bytes-small-404\r\nContent-Length: 100\r\n\r\n%s", strings.Repeat("x", 100))
	if resp, err := http.ReadResponse(bufio.NewReader(c0), nil); err != nil || resp.StatusCode != 404 {
		t.Fatalf("small body to an unknown sandbox: %v %v", resp, err)
	}
	if got := logged("bytes-small-404"); got != 100 {
		t.Errorf("404 with a 100-byte body: bytes_in %d, want 100", got)
	}

	// A claim of a terabyte, answered 404 before the body is read (16 KiB
	// sent: fasthttp reads the first 8 KiB before the handler runs).
	c, err := net.Dial("tcp", h.addr)
	if err != nil {
		t.Fatal(err)
	}
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	defer c.Close()
	fmt.Fprintf(c, "POST / HTTP/1.1\r\nHost: 50005-nosuchbox.cube.test\r\nX-Cube-Request-Id: bytes-claim\r\nContent-Length: 1000000000000\r\n\r\n%s", strings.Repeat("x", 16<<10))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if got := logged("bytes-claim"); resp.StatusCode != 404 || got != 8<<10 {
		t.Errorf("%d, bytes_in %d for a client that sent 16 KiB; want 404 and the 8 KiB fasthttp read", resp.StatusCode, got)
	}
}

// Requests fasthttp refuses before the handler runs (400, 431) are counted
// and logged like every other answer, on the redirect listener as on the
// traffic one.
func TestRefusedByParserCountedAndLogged(t *testing.T) {
	tel := obsTelemetry(t, nil)
	h, buf := logHarness(t, accesslog.FormatJSON, func(o *harnessOpts) { o.cfg.Telemetry = tel })
	admin := obsMetricsAdmin(t, h, tel)
	rln := listen(t, "127.0.0.1:0")
	go h.server.ServeRedirect(rln, "8443")
	class4xx := map[string]string{"status_class": "4xx", "route_kind": "error"}
	before, _ := metricValue(scrapeMetrics(t, admin), "cubeproxy_requests_total", class4xx)

	// A connection that resets before sending anything carries no request:
	// fasthttp reports it as a malformed one, and it must not be logged.
	probe, err := net.Dial("tcp", h.addr)
	if err != nil {
		t.Fatal(err)
	}
	probe.(*net.TCPConn).SetLinger(0)
	probe.Close()
	testenv.WaitFor(t, 5*time.Second, "the probe's connection to close", func() bool {
		v, _ := metricValue(scrapeMetrics(t, admin), "cubeproxy_connections_open", nil)
		return v == 0
	})

	listeners := []struct{ name, addr string }{{"traffic", h.addr}, {"redirect", rln.Addr().String()}}
	for i, l := range listeners {
		for _, tc := range []struct {
			req    string
			status int
			code   string
		}{
			{"GET / HTTP/1.1\r\nHost: 50005-a.cube.test\r\nX-Cube-Request-Id: refused-431\r\nX-Big: " + strings.Repeat("x", 40<<10) + "\r\n\r\n", 431, "request_header_too_large"},
			{"GET / HTTP/1.1\r\nHost: 50005-a.cube.test\r\nX-Cube-Request-Id: refused-400\r\nContent-Length: abc\r\n\r\n", 400, CodeBadRequest},
		} {
			c, err := net.Dial("tcp", l.addr)
			if err != nil {
				t.Fatal(err)
			}
			_ = c.SetDeadline(time.Now().Add(10 * time.Second))
			io.WriteString(c, tc.req)
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			c.Close()
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != tc.status {
				t.Fatalf("%s listener: got %d, want %d", l.name, resp.StatusCode, tc.status)
			}
			// One line per listener so far for this answer.
			testenv.WaitFor(t, 5*time.Second, fmt.Sprintf("a log line for the %s listener's %d", l.name, tc.status), func() bool {
				n := 0
				for _, ln := range strings.Split(buf.String(), "\n") {
					var e struct {
						Status int    `json:"status"`
						Code   string `json:"error_code"`
					}
					if json.Unmarshal([]byte(ln), &e) == nil && e.Status == tc.status && e.Code == tc.code {
						n++
					}
				}
				return n == i+1
			})
		}
	}
	want := float64(2 * len(listeners))
	after, _ := metricValue(scrapeMetrics(t, admin), "cubeproxy_requests_total", class4xx)
	if after-before != want {
		t.Fatalf("cubeproxy_requests_total{4xx,error} grew by %v for %v refused requests and a probe", after-before, want)
	}
	lines := strings.Count(buf.String(), "\n")
	if lines != int(want) {
		t.Fatalf("%d access log lines for %v refused requests and a probe:\n%s", lines, want, buf.String())
	}
}

// A client that sent part of a request head and then nothing until
// client.read_timeout made a request: it is answered 408 and logged and
// counted as one, as nginx logs it, over TLS and on the redirect listener
// too. One that connected and sent nothing made none (a browser's
// preconnect, a TLS handshake never finished): it is answered or closed,
// but neither logged nor counted, as by nginx.
func TestStalledHeadLogged(t *testing.T) {
	t.Parallel()
	// A TLS case's handshake, and a first request after it, share the read
	// timeout from the accept: a handshake took 296 ms of 300 on loaded
	// cores, and a longer one is cut (TestTLSHandshakeAndFirstHeadShareTheReadTimeout).
	const readTimeout = time.Second
	h, buf := logHarness(t, accesslog.FormatJSON, func(o *harnessOpts) {
		o.srv.ClientReadTimeout = readTimeout
		o.srv.ClientBodyTimeout = 300 * time.Millisecond
	})
	tlsAddr, roots := serveTLS(t, h)
	rln := listen(t, "127.0.0.1:0")
	go h.server.ServeRedirect(rln, "8443")
	for _, tc := range []struct {
		name, sent string
		logged     bool
		tls        bool
		handshake  bool // TLS: the client completes its handshake first
		redirect   bool // on the redirect listener
	}{
		{"nothing sent", "", false, false, false, false},
		{"TLS, no handshake", "", false, true, false, false},
		{"TLS, part of a ClientHello", "\x16\x03\x01\x02\x00\x01", false, true, false, false},
		{"TLS, nothing after the handshake", "", false, true, true, false},
		{"TLS, part of a head", "GET /slow HTTP/1.1\r\nHost: 50005-stall.cube.test\r\n", true, true, true, false},
		{"part of a head", "GET /slow HTTP/1.1\r\nHost: 50005-stall.cube.test\r\n", true, false, false, false},
		// fasthttp hands over this timeout as a silent connection's, the
		// head already dropped; the connection's first byte (StateActive)
		// tells them apart.
		{"part of a small body", "POST /slow HTTP/1.1\r\nHost: 50005-stall.cube.test\r\nContent-Length: 100\r\n\r\nabc", true, false, false, false},
		{"TLS, part of a small body", "POST /slow HTTP/1.1\r\nHost: 50005-stall.cube.test\r\nContent-Length: 100\r\n\r\nabc", true, true, true, false},
		// After a request on the connection, fasthttp's count tells too.
		{"part of a small body, second request", "POST /slow HTTP/1.1\r\nHost: 50005-stall.cube.test\r\nContent-Length: 100\r\n\r\nabc", true, false, false, false},
		{"TLS, part of a small body, second request", "POST /slow HTTP/1.1\r\nHost: 50005-stall.cube.test\r\nContent-Length: 100\r\n\r\nabc", true, true, true, false},
		// The redirect listener reads every body before its handler: its
		// refusals are logged as the traffic listener's, a first request's
		// stalled body too (its connection's first byte recorded as theirs).
		{"redirect, nothing sent", "", false, false, false, true},
		{"redirect, part of a head", "GET /slow HTTP/1.1\r\nHost: 50005-stall.cube.test\r\n", true, false, false, true},
		{"redirect, part of a small body", "POST /slow HTTP/1.1\r\nHost: 50005-stall.cube.test\r\nContent-Length: 100\r\n\r\nabc", true, false, false, true},
		{"redirect, part of a small body, second request", "POST /slow HTTP/1.1\r\nHost: 50005-stall.cube.test\r\nContent-Length: 100\r\n\r\nabc", true, false, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var c net.Conn
			dialed := time.Now()
			switch {
			case tc.tls && tc.handshake:
				tlc := tls.Client(dialRaw(t, tlsAddr), &tls.Config{RootCAs: roots, ServerName: "50005-stall.cube.test"})
				if err := tlc.Handshake(); err != nil {
					t.Fatal(err)
				}
				c = tlc
			case tc.tls:
				c = dialRaw(t, tlsAddr)
			case tc.redirect:
				c = dialRaw(t, rln.Addr().String())
			default:
				c = dialRaw(t, h.addr)
			}
			br := bufio.NewReader(c)
			if strings.HasSuffix(tc.name, "second request") {
				keptRequest(t, c, br, "GET / HTTP/1.1\r\nHost: 50005-none.cube.test\r\n\r\n")
				dialed = time.Now() // a later head's timeout runs from its first byte
			}
			before := len(buf.String())
			io.WriteString(c, tc.sent)
			// A first head shares the timeout with the TLS handshake, from
			// the accept: what a slow handshake (a loaded machine) took is
			// not the head's to wait.
			headLeft := readTimeout - time.Since(dialed)
			waited := headLeft.Seconds() / 2
			if strings.HasPrefix(tc.sent, "POST") {
				waited = min(waited, 0.15) // the body's 300 ms
			}
			if tc.tls && !tc.handshake {
				// No TLS to read an answer in: the proxy closes.
				_, _ = io.Copy(io.Discard, c)
			} else {
				resp, err := http.ReadResponse(br, nil)
				if err != nil {
					t.Fatalf("no answer: %v", err)
				}
				resp.Body.Close()
				if resp.StatusCode != 408 {
					t.Fatalf("got %d, want 408", resp.StatusCode)
				}
			}
			// The log is written in order: once a later request's line is
			// there, so is any line of this one.
			id := "stall-later-" + strings.ReplaceAll(tc.name, " ", "-")
			later := h.req("GET", "50005-none.cube.test", "/", nil)
			later.Header.Set("X-Cube-Request-Id", id)
			lresp := h.do(later)
			lresp.Body.Close()
			buf.waitJSON(t, id)
			var lines []map[string]any
			for _, ln := range strings.Split(buf.String()[before:], "\n") {
				var e map[string]any
				if json.Unmarshal([]byte(ln), &e) == nil && e["status"] == float64(408) {
					lines = append(lines, e)
				}
			}
			switch {
			case tc.logged && (len(lines) != 1 || lines[0]["error_code"] != "request_timeout"):
				t.Fatalf("408 lines %v, want one with error_code request_timeout", lines)
			case tc.logged && (lines[0]["method"] != "" || lines[0]["request_uri"] != "" || lines[0]["protocol"] != ""):
				// fasthttp dropped the head: not its defaults (GET / HTTP/1.1).
				t.Fatalf("logged %v %v %v, want no method, target or version", lines[0]["method"], lines[0]["request_uri"], lines[0]["protocol"])
			case tc.logged && lines[0]["request_time"].(float64) < waited:
				// From the request's first byte, on every listener: most of
				// the timeout it waited out is in it, where timing from the
				// refusal logs 0. Not all of it: fasthttp's deadline runs
				// from when it began to wait, and on a loaded machine the
				// proxy may see the client's first byte some ms after that.
				t.Fatalf("logged request_time %v, want at least %.3f, most of the timeout", lines[0]["request_time"], waited)
			case !tc.logged && len(lines) != 0:
				t.Fatalf("408 lines %v, want none", lines)
			}
		})
	}
}

// A request refused before the handler (by fasthttp's parser) is numbered
// in connection_requests as the request it is on its connection, not as
// the one before it, which fasthttp's own count still says then.
func TestRefusedByParserNumberedOnItsConnection(t *testing.T) {
	for _, redirect := range []bool{false, true} {
		t.Run(fmt.Sprintf("redirect listener %v", redirect), func(t *testing.T) {
			h, buf := logHarness(t, accesslog.FormatJSON)
			addr := h.addr
			if redirect {
				rln := listen(t, "127.0.0.1:0")
				go h.server.ServeRedirect(rln, "8443")
				addr = rln.Addr().String()
			}
			c := dialRaw(t, addr)
			br := bufio.NewReader(c)
			io.WriteString(c, "GET / HTTP/1.1\r\nHost: 50005-numbered.cube.test\r\n\r\n")
			first, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatal(err)
			}
			io.Copy(io.Discard, first.Body)
			if first.Close {
				t.Fatalf("the first answer (%d) closes the connection", first.StatusCode)
			}
			io.WriteString(c, "GET / HTTP/1.1\r\nHost: 50005-numbered.cube.test\r\nContent-Length: abc\r\n\r\n")
			second, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatal(err)
			}
			second.Body.Close()
			if second.StatusCode != 400 {
				t.Fatalf("second request: %d, want 400", second.StatusCode)
			}
			// The head went unparsed: its line is the only 400.
			if e := buf.waitJSONLine(t, `"status":400`); e["connection_requests"] != float64(2) {
				t.Errorf("connection_requests %v, want 2", e["connection_requests"])
			}
		})
	}
}

// A connect that fails ends the client span with an error status, for a
// WebSocket upgrade as for a plain request; the connect is retried once,
// and each attempt is a span.
func TestTracingFailedConnectClientSpan(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tel := obsTelemetry(t, exp)
	h := newHarness(t, func(o *harnessOpts) { o.cfg.Telemetry = tel })
	ln := listen(t, "127.0.0.1:0")
	port := uint16(ln.Addr().(*net.TCPAddr).Port)
	ln.Close() // nothing listens: the connect is refused
	for i, tc := range []struct{ name, upgrade string }{
		{"plain", ""},
		{"websocket", "Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			traceID := fmt.Sprintf("%032x", i+1)
			c, err := net.Dial("tcp", h.addr)
			if err != nil {
				t.Fatal(err)
			}
			_ = c.SetDeadline(time.Now().Add(10 * time.Second))
			defer c.Close()
			fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: %s\r\nTraceparent: 00-%s-00f067aa0ba902b7-01\r\n%s\r\n", h.route("down"+tc.name, port), traceID, tc.upgrade)
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != 502 {
				t.Fatalf("got %d, want 502", resp.StatusCode)
			}
			id, _ := trace.TraceIDFromHex(traceID)
			// Refused twice: a client span per connect.
			server, clients := waitAttempts(t, exp, id, 2)
			for i, client := range clients {
				if client.Status.Code != codes.Error {
					t.Errorf("client span %d status %v, want Error", i, client.Status.Code)
				}
			}
			// The connect's one retry is the request's.
			checkAttrs(t, "server span", server.Attributes, map[attribute.Key]string{telemetry.AttrRetries: "1"})
		})
	}
}

// A GET re-sent because the sandbox had closed the keep-alive connection
// it went out on is counted on its span; the request before it, which
// took no retry, counts none.
func TestTracingStaleConnRetryCounted(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tel := obsTelemetry(t, exp)
	h := newHarness(t, func(o *harnessOpts) { o.cfg.Telemetry = tel })
	b := newScriptBackend(t, func(c net.Conn, _ *http.Request, n int) bool {
		return closedOnSecondRequest(c, n) // the second request is re-sent
	})
	host := h.route("stale", b.port)
	c, err := net.Dial("tcp", h.addr)
	if err != nil {
		t.Fatal(err)
	}
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	defer c.Close()
	br := bufio.NewReader(c)
	for i, want := range []string{"0", "1"} {
		traceID := fmt.Sprintf("%032x", i+0x51)
		getTraced(t, c, br, host, i, traceID)
		id, _ := trace.TraceIDFromHex(traceID)
		server, _ := waitAttempts(t, exp, id, i+1) // the re-sent one has a client span per send
		checkAttrs(t, fmt.Sprintf("request %d's server span", i), server.Attributes, map[attribute.Key]string{telemetry.AttrRetries: want})
	}
}

// An error answer to HEAD carries no body, and the log says so.
func TestAccessLogHeadErrorSendsNoBody(t *testing.T) {
	h, buf := logHarness(t, accesslog.FormatJSON)
	req := h.req("HEAD", "50005-nosuchbox.cube.test", "/", nil)
	req.Header.Set("X-Cube-Request-Id", "head-404")
	resp := h.do(req)
	resp.Body.Close()
	if resp.StatusCode != 404 {
		t.Fatalf("got %d, want 404", resp.StatusCode)
	}
	var e struct {
		ID   string `json:"x_cube_request_id"`
		Sent int64  `json:"body_bytes_sent"`
	}
	testenv.WaitFor(t, 5*time.Second, "the log line", func() bool {
		for _, ln := range strings.Split(buf.String(), "\n") {
			if json.Unmarshal([]byte(ln), &e) == nil && e.ID == "head-404" {
				return true
			}
		}
		return false
	})
	if e.Sent != 0 {
		t.Fatalf("body_bytes_sent %d for a HEAD, want 0", e.Sent)
	}
}

// A request for a sandbox the proxy cannot serve still names it in the
// access log: "which sandbox was not found" is the operator's question.
func TestAccessLogNamesUnservedSandbox(t *testing.T) {
	h, buf := logHarness(t, accesslog.FormatJSON)
	h.route("sbxdead", backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {})))
	if s, b := h.adminDo("POST", "/admin/meta/delete", `{"sandbox_id":"sbxdead"}`, ""); s != 200 {
		t.Fatalf("meta/delete: %d %s", s, b)
	}
	for _, tc := range []struct {
		id     string
		status int
	}{{"sbxnothere", 404}, {"sbxdead", 410}} {
		req := h.req("GET", "8080-"+tc.id+".cube.test", "/", nil)
		req.Header.Set("X-Cube-Request-Id", "req-"+tc.id)
		resp := h.do(req)
		resp.Body.Close()
		if resp.StatusCode != tc.status {
			t.Fatalf("%s: status %d, want %d", tc.id, resp.StatusCode, tc.status)
		}
		entry := buf.waitJSON(t, "req-"+tc.id)
		if entry["sandbox_id"] != tc.id {
			t.Errorf("%d for %s logged sandbox_id %v", tc.status, tc.id, entry["sandbox_id"])
		}
	}
}

// A response whose body the sandbox cuts after the status went out is
// logged with the status and an error code saying it was cut: an operator
// must be able to tell it from a complete 200.
func TestAccessLogMarksCutBody(t *testing.T) {
	h, buf := logHarness(t, accesslog.FormatJSON)
	for _, tc := range []struct {
		name, head, body string
	}{
		{"fixed length", "HTTP/1.1 200 OK\r\nContent-Length: 300000\r\n\r\n", strings.Repeat("x", 100000)},
		{"chunked", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", "5\r\nhello\r\n"},
		{"sse", "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n", "d\r\ndata: first\n\n\r\n"},
		{"complete", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", "5\r\nhello\r\n0\r\n\r\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := make(chan struct{})
			b := newScriptBackend(t, func(c net.Conn, req *http.Request, _ int) bool {
				rawWrite(c, tc.head+tc.body)
				<-got // the client has the first bytes: the status is out
				_ = c.(*net.TCPConn).SetLinger(0)
				return false
			})
			id := "cut" + strings.ReplaceAll(tc.name, " ", "")
			req := h.req("GET", h.route(id, b.port), "/", nil)
			req.Header.Set("X-Cube-Request-Id", "req-"+id)
			resp := h.do(req)
			var one [1]byte
			_, err := io.ReadFull(resp.Body, one[:])
			close(got)
			if err != nil {
				t.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			entry := buf.waitJSON(t, "req-"+id)
			want := CodeUpstreamReset
			if tc.name == "complete" {
				want = ""
			}
			if entry["status"] != float64(200) || entry["error_code"] != want {
				t.Errorf("logged status %v error_code %q, want 200 %q", entry["status"], entry["error_code"], want)
			}
		})
	}
}

// A detached SSE stream is logged under the request id the client got, even
// when the sandbox's answer carries an X-Cube-Request-Id of its own (a
// sandbox relaying another sandbox's answer, say): the proxy replaces that
// one on the response, and the log must match the response.
func TestAccessLogDetachedStreamKeepsRequestID(t *testing.T) {
	h, buf := logHarness(t, accesslog.FormatCube)
	host := h.route("sbxlogrid", backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("X-Cube-Request-Id", "sandbox-own")
		io.WriteString(w, "data: one\n\n")
		w.(http.Flusher).Flush() // chunked: a stream, detached
	})))
	req := h.req("GET", host, "/events", nil)
	req.Header.Set("X-Cube-Request-Id", "req-detached-rid")
	resp := h.do(req)
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if got := resp.Header.Get("X-Cube-Request-Id"); got != "req-detached-rid" {
		t.Errorf("response X-Cube-Request-Id %q, want the client's", got)
	}
	// Waited for, not looked up behind a barrier request: the stream's
	// goroutine logs it after the client has read the stream's end, and
	// a barrier request may be logged first.
	buf.wait(t, "req-detached-rid")
}

// A tunnel is logged under the request id its client got, even when the
// sandbox's 101 carries an id of its own.
func TestAccessLogTunnelKeepsRequestID(t *testing.T) {
	h, buf := logHarness(t, accesslog.FormatJSON)
	b := newScriptBackend(t, func(c net.Conn, req *http.Request, _ int) bool {
		rawWrite(c, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nX-Cube-Request-Id: sandbox-own\r\n\r\n")
		return false // the tunnel ends at once, and is logged
	})
	c, err := net.Dial("tcp", h.addr)
	if err != nil {
		t.Fatal(err)
	}
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	defer c.Close()
	fmt.Fprintf(c, "GET /ws HTTP/1.1\r\nHost: %s\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"+
		"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nX-Cube-Request-Id: req-ws-rid\r\n\r\n",
		h.route("sbxlogwsrid", b.port))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 101 || resp.Header.Get("X-Cube-Request-Id") != "req-ws-rid" {
		t.Fatalf("%d with X-Cube-Request-Id %q, want 101 with the client's", resp.StatusCode, resp.Header.Get("X-Cube-Request-Id"))
	}
	if e := buf.waitJSON(t, "req-ws-rid"); e["status"] != float64(101) {
		t.Errorf("tunnel logged as %v", e)
	}
}

// The plain-HTTP redirect listener (tls.redirect_http) logs its answers
// like every other request, under the id the client got.
func TestRedirectListenerLogsRequests(t *testing.T) {
	h, buf := logHarness(t, accesslog.FormatCube)
	ln := listen(t, "127.0.0.1:0")
	go h.server.ServeRedirect(ln, "8443")
	for _, tc := range []struct {
		name, req, id, status string
	}{
		{"redirect", "GET /a?b HTTP/1.1\r\nHost: 50005-box.cube.test\r\nX-Cube-Request-Id: redir-1\r\n\r\n", "redir-1", "308"},
		{"no Host", "GET /a HTTP/1.0\r\nX-Cube-Request-Id: redir-2\r\n\r\n", "redir-2", "400"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := net.Dial("tcp", ln.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			_ = c.SetDeadline(time.Now().Add(10 * time.Second))
			defer c.Close()
			fmt.Fprint(c, tc.req)
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if got := strconv.Itoa(resp.StatusCode); got != tc.status || resp.Header.Get(HeaderRequestID) != tc.id {
				t.Fatalf("answer %s id %q, want %s %q", got, resp.Header.Get(HeaderRequestID), tc.status, tc.id)
			}
			f := buf.wait(t, tc.id)
			if f[11] != tc.status || f[10] != "/a" {
				t.Fatalf("log line %q, want status %s for /a", f, tc.status)
			}
		})
	}
}

// A body sent to the redirect listener is read whole before the 308 (that
// server does not stream bodies) when it is up to its 8 KiB: its line says
// how much was read, not 0 for a chunked body.
func TestRedirectListenerLogsBodyBytes(t *testing.T) {
	h, buf := logHarness(t, accesslog.FormatJSON)
	ln := listen(t, "127.0.0.1:0")
	go h.server.ServeRedirect(ln, "8443")
	body := strings.Repeat("x", 6000)
	chunked := fmt.Sprintf("%x\r\n%s\r\n0\r\n\r\n", len(body), body)
	for _, tc := range []struct {
		name, id, framing, body string
	}{
		{"content-length", "redir-body-1", fmt.Sprintf("Content-Length: %d", len(body)), body},
		{"chunked", "redir-body-2", "Transfer-Encoding: chunked", chunked},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := net.Dial("tcp", ln.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			_ = c.SetDeadline(time.Now().Add(10 * time.Second))
			defer c.Close()
			fmt.Fprintf(c, "POST /up HTTP/1.1\r\nHost: 50005-box.cube.test\r\nX-Cube-Request-Id: %s\r\n%s\r\n\r\n%s", tc.id, tc.framing, tc.body)
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != 308 {
				t.Fatalf("status %d, want 308", resp.StatusCode)
			}
			if e := buf.waitJSON(t, tc.id); e["bytes_in"] != float64(len(body)) {
				t.Errorf("bytes_in %v, want %d", e["bytes_in"], len(body))
			}
		})
	}
}

// An upload larger than the redirect listener buffers (8 KiB)
// is redirected like any other request, not refused 413: HTTPS streams
// bodies up to max_request_body, and a client following the 308 must get
// there instead of being told its body is too large.
func TestRedirectListenerRedirectsLargeUploads(t *testing.T) {
	h, buf := logHarness(t, accesslog.FormatJSON)
	ln := listen(t, "127.0.0.1:0")
	go h.server.ServeRedirect(ln, "8443")
	for _, tc := range []struct {
		name, id, expect string
		size             int
		// waits: the client waits for the go-ahead its Expect asks for,
		// and sends none of its body.
		waits bool
	}{
		{"content-length", "redir-big-1", "", 64 << 20, false},
		{"expect 100-continue", "redir-big-2", "Expect: 100-continue\r\n", 64 << 20, true},
		{"expect 100-continue, small", "redir-big-3", "Expect: 100-continue\r\n", 1 << 10, true},
		// Sent without waiting: the answer lingers, so the client's write
		// does not fail on a reset, nor the read of the 308 after it.
		{"expect 100-continue, body sent at once", "redir-big-4", "Expect: 100-continue\r\n", 14 << 20, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := dialRaw(t, ln.Addr().String())
			fmt.Fprintf(c, "POST /up?x=1 HTTP/1.1\r\nHost: 50005-box.cube.test\r\nX-Cube-Request-Id: %s\r\nContent-Length: %d\r\n%s\r\n",
				tc.id, tc.size, tc.expect)
			br := bufio.NewReader(c)
			if tc.expect != "" && !tc.waits {
				if _, err := c.Write(make([]byte, tc.size)); err != nil {
					t.Fatalf("sending the body: %v", err)
				}
			} else if !tc.waits {
				// The client sends what it can before it reads the answer.
				_, _ = c.Write(make([]byte, 64<<10))
			}
			// A client that waits gets the redirect instead of a 100: its
			// body is never sent in clear text.
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != 308 || resp.Header.Get("Location") != "https://50005-box.cube.test:8443/up?x=1" {
				t.Fatalf("answer %d Location %q, want 308 to https://50005-box.cube.test:8443/up?x=1", resp.StatusCode, resp.Header.Get("Location"))
			}
			if !resp.Close {
				t.Error("the connection stays open with the body unread")
			}
			if e := buf.waitJSON(t, tc.id); e["status"] != float64(308) || e["connection_requests"] != float64(1) {
				t.Errorf("logged as %v, want status 308, connection_requests 1", e)
			}
			c.Close()
		})
	}
	// Each connection's place under client.max_conns is given back, the
	// ones answered from an Expect head (hijacked to linger) included.
	h.waitClientConnsClosed(t)
}

// A route with MaskRequestHost sends the sandbox another Host, but the
// access log names the host the client asked for (nginx's $host): an
// operator looking for a sandbox's requests by its host must find them,
// whether the answer was whole or a detached stream logged at its end.
func TestAccessLogHostOfMaskedRoute(t *testing.T) {
	h, buf := logHarness(t, accesslog.FormatJSON)
	saw := make(chan string, 2)
	port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		saw <- r.Host
		if r.URL.Path == "/events" {
			w.Header().Set("Content-Type", "text/event-stream")
			io.WriteString(w, "data: one\n\n")
			w.(http.Flusher).Flush() // chunked: a stream, detached
			return
		}
		io.WriteString(w, "ok")
	}))
	h.put("sbxmasklog", map[string]string{"HostIP": "127.0.0.1", "MaskRequestHost": "localhost:${PORT}", itoa(port): itoa(port)})
	host := itoa(port) + "-sbxmasklog.cube.test"
	for _, path := range []string{"/plain", "/events"} {
		req := h.req("GET", host, path, nil)
		req.Header.Set("X-Cube-Request-Id", "req-mask"+strings.TrimPrefix(path, "/"))
		resp := h.do(req)
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if got := <-saw; got != "localhost:"+itoa(port) {
			t.Fatalf("%s: sandbox saw Host %q, want the masked one", path, got)
		}
		if e := buf.waitJSON(t, "req-mask"+strings.TrimPrefix(path, "/")); e["host"] != host {
			t.Errorf("%s: access log host %v, want %q as the client sent it", path, e["host"], host)
		}
	}
}

// request_uri, args and uri are the target as the client sent it (as
// nginx logs $request_uri), whatever the proxy forwarded and whether it
// forwarded at all: a signed token's parameter, which the proxy removes
// before forwarding, is logged (redacted) where the client put it, and an
// absolute-form target is logged as its path and query, as nginx does,
// both when it was forwarded and when the proxy answered it itself (its
// userinfo, a password, never logged).
func TestAccessLogTargetAsSent(t *testing.T) {
	s, _ := authSigner(t, strings.Repeat("k", 32))
	h, buf := logHarness(t, accesslog.FormatJSON, func(o *harnessOpts) { o.cfg.Signer = s })
	saw := make(chan string, 1)
	host := h.route("sbxtarget", backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		saw <- r.RequestURI
	})))
	const missing = "8080-sbxtargetmissing.cube.test"
	for _, tc := range []struct {
		name, host, target string
		forwarded          string // what the sandbox got; "" when not forwarded
		requestURI, uri    string // logged
	}{
		{"token removed", host, "/p?cube_token=s3cr3tvalue&x=1", "/p?x=1", "/p?cube_token=REDACTED&x=1", "/p"},
		{"absolute form", host, "http://" + host + "/p?q=1", "/p?q=1", "/p?q=1", "/p"},
		{"absolute form, empty path", host, "http://" + host + "?q=1", "/?q=1", "/?q=1", "/"},
		{"absolute form, unknown sandbox", missing, "http://" + missing + "/p?q=1", "", "/p?q=1", "/p"},
		// Refused by fasthttp (since v1.79) before the handler: logged
		// without its target, so without the password.
		{"absolute form with userinfo", host, "http://u:pa55word@" + host + "/p?q=1", "", "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id := "req-target-" + strings.NewReplacer(" ", "-", ",", "").Replace(tc.name)
			_, _, resp, _ := rawAsk(t, h.addr, "GET "+tc.target+" HTTP/1.1\r\nHost: "+tc.host+"\r\nX-Cube-Request-Id: "+id+"\r\n\r\n")
			if tc.forwarded != "" {
				if resp.StatusCode != 200 {
					t.Fatalf("status %d, want the sandbox's 200", resp.StatusCode)
				}
				if got := <-saw; got != tc.forwarded {
					t.Fatalf("the sandbox got %q, want %q", got, tc.forwarded)
				}
			}
			e := buf.waitJSON(t, id)
			args := ""
			if _, a, ok := strings.Cut(tc.requestURI, "?"); ok {
				args = a
			}
			if e["request_uri"] != tc.requestURI || e["uri"] != tc.uri || e["args"] != args {
				t.Errorf("logged request_uri %q uri %q args %q, want %q %q %q",
					e["request_uri"], e["uri"], e["args"], tc.requestURI, tc.uri, args)
			}
			if strings.Contains(buf.String(), "pa55word") {
				t.Errorf("the access log holds the target's password: %s", buf.String())
			}
		})
	}
}

// upstream_addr (and the span's upstream address) names a sandbox only
// when the proxy connected to it: a request refused after its route was
// resolved but before any dial (too many streams, a body too large) is
// logged without one, not as if the sandbox had been asked and had not
// answered.
func TestAccessLogUpstreamOnlyWhenDialed(t *testing.T) {
	h, buf := logHarness(t, accesslog.FormatJSON, func(o *harnessOpts) {
		o.cfg.MaxStreamsPerSandbox = 1
		o.cfg.MaxRequestBodySize = 1 << 10
	})
	port, ack := heldSSEBackend(t)
	defer close(ack)
	host := h.route("sbxnodial", port)
	check := func(id string, req *http.Request, status int) {
		t.Helper()
		req.Header.Set("X-Cube-Request-Id", id)
		r, err := h.client.Do(req)
		if err != nil {
			t.Fatalf("%s: %v", id, err)
		}
		io.Copy(io.Discard, r.Body)
		r.Body.Close()
		if r.StatusCode != status {
			t.Fatalf("%s: status %d, want %d", id, r.StatusCode, status)
		}
		e := buf.waitJSON(t, id)
		if e["upstream_addr"] != "" || e["upstream_response_time"] != nil || e["backend_ip"] != "127.0.0.1" {
			t.Errorf("%s: upstream_addr %q, upstream_response_time %v, backend_ip %v; want no upstream, the route's backend ip",
				id, e["upstream_addr"], e["upstream_response_time"], e["backend_ip"])
		}
	}

	check("req-nodial-413", h.req("POST", host, "/upload", strings.NewReader(strings.Repeat("x", 2<<10))), 413)

	resp := h.do(h.req("GET", host, "/events", nil))
	defer resp.Body.Close()
	if _, err := bufio.NewReader(resp.Body).ReadString('\n'); err != nil {
		t.Fatal(err) // the stream is open: the sandbox's one slot is taken
	}
	check("req-nodial-429", h.req("GET", host, "/", nil), 429)
}

// upstream_response_time is nginx's $upstream_response_time: the time the
// sandbox took, from the start of the upstream exchange to the end of its
// response. It was measured from the start of the request to the
// sandbox's response headers, so a slow route lookup (Redis) showed up as
// a slow sandbox, and a stream or download, however long its body took,
// as an instant answer.
func TestAccessLogUpstreamResponseTime(t *testing.T) {
	const pause = 300 * time.Millisecond
	quick := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "ok")
	}))
	slowBody := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "first")
		w.(http.Flusher).Flush()
		time.Sleep(pause) // the duration measured, not an ordering
		io.WriteString(w, "last")
	}))
	sse, ack := heldSSEBackend(t)
	mem := routing.NewMemoryStore()
	for id, port := range map[string]uint16{"uptquick": quick, "uptslow": slowBody, "uptsse": sse} {
		r, err := routing.ParseRouteStrict(id, map[string]string{"HostIP": "127.0.0.1", itoa(port): itoa(port)})
		if err != nil {
			t.Fatal(err)
		}
		if err := mem.Put(r); err != nil {
			t.Fatal(err)
		}
	}
	st := &gatedStore{Store: mem, entered: make(chan struct{}, 8), release: make(chan struct{})}
	h, buf := logHarness(t, accesslog.FormatJSON, func(o *harnessOpts) { o.store = st })
	times := func(id string) (request, upstream float64) {
		t.Helper()
		e := buf.waitJSON(t, id)
		up, ok := e["upstream_response_time"].(float64)
		if !ok {
			t.Fatalf("%s: upstream_response_time %v, want a number", id, e["upstream_response_time"])
		}
		return e["request_time"].(float64), up
	}
	get := func(id, host, path string) *http.Response {
		t.Helper()
		req := h.req("GET", host, path, nil)
		req.Header.Set("X-Cube-Request-Id", id)
		return h.do(req)
	}

	go func() {
		<-st.entered
		time.Sleep(pause) // a slow route lookup
		close(st.release)
	}()
	resp := get("upt-lookup", itoa(quick)+"-uptquick.cube.test", "/")
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	// The lookup's pause is in request_time and not in
	// upstream_response_time: the two differ by at least the pause (less
	// a millisecond of rounding for each). Not "up is small": a sandbox
	// slowed by a loaded machine is not a lookup counted twice.
	if req, up := times("upt-lookup"); req < pause.Seconds() || req-up < pause.Seconds()-0.002 {
		t.Errorf("slow lookup, quick sandbox: request_time %v, upstream_response_time %v; want the lookup in the first only", req, up)
	}

	resp = get("upt-body", itoa(slowBody)+"-uptslow.cube.test", "/")
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if _, up := times("upt-body"); up < pause.Seconds() {
		t.Errorf("slow body: upstream_response_time %v, want at least %v (to the end of the response)", up, pause.Seconds())
	}

	resp = get("upt-sse", itoa(sse)+"-uptsse.cube.test", "/events")
	br := bufio.NewReader(resp.Body)
	if _, err := br.ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	time.Sleep(pause) // the stream's length
	close(ack)
	io.Copy(io.Discard, br)
	resp.Body.Close()
	if _, up := times("upt-sse"); up < pause.Seconds() {
		t.Errorf("SSE stream: upstream_response_time %v, want at least %v (to the end of the stream)", up, pause.Seconds())
	}
}

// An HTTP/1.0 request in absolute form may send no Host line ("GET
// http://h/p HTTP/1.0"). The proxy routes it by the host its request line
// names, and its access log line shows that host, as nginx's $host does;
// so does the 400 for an empty Host line, rather than an empty host that
// leaves the operator guessing which sandbox it was for. With a Host line
// the line shows it as sent (the two must agree to be served).
func TestAccessLogHostOfAbsoluteFormWithoutHost(t *testing.T) {
	h, buf := logHarness(t, accesslog.FormatJSON)
	host := h.route("sbxabshost", backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "ok")
	})))
	for _, tc := range []struct{ id, head, status, want string }{
		{"req-abs10", "GET http://" + host + "/p HTTP/1.0\r\n", "200", host},
		{"req-abs10-fragment", "GET http://" + host + "/p?q#f HTTP/1.0\r\n", "200", host},
		{"req-abs10-bare", "GET http://" + host + "?q HTTP/1.0\r\n", "200", host},
		{"req-abs10-emptyhost", "GET http://" + host + "/p HTTP/1.0\r\nHost:\r\n", "400", host},
		{"req-origin10", "GET /p HTTP/1.0\r\n", "400", ""},
		{"req-abs11-host", "GET http://" + host + "/p HTTP/1.1\r\nHost: " + strings.ToUpper(host) + "\r\nConnection: close\r\n", "200", strings.ToUpper(host)},
	} {
		resp, _ := rawRequest(t, h.addr, tc.head+"X-Cube-Request-Id: "+tc.id+"\r\n\r\n")
		if got := strconv.Itoa(resp.StatusCode); got != tc.status {
			t.Errorf("%s: status %s, want %s", tc.id, got, tc.status)
		}
		if e := buf.waitJSON(t, tc.id); e["host"] != tc.want {
			t.Errorf("%s: access log host %q, want %q", tc.id, e["host"], tc.want)
		}
	}
}

// With tracing on, the proxy's traceparent takes the place of the
// client's, and the sandbox gets every other line in the client's order:
// deleting the client's traceparent moved the head's last line into its
// place (fasthttp's delete), and a field sent on several lines arrived
// reordered. The proxy's own lines (forwarding, request id) usually end
// the head; not when the client sent them all (a proxy in front, a client
// that sets its own id), which the proxy then keeps or replaces where they
// are.
func TestTracedRequestKeepsRepeatedFieldOrder(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	h := newHarness(t, func(o *harnessOpts) { o.cfg.Telemetry = obsTelemetry(t, exp) })
	got := make(chan []string, 1)
	port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- append(r.Header.Values("Accept"), r.Header.Values("Traceparent")...)
	}))
	host := h.route("tracedorder", port)
	resp, _ := rawRequest(t, h.addr, "GET / HTTP/1.1\r\nHost: "+host+"\r\n"+
		"X-Real-IP: 192.0.2.1\r\nX-Forwarded-For: 192.0.2.1\r\nX-Forwarded-Proto: https\r\nX-Cube-Request-Id: req-1\r\n"+
		"Traceparent: 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\r\nAccept: a\r\nX-Other: 1\r\nAccept: b\r\nAccept: c\r\n\r\n")
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	lines := <-got
	if len(lines) != 4 || strings.Join(lines[:3], "|") != "a|b|c" || !strings.HasPrefix(lines[3], "00-4bf92f3577b34da6a3ce929d0e0e4736-") {
		t.Errorf("the sandbox got Accept and traceparent lines %q, want a, b, c and the proxy's traceparent in the client's trace", lines)
	}
}
