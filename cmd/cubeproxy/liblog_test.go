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
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// A library repeats a warning several times a second while what it talks
// to is down (go-redis a failed dial, the OpenTelemetry SDK a failed
// export); the proxy logs one line per kind per libLogEvery, and the next
// line counts what it held back. A go-redis kind is its format; an OTel
// kind is the error's text before its first colon, so exports failing for
// varying addresses and causes are one kind.
func TestLibraryWarningsThrottled(t *testing.T) {
	var buf bytes.Buffer
	now := time.Unix(1_700_000_000, 0)
	clock := func() time.Time { return now }
	log := slog.New(slog.NewJSONHandler(&buf, nil))
	rl := redisLogger{newThrottledLog(log, "redis", clock)}
	oh := otelErrorHandler{newThrottledLog(log, "telemetry", clock)}
	redisf := func(format string) func() {
		return func() { rl.Printf(context.Background(), format, 1, "refused") }
	}
	otelErr := func(msg string) func() { return func() { oh.Handle(errors.New(msg)) } }
	dial := redisf("connection pool: failed to dial after %d attempts: %v")
	steps := []struct {
		advance time.Duration
		emit    func()
		want    string // "" = nothing logged
	}{
		{0, dial, `"msg":"connection pool: failed to dial after 1 attempts: refused","component":"redis"`},
		{100 * time.Millisecond, dial, ""},
		{100 * time.Millisecond, dial, ""},
		{0, redisf("sentinel: new master=%q addr=%q"), "sentinel: new master"}, // another kind is not held back
		{0, otelErr(`traces export: Post "http://10.0.0.1:4318/v1/traces": connection refused`), `"component":"telemetry"`},
		{time.Second, otelErr(`traces export: Post "http://10.0.0.2:4318/v1/traces": i/o timeout`), ""},
		{0, otelErr("metrics export: 503"), `"msg":"metrics export: 503"`},
		{libLogEvery, dial, `"suppressed":2`},
		{0, otelErr("traces export: 400 Bad Request"), `"suppressed":1`},
		{time.Second, dial, ""},
	}
	for i, s := range steps {
		now = now.Add(s.advance)
		buf.Reset()
		s.emit()
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
	routes := boxRoutes(t, t.TempDir(), port)
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

// An OTLP setting the SDK cannot use and ignores (a timeout that is no
// number; a CA file that is not there is refused at start)
// is said in the proxy's own log, a
// JSON line tagged "component":"telemetry" naming the variable's value: the
// SDK's default logger wrote it as plain text to the process's stderr
// ("internal_logging.go:50: "msg"="read tls ca cert file" ..."), among the
// JSON lines, where a log pipeline parsing them drops or mangles it.
func TestOTLPSettingIgnoredInProxyLog(t *testing.T) {
	for _, tc := range []struct{ name, value, want string }{
		{"OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "soon", "parse duration"},
		{"OTEL_EXPORTER_OTLP_TIMEOUT", "ten", "parse duration"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("OTEL_TRACES_EXPORTER", "otlp")
			t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://"+testenv.RefusingAddr(t))
			t.Setenv(tc.name, tc.value)
			routes := boxRoutes(t, t.TempDir(), 1)
			r := runServe(t, []string{"--http-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0", "--routes", routes}, noEnv)
			r.stop()
			var found bool
			for _, line := range strings.Split(strings.TrimSpace(r.logs.String()), "\n") {
				if !strings.Contains(line, tc.want) {
					continue
				}
				found = true
				if !strings.HasPrefix(line, "{") || !strings.Contains(line, `"component":"telemetry"`) ||
					!strings.Contains(line, `"level":"ERROR"`) || !strings.Contains(line, tc.value) {
					t.Errorf("the ignored setting logged as %s", line)
				}
			}
			if !found {
				t.Errorf("%s=%s, which the SDK ignores, is not in the proxy's log:\n%s", tc.name, tc.value, r.logs)
			}
		})
	}
}
