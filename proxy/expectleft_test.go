package proxy

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"

	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/cube-sandbox/cubeproxy/accesslog"
	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// An upload sent with "Expect: 100-continue" whose client leaves after
// the 100, partway through the first 8 KiB of its body (curl interrupted
// halfway through an upload), or whose body stalls there, is logged,
// counted and traced with what its head said, as the same upload cut
// later is: its host, method,
// target, sandbox, the client's X-Cube-Request-Id, its traceparent, and
// its time from the head. fasthttp reads that part of the body after the
// proxy admitted the head, and drops the head (user values and all) when
// the read fails, before the error handler runs: the 499's line had no
// host, method, target or sandbox and a newly made request id, its span no
// parent, its duration only the error handler's microseconds, and
// cube_proxy_request_total never counted the failed /files upload. With
// the access log off the 499 of a connection's first request went
// uncounted too (no record of its first byte), though its head had come.
func TestExpectUploadLeftKeepsItsHead(t *testing.T) {
	// Parallel: it waits on its uploads' hold and client.body_timeout
	// (7 s of a loaded machine's sequential run, 0.5 s of CPU), and each
	// half has a harness, telemetry and metrics of its own.
	t.Parallel()
	for _, logged := range []bool{true, false} {
		t.Run(fmt.Sprintf("access log %v", logged), func(t *testing.T) {
			t.Parallel()
			testExpectUploadLeftKeepsItsHead(t, logged)
		})
	}
}

func testExpectUploadLeftKeepsItsHead(t *testing.T, logged bool) {
	exp := tracetest.NewInMemoryExporter()
	tel := obsTelemetry(t, exp)
	// Long beside hold: a client that closes after hold is not taken
	// for a stalled one on a loaded machine.
	const bodyTimeout = 2 * time.Second
	mod := func(o *harnessOpts) {
		o.cfg.Telemetry = tel
		o.srv.ClientBodyTimeout = bodyTimeout
	}
	var h *harness
	var logs *obsLogBuf
	if logged {
		h, logs = logHarness(t, accesslog.FormatJSON, mod)
	} else {
		h = newHarness(t, mod)
	}
	admin := obsMetricsAdmin(t, h, tel)
	port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t.Errorf("the sandbox got %s %s: its client never sent the body", r.Method, r.URL)
	}))
	const (
		traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
		parent  = "00f067aa0ba902b7"
		// How long the client uploads before it gives up: the request's
		// time from its head covers at least this.
		hold = 200 * time.Millisecond
	)
	for _, tc := range []struct {
		name   string
		stall  bool // the client stops sending and waits: client.body_timeout ends the read
		byPath bool // routed by its path on a shared host: the log's uri is the sandbox's own path
		status int
		code   string
	}{
		{name: "client leaves", status: 499, code: CodeClientClosed},
		{name: "body stalls", stall: true, status: 408, code: "request_timeout"},
		{name: "client leaves, routed by path", byPath: true, status: 499, code: CodeClientClosed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id := "sbxexpect" + itoa(uint16(tc.status))
			reqID := "rid-expect-" + itoa(uint16(tc.status))
			target := "/files?path=/up"
			if tc.byPath {
				id, reqID = id+"bypath", reqID+"-bypath"
			}
			host := h.route(id, port)
			if tc.byPath {
				host, target = "127.0.0.1", "/sandbox/"+id+"/"+itoa(port)+target
			}
			before := scrapeMetrics(t, admin)

			c := dialRaw(t, h.addr)
			br := bufio.NewReader(c)
			sent := time.Now()
			fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: %s\r\nContent-Length: 4096\r\nX-Cube-Request-Id: %s\r\n"+
				"traceparent: 00-%s-%s-01\r\nExpect: 100-continue\r\n\r\n", target, host, reqID, traceID, parent)
			if resp, b := readExpectAnswer(t, br); resp.StatusCode != http.StatusContinue {
				t.Fatalf("head answered %d %q, want 100", resp.StatusCode, b)
			}
			continued := time.Now()
			io.WriteString(c, "half of the body")
			least := hold
			if tc.stall {
				least = bodyTimeout
				_ = c.SetReadDeadline(time.Now().Add(bodyTimeout + 30*time.Second))
				resp, _ := readExpectAnswer(t, br)
				if resp.StatusCode != tc.status || resp.Header.Get(HeaderRequestID) != reqID {
					t.Errorf("stalled body answered %d under request id %q, want %d under the client's %q",
						resp.StatusCode, resp.Header.Get(HeaderRequestID), tc.status, reqID)
				}
			} else {
				time.Sleep(hold) // the upload's time, not a synchronization
			}
			c.Close()

			want := []metricDelta{
				{"cubeproxy_requests_total", map[string]string{"status_class": "4xx", "route_kind": "error"}, 1},
				{"cube_proxy_request_total", map[string]string{"route": "sandbox_files", "method": "POST", "result": "fail"}, 1},
				{"cube_proxy_inflight_requests", map[string]string{"route": "sandbox_files"}, 0},
				// How much of the body fasthttp read before it failed is not
				// told: none is counted, never the 4096 the head declared.
				{"cubeproxy_received_bytes_total", map[string]string{"route_kind": "error"}, 0},
			}
			if logged {
				e := logs.waitJSONLine(t, fmt.Sprintf(`"x_cube_request_id":%q`, reqID)) // the only one
				for field, v := range map[string]any{
					"status": float64(tc.status), "error_code": tc.code, "host": host, "method": "POST",
					"request_uri": target, "uri": "/files", "protocol": "HTTP/1.1", "sandbox_id": id,
					"port": float64(port), "x_cube_request_id": reqID,
					"bytes_in": float64(0), "cache_result": "miss", // the head's lookup, which asked the store
				} {
					if e[field] != v {
						t.Errorf("access log %s = %v, want %v", field, e[field], v)
					}
				}
				if rt, _ := e["request_time"].(float64); rt < least.Seconds() {
					t.Errorf("access log request_time = %v, want at least the %v from the head to the end", e["request_time"], least)
				}
				// Counted before it was logged.
				for _, bad := range checkDeltas(before, scrapeMetrics(t, admin), want) {
					t.Error(bad)
				}
			} else {
				waitMetrics(t, admin, before, want)
			}
			after := scrapeMetrics(t, admin)
			for _, name := range []string{"cubeproxy_request_duration_seconds_sum", "cube_proxy_request_duration_seconds_sum"} {
				b, _ := metricValue(before, name, nil)
				a, _ := metricValue(after, name, nil)
				if a-b < least.Seconds() {
					t.Errorf("%s moved by %.6fs, want at least the %v from the head to the end: timed from its head", name, a-b, least)
				}
			}

			server := expectLeftSpan(t, exp, id)
			if got := server.SpanContext.TraceID().String(); got != traceID {
				t.Errorf("server span trace %s, want the client's %s", got, traceID)
			}
			if got := server.Parent.SpanID().String(); got != parent {
				t.Errorf("server span parent %s, want the client's %s", got, parent)
			}
			if server.StartTime.Before(sent) || server.StartTime.After(continued) {
				t.Errorf("server span starts %v after the head was sent, want before the 100 (%v)",
					server.StartTime.Sub(sent), continued.Sub(sent))
			}
		})
	}
}

// expectLeftSpan waits for the server span of sandbox id; a request whose
// client left before its body reached the sandbox has no client span.
func expectLeftSpan(t *testing.T, exp *tracetest.InMemoryExporter, id string) tracetest.SpanStub {
	t.Helper()
	var server tracetest.SpanStub
	testenv.WaitFor(t, 5*time.Second, "server span of sandbox "+id, func() bool {
		for _, s := range exp.GetSpans() {
			for _, a := range s.Attributes {
				if a.Key == "cube.sandbox.id" && a.Value.AsString() == id {
					server = s
					return true
				}
			}
		}
		return false
	})
	return server
}
