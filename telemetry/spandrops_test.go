package telemetry

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"
)

// A collector slower than the spans come fills the export queue, and the
// spans it has no room for are dropped, never the requests: each is counted
// in cubeproxy_spans_dropped_total and said in one warning, so that every
// span a request ended is either exported or counted. The batch processor
// dropped them with no count and no line: with the binary, a collector
// taking 1 s per export got 3,596 of 115,200 spans (57,600 requests in
// 8 s) and the log and the scrape said nothing.
func TestSpansDroppedAtFullQueueAreCounted(t *testing.T) {
	reached := make(chan struct{}, 1)
	release := make(chan struct{})
	var exported atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case reached <- struct{}{}:
		default:
		}
		<-release
		body, _ := io.ReadAll(r.Body)
		req := &coltracepb.ExportTraceServiceRequest{}
		if err := proto.Unmarshal(body, req); err != nil {
			http.Error(w, "bad export", http.StatusBadRequest)
			return
		}
		exported.Add(int64(len(spanNames(req))))
		w.Header().Set("Content-Type", "application/x-protobuf")
	}))
	defer srv.Close()
	var releaseOnce sync.Once
	unblock := func() { releaseOnce.Do(func() { close(release) }) }
	defer unblock()

	reported := captureOTelErrors(t)

	const queue = 5 // one place is kept for ForceFlush's marker
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", srv.URL)
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "1")
	t.Setenv("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "1")
	t.Setenv("OTEL_BSP_MAX_QUEUE_SIZE", "5")
	tel, err := New(context.Background(), Config{Env: envMap(map[string]string{"OTEL_TRACES_EXPORTER": "otlp"}), TraceSampleRatio: 1})
	if err != nil {
		t.Fatal(err)
	}
	endSpans(tel, 1)
	select {
	case <-reached: // the first span's export waits in the collector
	case <-time.After(10 * time.Second):
		t.Fatal("the exporter never reached the collector")
	}
	const more = 20
	endSpans(tel, more)
	wantDropped := more - (queue - 1)
	if got := values(scrape(t, tel))["cubeproxy_spans_dropped_total"]; got != float64(wantDropped) {
		t.Errorf("cubeproxy_spans_dropped_total = %v with the collector stuck, want %d", got, wantDropped)
	}
	var warnings int
	got := reported()
	for _, r := range got {
		if strings.HasPrefix(r, "traces export queue full") {
			warnings++
		}
	}
	if warnings != 1 {
		t.Errorf("%d queue-full reports, want 1 (at most one per %v): %q", warnings, dropWarnEvery, got)
	}

	unblock()
	ctx, cancel := context.WithTimeout(context.Background(), dropWarnEvery)
	defer cancel()
	if err := tel.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	// Every span ended is exported or counted, none lost unsaid.
	if got := exported.Load(); got != 1+more-int64(wantDropped) {
		t.Errorf("collector got %d spans, want %d (the %d ended less the %d counted dropped)", got, 1+more-wantDropped, 1+more, wantDropped)
	}
}

// The spans of an export the collector failed are dropped too (the batch
// processor does not try them again), and count in
// cubeproxy_spans_dropped_total like those the full queue had no room for:
// with the binary, a collector answering every export with 400 got none of
// 3,000 requests' spans while the counter stayed at 0, and one answering
// 503 (Retry-After: 2) lost a batch of 512 spans each 30 s (the export
// timeout) while it counted only the queue's drops. A partial success is
// the collector's own account of what it kept, not a failed export.
func TestSpansOfFailedExportsAreCounted(t *testing.T) {
	for _, tc := range []struct {
		name    string
		answer  func(w http.ResponseWriter)
		timeout string // OTEL_BSP_EXPORT_TIMEOUT
		dropped bool
	}{
		{"collector accepts", func(w http.ResponseWriter) {
			w.Header().Set("Content-Type", "application/x-protobuf")
		}, "", false},
		{"collector rejects the export", func(w http.ResponseWriter) {
			http.Error(w, "no", http.StatusBadRequest) // not retried
		}, "", true},
		{"collector unavailable until the export times out", func(w http.ResponseWriter) {
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusServiceUnavailable) // retried until the timeout
		}, "300", true},
		{"collector keeps part", func(w http.ResponseWriter) {
			out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{
				PartialSuccess: &coltracepb.ExportTracePartialSuccess{RejectedSpans: 1, ErrorMessage: "too old"},
			})
			w.Header().Set("Content-Type", "application/x-protobuf")
			w.Write(out)
		}, "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				io.Copy(io.Discard, r.Body)
				tc.answer(w)
			}))
			defer srv.Close()
			t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", srv.URL)
			t.Setenv("OTEL_BSP_EXPORT_TIMEOUT", tc.timeout)
			tel, err := New(context.Background(), Config{Env: envMap(map[string]string{"OTEL_TRACES_EXPORTER": "otlp"}), TraceSampleRatio: 1})
			if err != nil {
				t.Fatal(err)
			}
			const n = 7
			endSpans(tel, n)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_ = tel.tp.ForceFlush(ctx) // returns once the export has ended
			want := 0.0
			if tc.dropped {
				want = n
			}
			if got := values(scrape(t, tel))["cubeproxy_spans_dropped_total"]; got != want {
				t.Errorf("cubeproxy_spans_dropped_total = %v after the export, want %v", got, want)
			}
			_ = tel.Shutdown(ctx)
		})
	}
}
