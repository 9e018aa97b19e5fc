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

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// finishSeam is a span exporter that calls at for each server span, as
// that span ends. With an injected exporter the spans are exported in
// span.End (a simple processor), which finish calls just before it queues
// the exchange's access-log line: at runs in that instant.
type finishSeam struct{ at func() }

func (e finishSeam) ExportSpans(_ context.Context, spans []sdktrace.ReadOnlySpan) error {
	for _, s := range spans {
		if s.SpanKind() == trace.SpanKindServer {
			e.at()
		}
	}
	return nil
}

func (finishSeam) Shutdown(context.Context) error { return nil }

// A detached event stream, or a WebSocket tunnel, that ends during the
// drain is counted open until its access-log line is queued: the drain's
// wait ends when nothing is open, and the process closes the access log
// then. Earlier builds took the stream off the registry before its line
// was logged, so a drain could return, and the log close, in between: the
// line was counted dropped (one line in 2 of 7 drains of a few hundred
// event streams on the built binary). The seam is the span's export,
// just before the line: when it finds the exchange no longer counted, it
// holds the line back until the test has closed the log after Shutdown
// returned, which turns the race into a certainty.
func TestDrainWaitsForTheLineOfWhatEnds(t *testing.T) {
	for _, tc := range []struct {
		name  string
		drain time.Duration
		open  func(t *testing.T, h *harness) (id string, ended func())
	}{
		{"detached event stream, ended at the drain's start", 30 * time.Second, func(t *testing.T, h *harness) (string, func()) {
			port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				f := sseHeaders(w)
				fmt.Fprint(w, "data: hello\n\n")
				f.Flush()
				<-r.Context().Done()
			}))
			req := h.req("GET", h.route("lineorder", port), "/", nil)
			req.Header.Set(HeaderRequestID, "order-sse")
			resp, err := h.client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			br := bufio.NewReader(resp.Body)
			if _, err := readEvent(br); err != nil {
				t.Fatal(err)
			}
			return "order-sse", func() {
				defer resp.Body.Close()
				if _, err := io.ReadAll(br); err != nil {
					t.Errorf("the stream did not end cleanly at the drain: %v", err)
				}
			}
		}},
		{"WebSocket, cut at the deadline", 200 * time.Millisecond, func(t *testing.T, h *harness) (string, func()) {
			ws := dialWS(t, h, h.route("lineorderws", wsBackend(t, make(chan error, 1))))
			return "", func() { ws.CloseNow() }
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			logClosed := make(chan struct{})
			var h *harness
			late := make(chan bool, 1)
			tel := obsTelemetry(t, finishSeam{at: func() {
				streams, tunnels := h.proxy.streams.open()
				select {
				case late <- streams+tunnels == 0:
				default: // told once
				}
				if streams+tunnels > 0 {
					return
				}
				select {
				case <-logClosed:
				case <-time.After(10 * time.Second):
				}
			}})
			h, buf, al := drainLogHarness(t, tc.drain, func(o *harnessOpts) { o.cfg.Telemetry = tel })
			id, ended := tc.open(t, h)
			shutdownDone := make(chan error, 1)
			go func() { shutdownDone <- h.server.Shutdown(context.Background()) }()
			ended()
			drainEnds(t, shutdownDone, tc.drain+10*time.Second, "Shutdown did not return")
			_ = al.Close() // the process exits now
			close(logClosed)
			if <-late {
				t.Error("the drain's wait found nothing open while the exchange's line was still to be logged")
			}
			if al.Dropped() != 0 {
				t.Errorf("%d access-log line(s) dropped", al.Dropped())
			}
			want := `"status":101`
			if id != "" {
				want = `"x_cube_request_id":"` + id + `"`
			}
			if !strings.Contains(buf.String(), want) {
				t.Errorf("no access-log line with %s when Shutdown returned: %q", want, buf.String())
			}
		})
	}
}
