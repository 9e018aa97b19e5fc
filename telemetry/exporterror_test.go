package telemetry

import (
	"context"
	"encoding/pem"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
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
		name    string
		answer  http.HandlerFunc // nil: the gRPC collector
		want    string           // in the error: what the collector said
		retried bool             // the exporter retries it until its export timeout
	}{
		{"400 echoing the headers", func(w http.ResponseWriter, r *http.Request) { echo(w, r, http.StatusBadRequest) }, "400 Bad Request", false},
		{"429 echoing the headers", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Retry-After", "1")
			echo(w, r, http.StatusTooManyRequests)
		}, "refused", true},
		{"401 with a 3 MiB body", func(w http.ResponseWriter, _ *http.Request) {
			w.WriteHeader(http.StatusUnauthorized)
			w.Write([]byte(strings.Repeat("x", 3<<20)))
		}, "401 Unauthorized", false},
		{"gRPC status echoing the metadata", nil, "Unauthenticated", false},
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
			// The 429 is retried until the export timeout, so it is short
			// there; elsewhere it is long enough for a loaded machine to
			// read a 3 MiB answer (300 ms was not, under -race).
			exportTimeout := "5000"
			if tc.retried {
				exportTimeout = "300"
			}
			t.Setenv("OTEL_BSP_EXPORT_TIMEOUT", exportTimeout)
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

// A collector's redirect is followed only where it keeps the export and
// its headers with that host: a 307 or 308 on the same host name. The
// exporter's client followed every one: a 307 to another host sent it the
// x-api-key from OTEL_EXPORTER_OTLP_HEADERS, and a 302 made the export a
// GET without its spans, which a 200 answered, so every span was lost
// with nothing logged and cubeproxy_spans_dropped_total at 0. Refused,
// the export fails, said and counted, and reaches no other host.
func TestCollectorRedirects(t *testing.T) {
	const key = "SECRETKEY123"
	var elsewhere atomic.Int64 // requests another host got
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		elsewhere.Add(1)
		io.Copy(io.Discard, r.Body)
	}))
	defer other.Close()
	// The same listener by another name: a host the endpoint does not name.
	otherURL := strings.Replace(other.URL, "127.0.0.1", "localhost", 1) + "/v1/traces"

	for _, tc := range []struct {
		name     string
		code     int
		location string // "" : /moved on the collector itself
		tls      bool   // the collector serves HTTPS
		exported bool
	}{
		{"307 to another host", http.StatusTemporaryRedirect, otherURL, false, false},
		{"308 to another host", http.StatusPermanentRedirect, otherURL, false, false},
		{"302 on the same host", http.StatusFound, "", false, false},
		{"301 on the same host", http.StatusMovedPermanently, "", false, false},
		{"308 from https to http on the same host", http.StatusPermanentRedirect, other.URL + "/v1/traces", true, false},
		{"308 on the same host", http.StatusPermanentRedirect, "", false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			elsewhere.Store(0)
			var got atomic.Int64 // spans the collector took at /moved
			srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				body, _ := io.ReadAll(r.Body)
				if r.URL.Path == "/v1/traces" {
					loc := tc.location
					if loc == "" {
						loc = "/moved"
					}
					http.Redirect(w, r, loc, tc.code)
					return
				}
				req := &coltracepb.ExportTraceServiceRequest{}
				if r.Method == http.MethodPost && proto.Unmarshal(body, req) == nil {
					got.Add(int64(len(spanNames(req))))
				}
				w.Header().Set("Content-Type", "application/x-protobuf") // 200 to a GET too
			}))
			if tc.tls {
				srv.StartTLS()
				ca := filepath.Join(t.TempDir(), "ca.pem")
				if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600); err != nil {
					t.Fatal(err)
				}
				t.Setenv("OTEL_EXPORTER_OTLP_CERTIFICATE", ca)
			} else {
				srv.Start()
			}
			defer srv.Close()
			t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", srv.URL)
			t.Setenv("OTEL_EXPORTER_OTLP_HEADERS", "x-api-key="+key)
			reported := captureOTelErrors(t)
			tel, err := New(context.Background(), Config{Env: envMap(map[string]string{"OTEL_TRACES_EXPORTER": "otlp"}), TraceSampleRatio: 1})
			if err != nil {
				t.Fatal(err)
			}
			const n = 3
			endSpans(tel, n)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			flushErr := tel.tp.ForceFlush(ctx)
			dropped := values(scrape(t, tel))["cubeproxy_spans_dropped_total"]
			_ = tel.Shutdown(ctx)
			if n := elsewhere.Load(); n != 0 {
				t.Errorf("the other server got %d requests", n)
			}
			if tc.exported {
				if flushErr != nil || got.Load() != n || dropped != 0 {
					t.Errorf("export: err %v, %d spans at the collector, %v dropped; want nil, %d, 0", flushErr, got.Load(), dropped, n)
				}
				return
			}
			if flushErr == nil || !strings.Contains(flushErr.Error(), "collector redirect not followed") {
				t.Errorf("export error %v, want the redirect refused", flushErr)
			}
			if dropped != n {
				t.Errorf("cubeproxy_spans_dropped_total = %v, want %d", dropped, n)
			}
			for _, msg := range reported() {
				if strings.Contains(msg, key) {
					t.Errorf("reported with the key: %s", msg)
				}
			}
		})
	}
}
