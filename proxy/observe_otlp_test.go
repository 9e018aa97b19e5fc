package proxy

import (
	"io"
	"slices"
	"testing"

	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
)

// A request target with bytes that are not UTF-8 (fasthttp takes any byte
// above 0x7F) must not cost the traces of other requests: OTLP strings are
// UTF-8, and one such url.path made the exporter refuse the whole batch.
func TestTracingInvalidUTF8PathExported(t *testing.T) {
	col, h, host, flush := otlpSandbox(t, "utf8path")

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
	flush()
	var got []string
	for _, sp := range col.all(tracepb.Span_SPAN_KIND_SERVER) {
		if p, ok := otlpAttr(sp, "url.path"); ok {
			got = append(got, p)
		}
	}
	slices.Sort(got)
	if want := []string{"/bad\uFFFDpath", "/good"}; !slices.Equal(got, want) {
		t.Errorf("collector received server spans with url.path %q, want %q", got, want)
	}
}
