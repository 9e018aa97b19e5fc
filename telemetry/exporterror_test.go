package telemetry

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// echoingCollector is a gRPC trace receiver that refuses every export with
// an error quoting the request's metadata, as some gateways do.
type echoingCollector struct {
	coltracepb.UnimplementedTraceServiceServer
}

func (echoingCollector) Export(ctx context.Context, _ *coltracepb.ExportTraceServiceRequest) (*coltracepb.ExportTraceServiceResponse, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	return nil, status.Errorf(codes.Unauthenticated, "key %q not known (authorization %q)",
		strings.Join(md.Get("x-api-key"), ","), strings.Join(md.Get("authorization"), ","))
}

// A failed export's error, which serve logs, never holds the collector's
// credential from OTEL_EXPORTER_OTLP_HEADERS and stays short, whatever the
// collector answers. The exporters quote the collector's answer whole: a
// 400 or 429 body echoing the request's headers put the API key in the
// process log ("X-Api-Key:[SECRETKEY123]"), so did a gRPC status message,
// and a 3 MiB error page made a 3 MiB log line.
func TestExportErrorHidesCredentialsAndIsBounded(t *testing.T) {
	const key, token = "SECRETKEY123", "tok-abcdef"
	echo := func(w http.ResponseWriter, r *http.Request, code int) {
		http.Error(w, fmt.Sprintf("refused, headers: %v", r.Header), code)
	}
	for _, tc := range []struct {
		name   string
		answer http.HandlerFunc // nil: the gRPC collector
		want   string           // in the error: what the collector said
	}{
		{"400 echoing the headers", func(w http.ResponseWriter, r *http.Request) { echo(w, r, http.StatusBadRequest) }, "400 Bad Request"},
		{"429 echoing the headers", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Retry-After", "1")
			echo(w, r, http.StatusTooManyRequests)
		}, "refused"},
		{"401 with a 3 MiB body", func(w http.ResponseWriter, _ *http.Request) {
			w.WriteHeader(http.StatusUnauthorized)
			w.Write([]byte(strings.Repeat("x", 3<<20)))
		}, "401 Unauthorized"},
		{"gRPC status echoing the metadata", nil, "Unauthenticated"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := map[string]string{"OTEL_TRACES_EXPORTER": "otlp"}
			if tc.answer != nil {
				srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					io.Copy(io.Discard, r.Body)
					tc.answer(w, r)
				}))
				defer srv.Close()
				t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", srv.URL)
			} else {
				ln, err := net.Listen("tcp", "127.0.0.1:0")
				if err != nil {
					t.Fatal(err)
				}
				srv := grpc.NewServer()
				coltracepb.RegisterTraceServiceServer(srv, echoingCollector{})
				go srv.Serve(ln)
				defer srv.Stop()
				t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://"+ln.Addr().String())
				env["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"] = "grpc"
			}
			t.Setenv("OTEL_EXPORTER_OTLP_HEADERS", "x-api-key="+key+",authorization=Bearer%20"+token)
			t.Setenv("OTEL_BSP_EXPORT_TIMEOUT", "300") // the 429 is retried until then
			reported := captureOTelErrors(t)
			tel, err := New(context.Background(), Config{Env: envMap(env), TraceSampleRatio: 1})
			if err != nil {
				t.Fatal(err)
			}
			endSpans(tel, 3)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			flushErr := tel.tp.ForceFlush(ctx) // the export's error, as the processor reports it
			if flushErr == nil {
				t.Fatal("the export did not fail")
			}
			if got := values(scrape(t, tel))["cubeproxy_spans_dropped_total"]; got != 3 {
				t.Errorf("cubeproxy_spans_dropped_total = %v, want 3", got)
			}
			_ = tel.Shutdown(ctx)
			for _, msg := range append(reported(), flushErr.Error()) {
				shown := msg
				if len(shown) > 200 {
					shown = shown[:200] + "..."
				}
				if strings.Contains(msg, key) || strings.Contains(msg, token) {
					t.Errorf("export error holds the credential: %s", shown)
				}
				if len(msg) > maxExportErrorLen+64 {
					t.Errorf("export error of %d bytes: %s", len(msg), shown)
				}
				if !strings.HasPrefix(msg, "traces export: ") || !strings.Contains(msg, tc.want) {
					t.Errorf("export error %q does not say %q", shown, tc.want)
				}
			}
		})
	}
}
