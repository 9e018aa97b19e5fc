package main

import (
	"context"
	"crypto/tls"
	"encoding/base64"
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
	"google.golang.org/protobuf/proto"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// proxyCollector is an OTLP/gRPC trace collector counting the spans it got.
type proxyCollector struct {
	coltracepb.UnimplementedTraceServiceServer
	spans *atomic.Int64
}

func (c proxyCollector) Export(_ context.Context, req *coltracepb.ExportTraceServiceRequest) (*coltracepb.ExportTraceServiceResponse, error) {
	c.spans.Add(countSpans(req))
	return &coltracepb.ExportTraceServiceResponse{}, nil
}

// countSpans counts the spans of an OTLP export.
func countSpans(req *coltracepb.ExportTraceServiceRequest) int64 {
	var n int64
	for _, rs := range req.GetResourceSpans() {
		for _, ss := range rs.GetScopeSpans() {
			n += int64(len(ss.GetSpans()))
		}
	}
	return n
}

// Trace exports go through the egress proxy HTTPS_PROXY names, with its
// credentials, for OTLP/HTTP (over TLS) and gRPC alike: the collector's
// name, collector.invalid, resolves nowhere, so a span it gets came
// through the proxy. A proxy that refuses the credentials fails the
// exports: said in the log, naming the proxy (Go's error for its 407 was
// `Post "https://collector.invalid:port/v1/traces": Proxy Authentication
// Required`, and a 403 just "Forbidden", which read as the collector's),
// never showing the password (nor its Basic token), and their spans
// counted in cubeproxy_spans_dropped_total.
// Run on the binary: net/http reads the proxy variables once per process.
func TestTraceExportThroughProxy(t *testing.T) {
	// Parallel: it waits on a child process of its own (signals go to the
	// child), on ports picked by the kernel.
	t.Parallel()
	bin := buildBinary(t)
	port := sandboxServer(t, func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })
	routes := boxRoutes(t, t.TempDir(), port)

	var spans atomic.Int64
	ca := testenv.NewCA(t, "collector CA")
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(caFile, ca.CertPEM(), 0o600); err != nil {
		t.Fatal(err)
	}
	httpCollector := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		req := &coltracepb.ExportTraceServiceRequest{}
		if err := proto.Unmarshal(body, req); err != nil {
			http.Error(w, "bad export", http.StatusBadRequest)
			return
		}
		spans.Add(countSpans(req))
		w.Header().Set("Content-Type", "application/x-protobuf")
	}))
	httpCollector.TLS = &tls.Config{Certificates: []tls.Certificate{ca.Certificate(t, "collector.invalid")}}
	httpCollector.StartTLS()
	t.Cleanup(httpCollector.Close)
	grpcLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	grpcCollector := grpc.NewServer()
	coltracepb.RegisterTraceServiceServer(grpcCollector, proxyCollector{spans: &spans})
	go grpcCollector.Serve(grpcLn)
	t.Cleanup(grpcCollector.Stop)

	httpPort := httpCollector.Listener.Addr().(*net.TCPAddr).Port
	grpcPort := grpcLn.Addr().(*net.TCPAddr).Port
	const password = "s3cret-proxy-pw"
	proxy := testenv.StartConnectProxy(t, "exporter", password, map[string]string{
		fmt.Sprintf("collector.invalid:%d", httpPort): httpCollector.Listener.Addr().String(),
		fmt.Sprintf("collector.invalid:%d", grpcPort): grpcLn.Addr().String(),
	})
	wrong := strings.Replace(proxy.URL, password, "wrong-pw", 1)
	secrets := []string{password, base64.StdEncoding.EncodeToString([]byte("exporter:" + password))}

	for _, tc := range []struct {
		name     string
		env      []string
		proxyURL string
		refused  bool
	}{
		{"http", []string{fmt.Sprintf("OTEL_EXPORTER_OTLP_ENDPOINT=https://collector.invalid:%d", httpPort), "OTEL_EXPORTER_OTLP_CERTIFICATE=" + caFile}, proxy.URL, false},
		{"grpc", []string{"OTEL_EXPORTER_OTLP_PROTOCOL=grpc", fmt.Sprintf("OTEL_EXPORTER_OTLP_ENDPOINT=http://collector.invalid:%d", grpcPort)}, proxy.URL, false},
		{"http refused", []string{fmt.Sprintf("OTEL_EXPORTER_OTLP_ENDPOINT=https://collector.invalid:%d", httpPort), "OTEL_EXPORTER_OTLP_CERTIFICATE=" + caFile}, wrong, true},
		{"grpc refused", []string{"OTEL_EXPORTER_OTLP_PROTOCOL=grpc", fmt.Sprintf("OTEL_EXPORTER_OTLP_ENDPOINT=http://collector.invalid:%d", grpcPort)}, wrong, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spansBefore, tunnelsBefore, refusalsBefore := spans.Load(), proxy.Tunnels(), proxy.Refusals()
			env := append([]string{
				"OTEL_TRACES_EXPORTER=otlp", "OTEL_TRACES_SAMPLER=always_on", "OTEL_BSP_SCHEDULE_DELAY=20",
				// gRPC tries a refused connection again until then.
				"OTEL_EXPORTER_OTLP_TIMEOUT=2000",
				"HTTPS_PROXY=" + tc.proxyURL, "https_proxy=", "NO_PROXY=", "no_proxy=",
			}, tc.env...)
			cmd, logs, exited := startBinaryEnv(t, bin, env, "serve", "--http-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0",
				"--routes", routes, "--access-log-format", "off")
			traffic, admin := waitListening(t, logs, exited)
			req, _ := http.NewRequest("GET", "http://"+traffic+"/", nil)
			req.Host = fmt.Sprintf("%d-box.cube.test", port)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if tc.refused {
				testenv.WaitFor(t, 15*time.Second, "the refused export's warning and its spans counted", func() bool {
					return strings.Contains(logs.String(), `"msg":"traces export:`) && scrapeMetric(admin, "cubeproxy_spans_dropped_total") >= 2
				})
				// Go's error for the proxy's 407 is its bare reason phrase
				// after the collector's URL: the warning names the proxy.
				if via := "through the proxy " + proxy.Addr + " of HTTPS_PROXY"; !strings.Contains(logs.String(), via) {
					t.Errorf("the export's warning does not say %q:\n%s", via, logs)
				}
				if proxy.Refusals() == refusalsBefore {
					t.Error("the proxy refused no CONNECT")
				}
				if n := spans.Load() - spansBefore; n != 0 {
					t.Errorf("the collector got %d spans past a proxy that refused the credentials", n)
				}
			} else {
				testenv.WaitFor(t, 15*time.Second, "the request's two spans at the collector", func() bool { return spans.Load()-spansBefore >= 2 })
				if proxy.Tunnels() == tunnelsBefore {
					t.Error("the proxy tunnelled nothing")
				}
			}
			sigtermAndWait(t, cmd, exited, logs)
			for _, s := range secrets {
				if strings.Contains(logs.String(), s) {
					t.Errorf("the log shows the proxy's credential %q:\n%s", s, logs)
				}
			}
		})
	}
}
