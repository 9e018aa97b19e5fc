package proxy

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/fasthttputil"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/cube-sandbox/cubeproxy/accesslog"
	"github.com/cube-sandbox/cubeproxy/routing"
	"github.com/cube-sandbox/cubeproxy/telemetry"
)

// benchInstr selects the instrumentation of a bench proxy.
type benchInstr struct {
	telemetry bool   // telemetry.New with tracing off
	tracing   bool   // telemetry.New with tracing on, every trace sampled, spans discarded
	logFormat string // access log format to io.Discard; "" = no access log
	body      int    // the backend's answer body size; 0: a short greeting
	tcp       bool   // clients connect over loopback TCP, as to a traffic listener (clientConn), not in memory
	maxConns  int    // client.max_conns: connections waiting for a request are tracked (Proxy.waiting)
	byPath    bool   // requests name the sandbox in the path (/sandbox/<id>/<port>/), not in Host
	envd      bool   // requests are envd calls (/files), which the cube_proxy_* families count
	post      bool   // requests are POSTs with a small JSON body, as an MCP client's
	kaHint    bool   // the backend answers with a Keep-Alive timeout hint, as Node's http.Server
}

// discardExporter is a span exporter that drops what it is given: the
// cost of a traced request without the cost of keeping its spans.
type discardExporter struct{}

func (discardExporter) ExportSpans(context.Context, []sdktrace.ReadOnlySpan) error { return nil }
func (discardExporter) Shutdown(context.Context) error                             { return nil }

// newBenchProxy starts a proxy on an in-memory listener in front of a
// fasthttp backend on a loopback port (the proxy dials backends by TCP
// address) and returns a function doing one full request through it.
func newBenchProxy(tb testing.TB, in benchInstr) func() {
	tb.Helper()
	bln := listen(tb, "127.0.0.1:0")
	body := []byte("hello from the sandbox")
	if in.body > 0 {
		body = make([]byte, in.body)
	}
	backendSrv := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
		if in.kaHint {
			ctx.Response.Header.Set(fasthttp.HeaderKeepAlive, "timeout=5")
		}
		ctx.SetBody(body)
	}}
	go backendSrv.Serve(bln)
	tb.Cleanup(func() { _ = backendSrv.Shutdown() })
	port := strconv.Itoa(bln.Addr().(*net.TCPAddr).Port)

	ms := routing.NewMemoryStore()
	r, err := routing.ParseRouteStrict("bench", map[string]string{"HostIP": "127.0.0.1", "CreatedAt": "1", port: port})
	if err != nil {
		tb.Fatal(err)
	}
	if err := ms.Put(r); err != nil {
		tb.Fatal(err)
	}
	cfg := Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	var store routing.Store = ms
	if in.telemetry || in.tracing {
		var exp sdktrace.SpanExporter
		if in.tracing {
			exp = discardExporter{}
		}
		cfg.Telemetry = obsTelemetry(tb, exp)
		store = InstrumentStore(ms, cfg.Telemetry.Metrics, telemetry.StoreMemory)
	}
	if in.logFormat != "" {
		var onDrop func()
		if cfg.Telemetry != nil {
			onDrop = cfg.Telemetry.Metrics.AccessLogDropped
		}
		al, err := accesslog.New(accesslog.Config{Format: in.logFormat, Output: io.Discard}, onDrop)
		if err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(func() { _ = al.Close() })
		cfg.AccessLog = al
	}
	var client *fasthttp.HostClient
	var req *fasthttp.Request
	var resp *fasthttp.Response
	if in.tcp {
		ln := listen(tb, "127.0.0.1:0")
		client, req, resp = servedProxy(tb, cfg, ServerConfig{MaxClientConns: in.maxConns}, store, ln, func(string) (net.Conn, error) { return net.Dial("tcp", ln.Addr().String()) })
	} else {
		client, req, resp = inmemoryProxy(tb, cfg, store)
	}
	path := "/path?q=1"
	if in.envd {
		path = "/files?path=/x"
	}
	uri := "http://" + port + "-bench.cube.test" + path
	if in.byPath {
		uri = "http://proxy/sandbox/bench/" + port + path
	}
	return func() {
		req.Reset()
		req.SetRequestURI(uri)
		if in.post {
			req.Header.SetMethod("POST")
			req.Header.SetContentType("application/json")
			req.SetBodyRaw(benchPostBody)
		}
		// A browser's: what a traced request records of it is measured.
		req.Header.Set("User-Agent", benchUserAgent)
		if err := client.Do(req, resp); err != nil {
			panic(fmt.Sprintf("request through proxy: %v", err))
		}
		if resp.StatusCode() != 200 || len(resp.Body()) != len(body) {
			panic(fmt.Sprintf("request through proxy: %d %q", resp.StatusCode(), resp.Body()))
		}
	}
}

// inmemoryProxy serves a proxy with cfg in front of store on an in-memory
// listener, and returns a client to it with a request and a response to
// reuse, released at the test's end.
func inmemoryProxy(tb testing.TB, cfg Config, store routing.Store) (*fasthttp.HostClient, *fasthttp.Request, *fasthttp.Response) {
	tb.Helper()
	ln := fasthttputil.NewInmemoryListener()
	return servedProxy(tb, cfg, ServerConfig{}, store, ln, func(string) (net.Conn, error) { return ln.Dial() })
}

// servedProxy is inmemoryProxy on ln, served with srvCfg, whose
// connections dial makes.
func servedProxy(tb testing.TB, cfg Config, srvCfg ServerConfig, store routing.Store, ln net.Listener, dial fasthttp.DialFunc) (*fasthttp.HostClient, *fasthttp.Request, *fasthttp.Response) {
	tb.Helper()
	cache, err := routing.NewCache(store, routing.CacheConfig{})
	if err != nil {
		tb.Fatal(err)
	}
	p, err := New(cfg, cache)
	if err != nil {
		tb.Fatal(err)
	}
	srv := NewServer(srvCfg, p, nil)
	go srv.Serve(ln)
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		_ = ln.Close()
	})
	client := &fasthttp.HostClient{Addr: "proxy", Dial: dial}
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	tb.Cleanup(func() { fasthttp.ReleaseRequest(req); fasthttp.ReleaseResponse(resp) })
	return client, req, resp
}

func benchRequests(b *testing.B, in benchInstr) {
	do := newBenchProxy(b, in)
	do() // route cached, connections open
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		do()
	}
}

// BenchmarkRequestPlain is the request path with no instrumentation at all.
func BenchmarkRequestPlain(b *testing.B) { benchRequests(b, benchInstr{}) }

// BenchmarkRequestPlainTCP is BenchmarkRequestPlain with the client on
// loopback TCP: its connection is a clientConn, as every client's is.
func BenchmarkRequestPlainTCP(b *testing.B) { benchRequests(b, benchInstr{tcp: true}) }

// BenchmarkRequestPlainTCPMaxConns is BenchmarkRequestPlainTCP with
// client.max_conns set: each request takes its connection off the list of
// those waiting for one and puts it back (Proxy.waiting).
func BenchmarkRequestPlainTCPMaxConns(b *testing.B) {
	benchRequests(b, benchInstr{tcp: true, maxConns: 1000})
}

// BenchmarkRequestKeepAliveHint is BenchmarkRequestPlain with a backend
// that announces its idle timeout (Keep-Alive: timeout=5), which the proxy
// reads from every answer (keepAliveReuse).
func BenchmarkRequestKeepAliveHint(b *testing.B) { benchRequests(b, benchInstr{kaHint: true}) }

// BenchmarkRequestPost is BenchmarkRequestPlain with a POST of a small
// JSON body, as an MCP client's tools/call: the body is streamed to the
// sandbox. Its one allocation is fasthttp's, which drains the streamed
// body after the handler through io.CopyN (an io.LimitedReader).
func BenchmarkRequestPost(b *testing.B) { benchRequests(b, benchInstr{post: true}) }

// benchPostBody is BenchmarkRequestPost's body.
var benchPostBody = []byte(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"run","arguments":{"cmd":"ls -la /workspace"}}}`)

// BenchmarkRequestByPath is BenchmarkRequestPlain routed by the path
// (/sandbox/<id>/<port>/path) instead of the host.
func BenchmarkRequestByPath(b *testing.B) { benchRequests(b, benchInstr{byPath: true}) }

// BenchmarkRequestInstrumentedTracingOff adds metrics (tracing off, the
// default) and a JSON access log to io.Discard.
func BenchmarkRequestInstrumentedTracingOff(b *testing.B) {
	benchRequests(b, benchInstr{telemetry: true, logFormat: accesslog.FormatJSON})
}

// BenchmarkRequestTracingOn is BenchmarkRequestInstrumentedTracingOff with
// tracing on, every request sampled and its spans dropped by the exporter:
// what a traced request costs in the proxy (and the OTel SDK).
func BenchmarkRequestTracingOn(b *testing.B) {
	benchRequests(b, benchInstr{tracing: true, logFormat: accesslog.FormatJSON})
}

// benchUserAgent is the User-Agent of benchmark requests: a browser's.
const benchUserAgent = "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.0.0 Safari/537.36"

// A full request allocates nothing (whole process: client, proxy,
// backend), and with tracing off metrics and the access log add no
// allocation to it. make test runs this without -race.
func TestInstrumentationAddsNoAllocs(t *testing.T) {
	if raceDetectorOn {
		t.Skip("the race detector changes allocation counts; run without -race (also: go test -bench Request -run ^$ ./proxy)")
	}
	const runs = 2000
	measure := func(in benchInstr) float64 {
		do := newBenchProxy(t, in)
		for range 100 { // warm pools, route cache and keep-alive connections
			do()
		}
		return testing.AllocsPerRun(runs, do)
	}
	plain := measure(benchInstr{})
	if plain != 0 {
		t.Errorf("a full request with no instrumentation allocates %v times, want 0", plain)
	}
	tests := []struct {
		name string
		in   benchInstr
	}{
		{"client over TCP (clientConn)", benchInstr{tcp: true}},
		{"routed by path", benchInstr{byPath: true}},
		{"client over TCP, client.max_conns set", benchInstr{tcp: true, maxConns: 1000}},
		{"metrics", benchInstr{telemetry: true}},
		{"metrics, an envd call by path", benchInstr{telemetry: true, envd: true, byPath: true}},
		{"metrics+json log", benchInstr{telemetry: true, logFormat: accesslog.FormatJSON}},
		{"metrics+cube log", benchInstr{telemetry: true, logFormat: accesslog.FormatCube}},
	}
	for _, tc := range tests {
		got := measure(tc.in)
		t.Logf("allocs per request: plain %v, %s %v", plain, tc.name, got)
		if got > plain {
			t.Errorf("%s: %v allocs per request, plain %v: instrumentation allocates", tc.name, got, plain)
		}
	}
}
