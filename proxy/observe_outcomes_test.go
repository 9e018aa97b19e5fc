package proxy

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
	"github.com/cube-sandbox/cubeproxy/telemetry"
)

// spanSecret stands for a credential a request carries: it must show in
// no span.
const spanSecret = "SeCrEtVaLuE"

// spanText is every string a span exports, for the secret check.
func spanText(s tracetest.SpanStub) string {
	var b strings.Builder
	b.WriteString(s.Name + " " + s.Status.Description)
	add := func(kvs []attribute.KeyValue) {
		for _, kv := range kvs {
			b.WriteString(" " + string(kv.Key) + "=" + kv.Value.String())
		}
	}
	add(s.Attributes)
	for _, e := range s.Events {
		b.WriteString(" " + e.Name)
		add(e.Attributes)
	}
	return b.String()
}

// Every outcome a client can meet is one server span (with a client span
// only when a sandbox was asked), named for its method, with the status it
// got, an error status only for what failed on the proxy's or sandbox's
// side (5xx, timeouts; not refusals nor a client that cut its stream,
// whose span ends at the cut), and no credential the request carried in
// any attribute, event or status: not the signed token in the query, the
// userinfo of an absolute-form target, Authorization, cookies or the
// traffic and envd tokens.
func TestTracingServerSpanPerOutcome(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tel := obsTelemetry(t, exp)
	h := newHarness(t, func(o *harnessOpts) {
		o.cfg.Telemetry = tel
		o.cfg.ResponseHeaderTimeout = 300 * time.Millisecond
	})
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/slow":
			select {
			case <-release:
			case <-r.Context().Done():
			}
			return
		case "/sse":
			f := sseHeaders(w)
			io.WriteString(w, "data: one\n\n")
			f.Flush()
			<-r.Context().Done()
			return
		}
		io.WriteString(w, "ok")
	}))
	host := h.route("outcome", port)
	h.put("outcomepriv", map[string]string{
		"HostIP": "127.0.0.1", "CreatedAt": "1", itoa(port): itoa(port),
		"AllowPublicTraffic": "false", "TrafficAccessToken": strings.Repeat("ab", 32),
	})
	privHost := itoa(port) + "-outcomepriv.cube.test"
	killHost := h.route("outcomekill", port)
	if st, _ := h.adminDo("POST", "/admin/meta/delete", `{"sandbox_id":"outcomekill"}`, ""); st != 200 {
		t.Fatalf("meta/delete: %d", st)
	}
	dead := freePort(t)
	h.put("outcomedead", map[string]string{"HostIP": "127.0.0.1", "CreatedAt": "1", itoa(dead): itoa(dead)})
	deadHost := itoa(dead) + "-outcomedead.cube.test"

	secretHeaders := "Authorization: Bearer " + spanSecret + "\r\nCookie: s=" + spanSecret +
		"\r\nX-Access-Token: " + spanSecret + "\r\ne2b-traffic-access-token: " + spanSecret + "\r\n"

	tests := []struct {
		name    string
		target  string
		host    string
		status  int
		code    codes.Code
		errType string
		clientN int
		cut     bool // read the head, then reset
		path    string
	}{
		{"200 with secrets", "/p/q?cube_token=" + spanSecret + "&x=1", host, 200, codes.Unset, "", 1, false, "/p/q"},
		{"200 absolute form", "http://" + host + "/abs?cube_token=" + spanSecret, host, 200, codes.Unset, "", 1, false, "/abs"},
		{"403 refused", "/", privHost, 403, codes.Unset, "", 0, false, "/"},
		{"404 unknown", "/", "8080-outcomemissing.cube.test", 404, codes.Unset, "", 0, false, "/"},
		{"410 killed", "/", killHost, 410, codes.Unset, "", 0, false, "/"},
		// Refused, retried, refused: a client span per connect.
		{"502 refused", "/", deadHost, 502, codes.Error, CodeUpstreamConnect, 2, false, "/"},
		{"504 timeout", "/slow", host, 504, codes.Error, CodeUpstreamTimeout, 1, false, "/slow"},
		{"client cut sse", "/sse", host, 200, codes.Unset, "", 1, true, "/sse"},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			exp.Reset()
			traceID := fmt.Sprintf("%032x", 0xab00+i)
			tid, _ := trace.TraceIDFromHex(traceID)
			c := rawProxyConn(t, h, "GET "+tc.target+" HTTP/1.1\r\nHost: "+tc.host+"\r\n"+secretHeaders+
				"Traceparent: 00-"+traceID+"-00f067aa0ba902b7-01\r\nConnection: close\r\n\r\n")
			_ = c.SetDeadline(time.Now().Add(10 * time.Second))
			br := bufio.NewReader(c)
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d, want %d", resp.StatusCode, tc.status)
			}
			var cutAt time.Time
			if tc.cut {
				if ev, err := readEvent(bufio.NewReader(resp.Body)); err != nil || ev != "data: one\n" {
					t.Fatalf("event %q %v", ev, err)
				}
				if n := len(spanByKind(exp.GetSpans(), tid, trace.SpanKindServer)); n != 0 {
					t.Fatalf("server span ended while stream open")
				}
				cutAt = time.Now()
				reset(c)
			} else {
				io.Copy(io.Discard, resp.Body)
			}
			var server tracetest.SpanStub
			testenv.WaitFor(t, 10*time.Second, "server span", func() bool {
				s := spanByKind(exp.GetSpans(), tid, trace.SpanKindServer)
				if len(s) > 0 {
					server = s[0]
				}
				return len(s) > 0 && len(spanByKind(exp.GetSpans(), tid, trace.SpanKindClient)) >= tc.clientN
			})
			spans := exp.GetSpans()
			if n := len(spanByKind(spans, tid, trace.SpanKindServer)); n != 1 {
				t.Errorf("%d server spans, want 1", n)
			}
			if n := len(spanByKind(spans, tid, trace.SpanKindClient)); n != tc.clientN {
				t.Errorf("%d client spans, want %d", n, tc.clientN)
			}
			if server.Name != "proxy GET" {
				t.Errorf("name %q", server.Name)
			}
			if got := attrOf(server, "http.response.status_code"); got != fmt.Sprint(tc.status) {
				t.Errorf("status attr %q", got)
			}
			if server.Status.Code != tc.code {
				t.Errorf("span status %v (%q), want %v", server.Status.Code, server.Status.Description, tc.code)
			}
			if got := attrOf(server, "error.type"); got != tc.errType {
				t.Errorf("error.type %q, want %q", got, tc.errType)
			}
			if got := attrOf(server, "url.path"); got != tc.path {
				t.Errorf("url.path %q, want %q", got, tc.path)
			}
			if tc.cut {
				if server.EndTime.Before(cutAt) {
					t.Errorf("span ended %v before the cut %v", server.EndTime, cutAt)
				}
				if got := attrOf(server, telemetry.AttrErrorCode); got != CodeClientClosed {
					t.Errorf("cube.error.code %q", got)
				}
			}
			for _, s := range spans {
				if txt := spanText(s); strings.Contains(txt, spanSecret) {
					t.Errorf("span %q carries a secret: %s", s.Name, txt)
				}
			}
		})
	}
}

// A WebSocket's spans end when the tunnel ends, not at the 101.
func TestTracingWebSocketSpanEndsWithTunnel(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tel := obsTelemetry(t, exp)
	h := newHarness(t, func(o *harnessOpts) { o.cfg.Telemetry = tel })
	ended := make(chan error, 1)
	host := h.route("outcomews", wsBackend(t, ended))
	ws := dialWS(t, h, host)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := ws.Write(ctx, websocket.MessageText, []byte("ping")); err != nil {
		t.Fatal(err)
	}
	if _, _, err := ws.Read(ctx); err != nil {
		t.Fatal(err)
	}
	if n := len(exp.GetSpans()); n != 0 {
		t.Fatalf("%d spans ended while the tunnel is open", n)
	}
	closed := time.Now()
	ws.Close(websocket.StatusNormalClosure, "")
	select {
	case <-ended:
	case <-ctx.Done():
		t.Fatal("backend WebSocket did not end")
	}
	var server, client tracetest.SpanStub
	testenv.WaitFor(t, 5*time.Second, "the tunnel's server and client spans", func() bool {
		for _, s := range exp.GetSpans() {
			switch s.SpanKind {
			case trace.SpanKindServer:
				server = s
			case trace.SpanKindClient:
				client = s
			}
		}
		return server.SpanContext.IsValid() && client.SpanContext.IsValid()
	})
	if n := len(exp.GetSpans()); n != 2 {
		t.Errorf("%d spans, want a server and a client span", n)
	}
	if server.EndTime.Before(closed) || client.EndTime.Before(closed) {
		t.Errorf("spans ended at %v / %v, before the tunnel closed at %v", server.EndTime, client.EndTime, closed)
	}
	if client.Parent.SpanID() != server.SpanContext.SpanID() {
		t.Error("client span is not the server span's child")
	}
	if got := attrOf(server, "http.response.status_code"); got != "101" {
		t.Errorf("status %q", got)
	}
	if got := attrOf(server, telemetry.AttrRouteKind); got != "websocket" {
		t.Errorf("kind %q", got)
	}
	if server.Status.Code != codes.Unset {
		t.Errorf("status %v %q", server.Status.Code, server.Status.Description)
	}
}

// A collector that is down (its port refuses) or black-holed (it accepts
// and never reads) neither blocks nor slows requests: spans go to the batch
// processor's bounded queue, which drops when full, and the exporter's
// timeouts run on its own goroutine. Shutdown returns when its context
// ends, though the export it waits for never finishes.
func TestTracingCollectorDownDoesNotBlockRequests(t *testing.T) {
	hole := testenv.StartSilentServer(t) // accepts, never reads
	down := freePort(t)
	const queue = 64 // spans the batch processor holds
	tests := []struct{ name, proto, endpoint string }{
		{"black-holed http", "http/protobuf", hole.Addr},
		{"black-holed grpc", "grpc", hole.Addr},
		{"down http", "http/protobuf", "127.0.0.1:" + itoa(down)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			env := map[string]string{
				"OTEL_TRACES_EXPORTER":        "otlp",
				"OTEL_TRACES_SAMPLER":         "always_on",
				"OTEL_EXPORTER_OTLP_PROTOCOL": tc.proto,
			}
			// Read by the exporter and the batch processor from the process
			// environment: export at once, one span a batch, so that the
			// exporter is stuck while the requests run.
			t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://"+tc.endpoint)
			t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "1")
			t.Setenv("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "1")
			// A small queue (the default holds 2048) overflows after a few
			// requests: 1500 of them to fill the default one took 17 s in a
			// loaded full run and 47 s on a shared core, of the package's
			// 9 min.
			t.Setenv("OTEL_BSP_MAX_QUEUE_SIZE", fmt.Sprint(queue))
			tel, err := telemetry.New(context.Background(), telemetry.Config{Env: func(k string) string { return env[k] }})
			if err != nil {
				t.Fatal(err)
			}
			h := newHarness(t, func(o *harnessOpts) { o.cfg.Telemetry = tel })
			host := h.route("collectordown", backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {})))
			// Two spans a request: four times what the queue holds.
			var worst time.Duration
			for range 2 * queue {
				start := time.Now()
				if st, _, _ := h.get(host, "/"); st != 200 {
					t.Fatalf("status %d", st)
				}
				worst = max(worst, time.Since(start))
			}
			// The exporter's timeout is 10 s: one request that waited for it
			// would take that long.
			if worst > 2*time.Second {
				t.Errorf("slowest request took %v with the collector %s", worst, tc.name)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
			defer cancel()
			start := time.Now()
			_ = tel.Shutdown(ctx) // context deadline exceeded: the export never ends
			if d := time.Since(start); d > 3*time.Second {
				t.Errorf("Shutdown with a 500 ms context took %v", d)
			}
		})
	}
}

// A scripted mix (200s, a 404, a 502, a 410, an SSE stream that ends, one
// its client cuts, a WebSocket) moves every request, stream and connect
// counter by exactly what happened, and the open gauges return to 0.
func TestMetricsScrapeCountsFailuresAndCuts(t *testing.T) {
	tel := obsTelemetry(t, nil)
	h := newHarness(t, func(o *harnessOpts) { o.cfg.Telemetry = tel })
	admin := obsMetricsAdmin(t, h, tel)
	cutDone := make(chan struct{})
	ack := make(chan struct{})
	port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/sse":
			f := sseHeaders(w)
			io.WriteString(w, "data: one\n\n")
			f.Flush()
			select {
			case <-ack:
			case <-r.Context().Done():
				return
			}
			io.WriteString(w, "data: two\n\n")
		case "/cut":
			f := sseHeaders(w)
			io.WriteString(w, "data: one\n\n")
			f.Flush()
			<-r.Context().Done()
			close(cutDone)
		default:
			io.WriteString(w, "ok")
		}
	}))
	host := h.route("mixcut", port)
	killHost := h.route("mixcutkill", port)
	if st, body := h.adminDo("POST", "/admin/meta/delete", `{"sandbox_id":"mixcutkill"}`, ""); st != 200 {
		t.Fatalf("meta/delete: %d %s", st, body)
	}
	dead := freePort(t)
	h.put("mixcutdead", map[string]string{"HostIP": "127.0.0.1", "CreatedAt": "1", itoa(dead): itoa(dead)})
	deadHost := itoa(dead) + "-mixcutdead.cube.test"
	wsEnded := make(chan error, 1)
	wsHost := h.route("mixcutws", wsBackend(t, wsEnded))

	before := scrapeMetrics(t, admin)
	for _, c := range []struct {
		host   string
		status int
	}{{host, 200}, {host, 200}, {"8080-mixcutnone.cube.test", 404}, {deadHost, 502}, {killHost, 410}} {
		if st, _, _ := h.get(c.host, "/"); st != c.status {
			t.Fatalf("%s: %d want %d", c.host, st, c.status)
		}
	}
	// SSE complete.
	resp := h.do(h.req("GET", host, "/sse", nil))
	close(ack)
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	// Client cut mid-SSE.
	c := rawProxyConn(t, h, "GET /cut HTTP/1.1\r\nHost: "+host+"\r\n\r\n")
	br := bufio.NewReader(c)
	r2, err := http.ReadResponse(br, nil)
	if err != nil || r2.StatusCode != 200 {
		t.Fatal(r2, err)
	}
	if ev, err := readEvent(bufio.NewReader(r2.Body)); err != nil || ev != "data: one\n" {
		t.Fatal(ev, err)
	}
	reset(c)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	select {
	case <-cutDone:
	case <-ctx.Done():
		t.Fatal("the sandbox did not see the cut stream end")
	}
	// WebSocket.
	ws := dialWS(t, h, wsHost)
	if err := ws.Write(ctx, websocket.MessageText, []byte("x")); err != nil {
		t.Fatal(err)
	}
	if _, _, err := ws.Read(ctx); err != nil {
		t.Fatal(err)
	}
	ws.Close(websocket.StatusNormalClosure, "")
	select {
	case <-wsEnded:
	case <-ctx.Done():
		t.Fatal("backend WebSocket did not end")
	}

	rk := func(class, kind string) map[string]string {
		return map[string]string{"status_class": class, "route_kind": kind}
	}
	ek := func(kind, reason string) map[string]string {
		return map[string]string{"route_kind": kind, "reason": reason}
	}
	want := []metricDelta{
		{"cubeproxy_requests_total", nil, 8},
		{"cubeproxy_requests_total", rk("2xx", "http"), 2},
		{"cubeproxy_requests_total", rk("2xx", "sse"), 2},
		{"cubeproxy_requests_total", rk("4xx", "error"), 2},
		{"cubeproxy_requests_total", rk("5xx", "error"), 1},
		{"cubeproxy_requests_total", rk("1xx", "websocket"), 1},
		{"cubeproxy_upstream_connect_errors_total", nil, 1},
		{"cubeproxy_streams_ended_total", nil, 3},
		{"cubeproxy_streams_ended_total", ek("sse", "complete"), 1},
		{"cubeproxy_streams_ended_total", ek("sse", "client"), 1},
		{"cubeproxy_streams_ended_total", ek("websocket", "complete"), 1},
		{"cubeproxy_stream_duration_seconds_count", nil, 3},
		{"cubeproxy_response_duration_seconds_count", nil, 5},
		{"cubeproxy_request_duration_seconds_count", nil, 8},
		{"cubeproxy_streams_open", nil, 0},
		{"cubeproxy_websockets_open", nil, 0},
		{"cubeproxy_sent_bytes_total", map[string]string{"route_kind": "sse"}, float64(len("data: one\n\ndata: two\n\n") + len("data: one\n\n"))},
	}
	var bad []string
	deadline := time.Now().Add(5 * time.Second)
	for {
		after := scrapeMetrics(t, admin)
		if bad = checkDeltas(before, after, want); len(bad) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	for _, b := range bad {
		t.Error(b)
	}
}
