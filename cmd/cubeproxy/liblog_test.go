package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// While Redis is down go-redis logs a failed dial several times a second;
// the proxy logs one line per kind of message per libLogEvery, and the
// next line counts what it held back.
func TestRedisLoggerRateLimits(t *testing.T) {
	var buf bytes.Buffer
	now := time.Unix(1_700_000_000, 0)
	r := redisLogger{newThrottledLog(slog.New(slog.NewTextHandler(&buf, nil)), "redis", func() time.Time { return now })}
	dial := "connection pool: failed to dial after %d attempts: %v"
	steps := []struct {
		advance time.Duration
		format  string
		want    string // "" = nothing logged
	}{
		{0, dial, "failed to dial after 1 attempts"},
		{100 * time.Millisecond, dial, ""},
		{100 * time.Millisecond, dial, ""},
		{0, "sentinel: new master=%q addr=%q", "sentinel: new master"}, // another kind is not held back
		{libLogEvery, dial, "suppressed=2"},
		{time.Second, dial, ""},
	}
	for i, s := range steps {
		now = now.Add(s.advance)
		buf.Reset()
		r.Printf(context.Background(), s.format, 1, "refused")
		got := buf.String()
		switch {
		case s.want == "" && got != "":
			t.Errorf("step %d: logged %q, want nothing", i, got)
		case s.want != "" && !strings.Contains(got, s.want):
			t.Errorf("step %d: logged %q, want it to contain %q", i, got, s.want)
		}
	}
}

// The OpenTelemetry SDK reports each failed export; the kind is the text
// before the first colon, so exports failing for varying addresses and
// causes are one kind, and traces and metrics are two.
func TestOTelErrorHandlerRateLimits(t *testing.T) {
	var buf bytes.Buffer
	now := time.Unix(1_700_000_000, 0)
	h := otelErrorHandler{newThrottledLog(slog.New(slog.NewJSONHandler(&buf, nil)), "telemetry", func() time.Time { return now })}
	steps := []struct {
		advance time.Duration
		err     string
		want    string // "" = nothing logged
	}{
		{0, "traces export: Post \"http://10.0.0.1:4318/v1/traces\": connection refused", `"component":"telemetry"`},
		{time.Second, "traces export: Post \"http://10.0.0.2:4318/v1/traces\": i/o timeout", ""},
		{0, "metrics export: 503", `"msg":"metrics export: 503"`},
		{libLogEvery, "traces export: 400 Bad Request", `"suppressed":1`},
	}
	for i, s := range steps {
		now = now.Add(s.advance)
		buf.Reset()
		h.Handle(errors.New(s.err))
		got := buf.String()
		switch {
		case s.want == "" && got != "":
			t.Errorf("step %d: logged %q, want nothing", i, got)
		case s.want != "" && !strings.Contains(got, s.want):
			t.Errorf("step %d: logged %q, want it to contain %q", i, got, s.want)
		}
	}
}

// A collector that refuses the proxy's spans shows in the proxy's own log:
// the SDK's error reaches it as a JSON line tagged "component":"telemetry",
// where its default handler wrote plain text to the process's stderr.
func TestTraceExportErrorInProxyLog(t *testing.T) {
	var posts atomic.Int32
	collector := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		posts.Add(1)
		http.Error(w, "refused", http.StatusBadRequest) // not retried by the exporter
	}))
	defer collector.Close()
	t.Setenv("OTEL_TRACES_EXPORTER", "otlp")
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", collector.URL)
	t.Setenv("OTEL_TRACES_SAMPLER", "always_on")
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "10") // ms: export the span at once

	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
	defer backend.Close()
	port := backend.Listener.Addr().(*net.TCPAddr).Port
	routes := filepath.Join(t.TempDir(), "routes.yaml")
	if err := os.WriteFile(routes, []byte(fmt.Sprintf("routes:\n  box:\n    HostIP: \"127.0.0.1\"\n    \"%d\": \"%d\"\n", port, port)), 0o600); err != nil {
		t.Fatal(err)
	}
	r := runServe(t, []string{"--http-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0", "--routes", routes}, noEnv)

	req, _ := http.NewRequest("GET", "http://"+r.a.httpLn.Addr().String()+"/", nil)
	req.Host = fmt.Sprintf("%d-box.cube.test", port)
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	testenv.WaitFor(t, 10*time.Second, "the export error in the proxy's log", func() bool {
		return strings.Contains(r.logs.String(), `"component":"telemetry"`)
	})
	if posts.Load() == 0 {
		t.Fatal("logged an export error without an export")
	}
	for _, line := range strings.Split(strings.TrimSpace(r.logs.String()), "\n") {
		if strings.Contains(line, `"component":"telemetry"`) {
			if !strings.Contains(line, `"level":"WARN"`) || !strings.Contains(line, `"msg":"traces export: `) {
				t.Errorf("export error logged as %s", line)
			}
		}
	}
	r.stop()
}
