package telemetry

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// blackHole is a collector that is up but hung: it accepts connections,
// reads what is sent and never answers. Its end of a connection closes when
// the exporter closes its own, so that a descriptor still open after the
// exporter gave up is the exporter's (and this side's twin of it).
// reached is closed once a connection was accepted.
func blackHole(t *testing.T) (addr string, reached <-chan struct{}) {
	t.Helper()
	r := make(chan struct{})
	var once sync.Once
	// Those the exporter left open (a failed test) close when the test ends.
	ln := testenv.ServeTCP(t, func(c net.Conn) {
		once.Do(func() { close(r) })
		io.Copy(io.Discard, c) // until the exporter closes it
		c.Close()
	})
	return ln.Addr().String(), r
}

// otlpEnv points the OTLP exporter (which reads the process environment)
// at endpoint over proto, and has the batch processor export one span a
// batch at once, so that a queue of spans is a queue of exports. It
// returns the Config.Env that turns OTLP tracing on.
func otlpEnv(t *testing.T, protocol, endpoint string) func(string) string {
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://"+endpoint)
	t.Setenv("OTEL_EXPORTER_OTLP_INSECURE", "true")
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "1")
	t.Setenv("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "1")
	return envMap(map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": protocol})
}

// endSpans ends n sampled server spans named "proxy GET".
func endSpans(tel *Telemetry, n int) {
	for range n {
		_, span := tel.StartServerSpan(inbound("GET", ""), false, netip.Addr{})
		EndServerSpan(span, &SpanResult{Status: 200})
	}
}

// Shutdown's deadline holds for the exports too: once it has passed, the
// export in flight is cancelled and the spans still queued are dropped, so
// the batch processor stops and the exporter closes its connections. They
// went on in the background: every queued batch, one after the other, for
// the exporter's 10 s timeout each (plus retries) against a collector that
// never answers; and as the provider skips its processors once the
// context is done, the processor and the gRPC connection stayed for good.
// Served in-process (tests, embedders), those goroutines and sockets
// outlived serve.
func TestShutdownDeadlineStopsExports(t *testing.T) {
	for _, protocol := range []string{"http/protobuf", "grpc"} {
		t.Run(protocol, func(t *testing.T) {
			addr, reached := blackHole(t)
			env := otlpEnv(t, protocol, addr)
			g0, _ := liveGoroutines()
			fd0 := testenv.OpenFDs(t)

			tel, err := New(context.Background(), Config{Env: env, TraceSampleRatio: 1})
			if err != nil {
				t.Fatal(err)
			}
			endSpans(tel, 16)
			select {
			case <-reached: // the first export is stuck in the black hole
			case <-time.After(10 * time.Second):
				t.Fatal("the exporter never connected to the collector")
			}

			const deadline = 300 * time.Millisecond
			ctx, cancel := context.WithTimeout(context.Background(), deadline)
			defer cancel()
			start := time.Now()
			err = tel.Shutdown(ctx)
			if d := time.Since(start); d > deadline+2*time.Second {
				t.Errorf("Shutdown with a %v context took %v", deadline, d)
			}
			if err == nil {
				t.Error("Shutdown returned nil with the spans not exported")
			}

			// Gone well within one export timeout (10 s).
			bound := time.Now().Add(3 * time.Second)
			for {
				g, stacks := liveGoroutines()
				fds := testenv.OpenFDs(t)
				if g <= g0 && fds <= fd0 {
					break
				}
				if time.Now().After(bound) {
					t.Fatalf("after Shutdown returned: %d goroutines (%d before New), %d descriptors (%d before New):\n%s",
						g, g0, fds, fd0, strings.Join(stacks, "\n\n"))
				}
				time.Sleep(5 * time.Millisecond)
			}
		})
	}
}

// liveGoroutines counts the goroutines of the process, with their stacks.
func liveGoroutines() (int, []string) {
	stacks := testenv.Stacks()
	return len(stacks), stacks
}

// Within its deadline Shutdown still exports everything queued: a healthy
// collector gets every span, batch after batch, over HTTP and gRPC.
func TestShutdownFlushesQueueToHealthyCollector(t *testing.T) {
	const n = 40
	for _, protocol := range []string{"http/protobuf", "grpc"} {
		t.Run(protocol, func(t *testing.T) {
			var mu sync.Mutex
			var got []string
			add := func(req *coltracepb.ExportTraceServiceRequest) {
				mu.Lock()
				defer mu.Unlock()
				got = append(got, spanNames(req)...)
			}
			var addr string
			if protocol == "grpc" {
				ln, err := net.Listen("tcp", "127.0.0.1:0")
				if err != nil {
					t.Fatal(err)
				}
				col := &funcCollector{export: add}
				srv := grpc.NewServer()
				coltracepb.RegisterTraceServiceServer(srv, col)
				go srv.Serve(ln)
				t.Cleanup(srv.Stop)
				addr = ln.Addr().String()
			} else {
				srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					body, _ := io.ReadAll(r.Body)
					req := &coltracepb.ExportTraceServiceRequest{}
					if err := proto.Unmarshal(body, req); err != nil {
						http.Error(w, err.Error(), http.StatusBadRequest)
						return
					}
					add(req)
					w.Header().Set("Content-Type", "application/x-protobuf")
				}))
				t.Cleanup(srv.Close)
				addr = strings.TrimPrefix(srv.URL, "http://")
			}
			tel, err := New(context.Background(), Config{Env: otlpEnv(t, protocol, addr), TraceSampleRatio: 1})
			if err != nil {
				t.Fatal(err)
			}
			endSpans(tel, n)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := tel.Shutdown(ctx); err != nil {
				t.Fatalf("Shutdown: %v", err)
			}
			mu.Lock()
			defer mu.Unlock()
			if want := slices.Repeat([]string{"proxy GET"}, n); !slices.Equal(got, want) {
				t.Errorf("collector got %d spans %v, want %d", len(got), got, n)
			}
		})
	}
}

// funcCollector is a gRPC trace collector that hands each export to export.
type funcCollector struct {
	coltracepb.UnimplementedTraceServiceServer
	export func(*coltracepb.ExportTraceServiceRequest)
}

func (c *funcCollector) Export(_ context.Context, req *coltracepb.ExportTraceServiceRequest) (*coltracepb.ExportTraceServiceResponse, error) {
	c.export(req)
	return &coltracepb.ExportTraceServiceResponse{}, nil
}

// The export that Shutdown's deadline cancels is not reported to
// OpenTelemetry's error handler (the process log, in serve): Shutdown's
// own error says that spans were lost, and the processor handed the
// cancelled export's error over after Shutdown had returned, so that serve
// logged it after its last line, "stopped", if the process had not exited
// first.
func TestShutdownCutExportIsNotReported(t *testing.T) {
	for _, protocol := range []string{"http/protobuf", "grpc"} {
		t.Run(protocol, func(t *testing.T) {
			reported := captureOTelErrors(t)

			addr, reached := blackHole(t)
			env := otlpEnv(t, protocol, addr)
			g0, _ := liveGoroutines()
			tel, err := New(context.Background(), Config{Env: env, TraceSampleRatio: 1})
			if err != nil {
				t.Fatal(err)
			}
			endSpans(tel, 4)
			select {
			case <-reached:
			case <-time.After(10 * time.Second):
				t.Fatal("the exporter never connected to the collector")
			}
			ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			defer cancel()
			if err := tel.Shutdown(ctx); err == nil {
				t.Fatal("Shutdown returned nil with the spans not exported")
			}
			// The processor's goroutine hands an export's error over
			// before it ends.
			for bound := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
				if g, _ := liveGoroutines(); g <= g0 {
					break
				}
				if time.Now().After(bound) {
					t.Fatal("the batch processor is still running 5 s after Shutdown")
				}
			}
			for _, err := range reported() {
				t.Errorf("reported after Shutdown gave the exports up: %s", err)
			}
		})
	}
}

// captureOTelErrors makes OpenTelemetry's global error handler record
// what it is given, until the test ends, and returns what it recorded so
// far.
func captureOTelErrors(t *testing.T) (reported func() []string) {
	var mu sync.Mutex
	var errs []string
	prev := otel.GetErrorHandler()
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
		mu.Lock()
		defer mu.Unlock()
		errs = append(errs, err.Error())
	}))
	t.Cleanup(func() { otel.SetErrorHandler(prev) })
	return func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), errs...)
	}
}
