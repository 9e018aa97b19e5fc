package telemetry

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"testing"
	"time"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// spanNames lists the span names in an OTLP export request.
func spanNames(req *coltracepb.ExportTraceServiceRequest) []string {
	var names []string
	for _, rs := range req.GetResourceSpans() {
		for _, ss := range rs.GetScopeSpans() {
			for _, s := range ss.GetSpans() {
				names = append(names, s.GetName())
			}
		}
	}
	return names
}

// exportOneSpan builds Telemetry from env (OTLP chosen by OTEL_* variables),
// ends one sampled span and shuts down, which flushes the batch.
func exportOneSpan(t *testing.T, env map[string]string) {
	t.Helper()
	tel, err := New(context.Background(), Config{Env: envMap(env), TraceSampleRatio: 1})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	if !tel.TracingEnabled() {
		t.Fatal("tracing off with OTEL_TRACES_EXPORTER=otlp")
	}
	_, span := tel.StartServerSpan(inbound("GET", ""), false, netip.Addr{})
	EndServerSpan(span, &SpanResult{Status: 200})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := tel.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
}

func TestOTLPHTTPExport(t *testing.T) {
	got := make(chan *coltracepb.ExportTraceServiceRequest, 4)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		req := &coltracepb.ExportTraceServiceRequest{}
		if r.URL.Path != "/v1/traces" || proto.Unmarshal(body, req) != nil {
			http.Error(w, "bad export", http.StatusBadRequest)
			return
		}
		got <- req
		w.Header().Set("Content-Type", "application/x-protobuf")
		out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
		w.Write(out)
	}))
	defer srv.Close()
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", srv.URL) // read by otlptracehttp itself

	exportOneSpan(t, map[string]string{"OTEL_TRACES_EXPORTER": "otlp"})
	select {
	case req := <-got:
		if names := spanNames(req); len(names) != 1 || names[0] != "proxy GET" {
			t.Errorf("exported spans %v, want [proxy GET]", names)
		}
	default:
		t.Fatal("collector received no export after Shutdown")
	}
}

type traceCollector struct {
	coltracepb.UnimplementedTraceServiceServer
	got chan *coltracepb.ExportTraceServiceRequest
}

func (c *traceCollector) Export(_ context.Context, req *coltracepb.ExportTraceServiceRequest) (*coltracepb.ExportTraceServiceResponse, error) {
	c.got <- req
	return &coltracepb.ExportTraceServiceResponse{}, nil
}

func TestOTLPGRPCExport(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	col := &traceCollector{got: make(chan *coltracepb.ExportTraceServiceRequest, 4)}
	srv := grpc.NewServer()
	coltracepb.RegisterTraceServiceServer(srv, col)
	go srv.Serve(ln)
	defer srv.Stop()
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://"+ln.Addr().String())
	t.Setenv("OTEL_EXPORTER_OTLP_INSECURE", "true")

	exportOneSpan(t, map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc"})
	select {
	case req := <-col.got:
		if names := spanNames(req); len(names) != 1 || names[0] != "proxy GET" {
			t.Errorf("exported spans %v, want [proxy GET]", names)
		}
	default:
		t.Fatal("collector received no export after Shutdown")
	}
}

// Shutdown says when the spans it was to flush did not reach the
// collector: the batch processor's own last export reports a failure only
// to OpenTelemetry's global error handler (throttled in the binary, so a
// failure within 10 s of the last one said nothing), and its Shutdown
// returned nil. A collector that answers, or one that refuses the
// connection, or one that rejects the export, each say what they should.
func TestShutdownReportsUnflushedSpans(t *testing.T) {
	ok := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/x-protobuf")
	}))
	defer ok.Close()
	rejecting := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		http.Error(w, "no", http.StatusBadRequest) // not retried
	}))
	defer rejecting.Close()
	refusedURL := "http://" + testenv.RefusingAddr(t)

	for _, tc := range []struct {
		name, endpoint string
		fails          bool
	}{
		{"collector answers", ok.URL, false},
		{"collector refuses the connection", refusedURL, true},
		{"collector rejects the export", rejecting.URL, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", tc.endpoint) // read by the exporter itself
			tel, err := New(context.Background(), Config{Env: envMap(map[string]string{"OTEL_TRACES_EXPORTER": "otlp"}), TraceSampleRatio: 1})
			if err != nil {
				t.Fatal(err)
			}
			_, span := tel.StartServerSpan(inbound("GET", ""), false, netip.Addr{})
			EndServerSpan(span, &SpanResult{Status: 200})
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			err = tel.Shutdown(ctx)
			if tc.fails && err == nil {
				t.Error("Shutdown returned nil with the span not exported")
			}
			if !tc.fails && err != nil {
				t.Errorf("Shutdown: %v", err)
			}
		})
	}
}
