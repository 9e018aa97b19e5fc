package proxy

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"testing"

	"github.com/cube-sandbox/cubeproxy/accesslog"
)

// An Expect upload's route lookup is made for its head, and counted once
// in cubeproxy_route_cache_lookups_total whatever becomes of its body: the
// body's run reuses the head's result (headLookup), so the head is where
// it counts. Counted only once the body had come, the lookup of an upload
// whose client left after the 100 (curl interrupted halfway through a
// large upload) was counted nowhere, though it went to the store: the
// misses fell short of the store's lookups.
func TestExpectLookupCountedWithoutBody(t *testing.T) {
	tel := obsTelemetry(t, nil)
	h, buf := logHarness(t, accesslog.FormatJSON, func(o *harnessOpts) { o.cfg.Telemetry = tel })
	admin := obsMetricsAdmin(t, h, tel)
	port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		fmt.Fprintf(w, "got %d bytes", len(b))
	}))
	for _, tc := range []struct {
		name string
		id   string
		sent string // the body's bytes sent after the 100; the client then leaves
		full bool   // the whole body is sent and answered
	}{
		{name: "client leaves at the 100", id: "expleft", sent: ""},
		{name: "client leaves halfway", id: "exphalf", sent: "hello"},
		{name: "whole body", id: "expwhole", sent: "helloworld", full: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			host := h.route(tc.id, port)
			before := scrapeMetrics(t, admin)
			c := dialRaw(t, h.addr)
			br := bufio.NewReader(c)
			fmt.Fprintf(c, "PUT /up HTTP/1.1\r\nHost: %s\r\nContent-Length: 10\r\nExpect: 100-continue\r\n\r\n", host)
			if resp, b := readExpectAnswer(t, br); resp.StatusCode != http.StatusContinue {
				t.Fatalf("head answered %d %s, want 100", resp.StatusCode, b)
			}
			io.WriteString(c, tc.sent)
			if tc.full {
				if resp, b := readExpectAnswer(t, br); resp.StatusCode != 200 {
					t.Fatalf("upload answered %d %s", resp.StatusCode, b)
				}
			}
			c.Close()
			if tc.full {
				buf.waitJSONLine(t, `"sandbox_id":"`+tc.id+`"`)
			} else {
				// The 499 of a body cut before the handler; barrier: the
				// log is written in order after the metrics are counted.
				buf.waitJSONLine(t, `"status":499`)
				req := h.req("GET", host, "/", nil)
				req.Header.Set("X-Cube-Request-Id", tc.id+"-barrier")
				resp := h.do(req)
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				buf.waitJSON(t, tc.id+"-barrier")
			}
			after := scrapeMetrics(t, admin)
			// The upload's lookup, a miss, and the barrier's hit when
			// there is one.
			hits := map[bool]float64{true: 0, false: 1}[tc.full]
			for _, d := range checkDeltas(before, after, []metricDelta{
				{"cubeproxy_route_cache_lookups_total", map[string]string{"result": "miss"}, 1},
				{"cubeproxy_route_cache_lookups_total", map[string]string{"result": "hit"}, hits},
			}) {
				t.Error(d)
			}
		})
	}
}
