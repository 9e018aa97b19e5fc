package proxy

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/cube-sandbox/cubeproxy/telemetry"
)

// otlpPaths is an OTLP/HTTP trace collector that keeps the url.path of
// every server span it receives.
type otlpPaths struct {
	mu    sync.Mutex
	paths []string
}

func (c *otlpPaths) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	req := &coltracepb.ExportTraceServiceRequest{}
	if err := proto.Unmarshal(body, req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	c.mu.Lock()
	for _, rs := range req.GetResourceSpans() {
		for _, ss := range rs.GetScopeSpans() {
			for _, s := range ss.GetSpans() {
				for _, a := range s.GetAttributes() {
					if a.GetKey() == "url.path" {
						c.paths = append(c.paths, a.GetValue().GetStringValue())
					}
				}
			}
		}
	}
	c.mu.Unlock()
	out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	w.Write(out)
}

// A request target with bytes that are not UTF-8 (fasthttp takes any byte
// above 0x7F) must not cost the traces of other requests: OTLP strings are
// UTF-8, and one such url.path made the exporter refuse the whole batch.
func TestTracingInvalidUTF8PathExported(t *testing.T) {
	col := &otlpPaths{}
	srv := httptest.NewServer(col)
	defer srv.Close()
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", srv.URL) // read by otlptracehttp itself
	t.Setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "")
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "")
	t.Setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "")
	env := map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_TRACES_SAMPLER": "always_on"}
	tel, err := telemetry.New(context.Background(), telemetry.Config{Env: func(k string) string { return env[k] }})
	if err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, func(o *harnessOpts) { o.cfg.Telemetry = tel })
	port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "ok")
	}))
	host := h.route("utf8path", port)

	c := dialRaw(t, h.addr)
	if _, err := io.WriteString(c, "GET /bad\xff\xfepath HTTP/1.1\r\nHost: "+host+"\r\nConnection: close\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	if b, _ := io.ReadAll(c); len(b) < 12 || string(b[:12]) != "HTTP/1.1 200" {
		t.Fatalf("raw request answered %q, want a 200 (the test needs the proxy to take the target)", b)
	}
	if code, body, _ := h.get(host, "/good"); code != 200 {
		t.Fatalf("GET /good: %d %s", code, body)
	}

	// Shutdown flushes the batch: both spans, or neither, are exported.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := tel.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	col.mu.Lock()
	got := slices.Clone(col.paths)
	col.mu.Unlock()
	slices.Sort(got)
	if want := []string{"/bad\uFFFDpath", "/good"}; !slices.Equal(got, want) {
		t.Errorf("collector received server spans with url.path %q, want %q", got, want)
	}
}
