package proxy

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"

	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"

	"github.com/cube-sandbox/cubeproxy/telemetry"
)

// checkResend checks that spans, the client spans of one request, are
// one per attempt: children of server, in order, the first without
// http.request.resend_count and the others numbered from 1, each
// failed attempt an error typed errTypes[i] ("" for the last, which
// answered status, or failed too when status is "") and ended before the
// next began.
func checkResend(t *testing.T, spans []*tracepb.Span, server *tracepb.Span, errTypes []string, status string) {
	t.Helper()
	if len(spans) != len(errTypes) {
		t.Fatalf("%d client spans, want %d (one per attempt)", len(spans), len(errTypes))
	}
	// In the order they began.
	for i := 1; i < len(spans); i++ {
		for j := i; j > 0 && spans[j].GetStartTimeUnixNano() < spans[j-1].GetStartTimeUnixNano(); j-- {
			spans[j], spans[j-1] = spans[j-1], spans[j]
		}
	}
	for i, s := range spans {
		if !bytes.Equal(s.GetParentSpanId(), server.GetSpanId()) {
			t.Errorf("attempt %d: parent %x, want the server span %x", i, s.GetParentSpanId(), server.GetSpanId())
		}
		resend, ok := otlpAttr(s, "http.request.resend_count")
		switch {
		case i == 0 && ok:
			t.Errorf("attempt 0: http.request.resend_count %s, want none (the first send is no resend)", resend)
		case i > 0 && resend != fmt.Sprint(i):
			t.Errorf("attempt %d: http.request.resend_count %q, want %d", i, resend, i)
		}
		if name := s.GetName(); name != "upstream GET" {
			t.Errorf("attempt %d: name %q, want %q", i, name, "upstream GET")
		}
		if _, ok := otlpAttr(s, "server.address"); !ok {
			t.Errorf("attempt %d: no server.address", i)
		}
		errType, _ := otlpAttr(s, "error.type")
		if errType != errTypes[i] {
			t.Errorf("attempt %d: error.type %q, want %q", i, errType, errTypes[i])
		}
		if (errTypes[i] != "") != (s.GetStatus().GetCode() == tracepb.Status_STATUS_CODE_ERROR) {
			t.Errorf("attempt %d: status %v, error.type %q", i, s.GetStatus().GetCode(), errTypes[i])
		}
		got, _ := otlpAttr(s, "http.response.status_code")
		if want := map[bool]string{true: status}[i == len(spans)-1]; got != want {
			t.Errorf("attempt %d: http.response.status_code %q, want %q", i, got, want)
		}
		if i > 0 && s.GetStartTimeUnixNano() < spans[i-1].GetEndTimeUnixNano() {
			t.Errorf("attempt %d began before attempt %d ended", i, i-1)
		}
	}
}

// A GET re-sent on a new connection because the sandbox closed the pooled
// one it went out on (as the request arrived) is two client spans, as the
// HTTP semantic conventions have it: the failed send (upstream_reset) and
// the resend with http.request.resend_count 1, each the traceparent of the
// send the sandbox got. One span for both hid the failed attempt and gave the
// sandbox's spans a parent that was not the request it served.
func TestTracingResentRequestSpans(t *testing.T) {
	col, tel, flush := otlpTracing(t)
	h := newHarness(t, func(o *harnessOpts) { o.cfg.Telemetry = tel })
	var mu sync.Mutex
	var parents []string // traceparent of every request the sandbox read
	b := newScriptBackend(t, func(c net.Conn, req *http.Request, n int) bool {
		mu.Lock()
		parents = append(parents, req.Header.Get("Traceparent"))
		mu.Unlock()
		return closedOnSecondRequest(c, n) // the second request is re-sent
	})
	host := h.route("resent", b.port)
	c := dialRaw(t, h.addr)
	br := bufio.NewReader(c)
	traceIDs := []string{fmt.Sprintf("%032x", 0x7e5e0), fmt.Sprintf("%032x", 0x7e5e1)}
	for i, traceID := range traceIDs {
		getTraced(t, c, br, host, i, traceID)
	}
	flush()
	for i, traceID := range traceIDs {
		server := col.trace(traceID, tracepb.Span_SPAN_KIND_SERVER)
		if len(server) != 1 {
			t.Fatalf("request %d: %d server spans, want 1", i, len(server))
		}
		t.Run(fmt.Sprintf("request %d", i), func(t *testing.T) {
			errTypes := []string{""}
			if i == 1 {
				errTypes = []string{CodeUpstreamReset, ""}
			}
			spans := col.trace(traceID, tracepb.Span_SPAN_KIND_CLIENT)
			checkResend(t, spans, server[0], errTypes, "200")
			if len(spans) == 0 {
				return
			}
			// Each send reached the sandbox (the failed one too, whose
			// connection closed as it read it) under its own span.
			var got []string
			mu.Lock()
			for _, tp := range parents {
				if strings.Contains(tp, traceID) {
					got = append(got, tp)
				}
			}
			mu.Unlock()
			var want []string
			for _, s := range spans {
				want = append(want, fmt.Sprintf("00-%s-%x-01", traceID, s.GetSpanId()))
			}
			if !slices.Equal(got, want) {
				t.Errorf("the sandbox got traceparents %q, want one per attempt %q", got, want)
			}
		})
	}
}

// A connect that fails is retried once: two client spans, the failed
// connect's and the retry's (http.request.resend_count 1), for a WebSocket
// upgrade as for a plain request.
func TestTracingRetriedConnectSpans(t *testing.T) {
	col, tel, flush := otlpTracing(t)
	h := newHarness(t, func(o *harnessOpts) { o.cfg.Telemetry = tel })
	dead := freePort(t) // nothing listens: the connect is refused, twice
	tests := []struct{ name, upgrade string }{
		{"plain", ""},
		{"websocket", "Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"},
	}
	for i, tc := range tests {
		traceID := fmt.Sprintf("%032x", 0xc0ae0+i)
		closing := "Connection: close\r\n"
		if tc.upgrade != "" {
			closing = "" // Connection: Upgrade
		}
		head := fmt.Sprintf("GET / HTTP/1.1\r\nHost: %s\r\nTraceparent: 00-%s-00f067aa0ba902b7-01\r\n%s%s\r\n",
			h.route("refused"+tc.name, dead), traceID, tc.upgrade, closing)
		if st := roundTripRaw(t, h, head); st != 502 {
			t.Fatalf("%s: status %d, want 502", tc.name, st)
		}
	}
	flush()
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			traceID := fmt.Sprintf("%032x", 0xc0ae0+i)
			server := col.trace(traceID, tracepb.Span_SPAN_KIND_SERVER)
			if len(server) != 1 {
				t.Fatalf("%d server spans, want 1", len(server))
			}
			checkResend(t, col.trace(traceID, tracepb.Span_SPAN_KIND_CLIENT), server[0], []string{CodeUpstreamConnect, CodeUpstreamConnect}, "")
			if got, _ := otlpAttr(server[0], string(telemetry.AttrRetries)); got != "1" {
				t.Errorf("server span %s %q, want 1", telemetry.AttrRetries, got)
			}
		})
	}
}

// getTraced sends "GET /i" on c, a kept-alive connection to the proxy read
// through br, as part of trace traceID (sampled), and fails the test
// unless the sandbox answers 200.
func getTraced(t *testing.T, c net.Conn, br *bufio.Reader, host string, i int, traceID string) {
	t.Helper()
	fmt.Fprintf(c, "GET /%d HTTP/1.1\r\nHost: %s\r\nTraceparent: 00-%s-00f067aa0ba902b7-01\r\n\r\n", i, host, traceID)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("request %d: %d, want 200", i, resp.StatusCode)
	}
}
