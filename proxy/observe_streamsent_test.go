package proxy

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/accesslog"
)

// A detached event stream (a GET's, on Linux) cut because its client
// stopped reading logs, as body_bytes_sent, the body bytes the client gets
// once it reads again, as a cut download does
// (TestCutDownloadLogsBytesWritten): not the last piece read from the
// sandbox as well, whose write the cut broke off, counted when it was read
// (up to 64 KiB more than the client could ever get). A chunked body that
// fasthttp writes (any other stream of unknown length) may still claim the
// last piece fasthttp read, up to its 4 KiB copy buffer: fasthttp's writer
// does not tell how much of a failed write went out (see README,
// Decisions).
func TestCutStreamLogsBytesWritten(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, method, contentType string
		over                      int64 // what the line may claim beyond the client's bytes
	}{
		{"chunked body", "GET", "application/octet-stream", 4 << 10},
		{"event stream answering a POST", "POST", "text/event-stream", 4 << 10},
		{"event stream (detached)", "GET", "text/event-stream", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, logs := logHarness(t, accesslog.FormatJSON, func(o *harnessOpts) {
				o.srv.ClientWriteTimeout = 500 * time.Millisecond
			})
			piece := strings.Repeat("data: "+strings.Repeat("x", 1000)+"\n\n", 64)
			host := h.route("sbxstreamsent", backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", tc.contentType)
				for range 128 { // 8 MiB, chunked
					if _, err := io.WriteString(w, piece); err != nil {
						return
					}
					w.(http.Flusher).Flush()
				}
			})))
			c := dialSmallWindow(t, h.addr)
			fmt.Fprintf(c, "%s /s HTTP/1.1\r\nHost: %s\r\nContent-Length: 0\r\nX-Cube-Request-Id: stream-sent\r\n\r\n", tc.method, host)
			// Not reading until the proxy has cut the stream (its line is logged).
			e := logs.waitJSON(t, "stream-sent")
			if e["error_code"] != CodeClientWriteTimeout {
				t.Fatalf("error_code %v, want %s", e["error_code"], CodeClientWriteTimeout)
			}
			got := bodyToCut(t, c)
			if sent := int64(e["body_bytes_sent"].(float64)); sent < got || sent > got+tc.over {
				t.Errorf("body_bytes_sent %v, but the client got %d body bytes (want at most %d more)", sent, got, tc.over)
			}
		})
	}
}

// The heartbeat comments an idle event stream gets are body bytes its
// client receives, as the sandbox's are: body_bytes_sent, the bytes-out
// metric and the span's size counted only the sandbox's, so an MCP GET
// stream idle for an hour logged some 1.7 KB less than its client got,
// which nginx's $body_bytes_sent, the bytes sent to the client, never does.
func TestHeartbeatsCountAsBodyBytesSent(t *testing.T) {
	for _, method := range []string{"GET", "POST"} { // detached and fasthttp-written streams
		t.Run(method, func(t *testing.T) {
			tel := obsTelemetry(t, nil)
			h, logs := logHarness(t, accesslog.FormatJSON, func(o *harnessOpts) {
				o.cfg.Telemetry = tel
				o.cfg.HeartbeatInterval = 50 * time.Millisecond
			})
			admin := obsMetricsAdmin(t, h, tel)
			beaten := make(chan struct{})
			host := h.route("sbxbeatsent", backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				f := sseHeaders(w)
				io.WriteString(w, "data: one\n\n")
				f.Flush()
				<-beaten // the client has read heartbeats
				io.WriteString(w, "data: two\n\n")
			})))
			c := rawProxyConn(t, h, method+" /s HTTP/1.1\r\nHost: "+host+"\r\nContent-Length: 0\r\nConnection: close\r\nX-Cube-Request-Id: beat-sent\r\n\r\n")
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil || resp.StatusCode != 200 {
				t.Fatalf("stream: %v %v", resp, err)
			}
			var body []byte
			buf := make([]byte, 256)
			for bytes.Count(body, heartbeatLine) < 2 {
				n, err := resp.Body.Read(buf)
				body = append(body, buf[:n]...)
				if err != nil {
					t.Fatalf("stream ended before two heartbeats: %q, %v", body, err)
				}
			}
			close(beaten)
			rest, err := io.ReadAll(resp.Body)
			if err != nil {
				t.Fatal(err)
			}
			body = append(body, rest...)
			e := logs.waitJSON(t, "beat-sent")
			if sent := int(e["body_bytes_sent"].(float64)); sent != len(body) {
				t.Errorf("body_bytes_sent %d, but the client got %d body bytes (%d heartbeats): %q", sent, len(body), bytes.Count(body, heartbeatLine), body)
			}
			if v, _ := metricValue(scrapeMetrics(t, admin), "cubeproxy_sent_bytes_total", map[string]string{"route_kind": "sse"}); int(v) != len(body) {
				t.Errorf("cubeproxy_sent_bytes_total{route_kind=\"sse\"} %v, but the client got %d body bytes", v, len(body))
			}
		})
	}
}
