package proxy

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
	"github.com/cube-sandbox/cubeproxy/telemetry"
)

// A client that hangs up while its answer's body streams ended the
// exchange, not the sandbox: the access log keeps the status that went out
// and says client_closed_request, so an aborted download does not pass for
// a complete one (nor for a sandbox's reset), and neither span is an error.
// Before, all three signals showed such a download exactly as a complete
// one, and the upstream span blamed the sandbox ("client closed the
// connection" as its error).
func TestClientLeftMidBodyIsLoggedAsTheClients(t *testing.T) {
	if CodeClientClosed != telemetry.ErrorCodeClientClosed {
		t.Fatalf("CodeClientClosed %q and telemetry.ErrorCodeClientClosed %q differ: spans would count a hang-up as an error",
			CodeClientClosed, telemetry.ErrorCodeClientClosed)
	}
	exp := tracetest.NewInMemoryExporter()
	tel := obsTelemetry(t, exp)
	h, logs := logHarness(t, "json", func(o *harnessOpts) { o.cfg.Telemetry = tel })

	cases := []struct {
		name string
		head string // the sandbox's head and the first part of its body
	}{
		{"chunked", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n"},
		{"event stream", "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n7\r\ndata: x\r\n"},
		{"download", "HTTP/1.1 200 OK\r\nContent-Length: 10000000\r\n\r\n" + strings.Repeat("x", 100<<10)},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			b := newScriptBackend(t, func(c net.Conn, _ *http.Request, _ int) bool {
				rawWrite(c, tc.head)
				// Held open until the proxy closes it for the departed client.
				_, _ = io.Copy(io.Discard, c)
				return false
			})
			id := fmt.Sprintf("sbxclientleft%d", i)
			host := h.route(id, b.port)
			reqID := "client-left-" + id

			c := dialRaw(t, h.addr)
			fmt.Fprintf(c, "GET /f HTTP/1.1\r\nHost: %s\r\nX-Cube-Request-Id: %s\r\n\r\n", host, reqID)
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := resp.Body.Read(make([]byte, 1)); err != nil {
				t.Fatalf("first body byte: %v", err)
			}
			c.Close()
			if err := b.waitEnded(t); err != io.EOF && err != nil {
				t.Logf("sandbox connection ended with %v", err)
			}

			entry := logs.waitJSON(t, reqID)
			if entry["status"] != float64(200) || entry["error_code"] != CodeClientClosed || entry["upstream_status"] != float64(200) {
				t.Errorf("access log: status %v, error_code %q, upstream_status %v; want 200, %q, 200",
					entry["status"], entry["error_code"], entry["upstream_status"], CodeClientClosed)
			}

			server, client := waitSandboxSpans(t, exp, id)
			if server.Status.Code == codes.Error || client.Status.Code == codes.Error {
				t.Errorf("server span status %v %q, client span status %v %q: a client's hang-up is no error",
					server.Status.Code, server.Status.Description, client.Status.Code, client.Status.Description)
			}
			checkAttrs(t, "server span", server.Attributes, map[attribute.Key]string{"cube.error.code": CodeClientClosed})
		})
	}

	// Before the head (499), the upstream span is no error either.
	waiting := make(chan struct{}, 1)
	b := newScriptBackend(t, func(c net.Conn, _ *http.Request, _ int) bool {
		waiting <- struct{}{}
		_, _ = io.Copy(io.Discard, c)
		return false
	})
	host := h.route("sbxclientleftearly", b.port)
	c := dialRaw(t, h.addr)
	fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: %s\r\nX-Cube-Request-Id: client-left-early\r\n\r\n", host)
	testenv.Recv(t, waiting, 10*time.Second, "the request at the sandbox")
	c.Close()
	if e := logs.waitJSON(t, "client-left-early"); e["status"] != float64(499) || e["error_code"] != CodeClientClosed {
		t.Errorf("client gone before the head logged %v %q, want 499 %q", e["status"], e["error_code"], CodeClientClosed)
	}
	var early []tracetest.SpanStub
	testenv.WaitFor(t, 5*time.Second, "upstream span of the 499", func() bool {
		for _, s := range exp.GetSpans() {
			for _, a := range s.Attributes {
				if a.Key == "cube.sandbox.id" && a.Value.AsString() == "sbxclientleftearly" {
					early = spanByKind(exp.GetSpans(), s.SpanContext.TraceID(), trace.SpanKindClient)
				}
			}
		}
		return len(early) == 1
	})
	if early[0].Status.Code == codes.Error {
		t.Errorf("upstream span of a 499 is an error (%q): the client hung up, the sandbox failed nothing", early[0].Status.Description)
	}

	// A body delivered whole carries no code.
	okHost := h.route("sbxclientstayed", backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.(http.Flusher).Flush() // chunked: a stream
		io.WriteString(w, strings.Repeat("y", 100<<10))
	})))
	req := h.req("GET", okHost, "/", nil)
	req.Header.Set("X-Cube-Request-Id", "client-stayed")
	resp := h.do(req)
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if e := logs.waitJSON(t, "client-stayed"); e["error_code"] != "" || e["status"] != float64(200) {
		t.Errorf("complete stream logged %v %q, want 200 without a code", e["status"], e["error_code"])
	}
}

// A client that stops reading a streamed answer or a tunnel is cut at
// client.write_timeout, and that is logged as client_write_timeout with the
// status that went out: without a code the cut download passed for a
// complete one. It is the client's side, as a hang-up is: neither span is
// an error, and the streams-ended metric says timeout.
func TestStalledClientIsLoggedAsWriteTimeout(t *testing.T) {
	t.Parallel()
	if CodeClientWriteTimeout != telemetry.ErrorCodeClientWriteTimeout {
		t.Fatalf("CodeClientWriteTimeout %q and telemetry.ErrorCodeClientWriteTimeout %q differ",
			CodeClientWriteTimeout, telemetry.ErrorCodeClientWriteTimeout)
	}
	exp := tracetest.NewInMemoryExporter()
	tel := obsTelemetry(t, exp)
	h, logs := logHarness(t, "json", func(o *harnessOpts) {
		o.cfg.Telemetry = tel
		o.cfg.IdleStreamTimeout = time.Hour
		o.srv.ClientWriteTimeout = 300 * time.Millisecond
	})
	admin := obsMetricsAdmin(t, h, tel)
	chunk := strings.Repeat("x", 32<<10)
	framed := fmt.Sprintf("%x\r\n%s\r\n", len(chunk), chunk)
	for i, tc := range []struct {
		name, kind string
		status     float64
		head       string // the sandbox's head
		flood      string // what it then writes until the proxy closes it
		upgrade    bool
	}{
		{"chunked", "http", 200, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", framed, false},
		{"event stream", "sse", 200, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n",
			fmt.Sprintf("%x\r\ndata: %s\n\n\r\n", len(chunk)+8, chunk), false},
		{"websocket", "websocket", 101, switchedHead, chunk, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newScriptBackend(t, func(c net.Conn, _ *http.Request, _ int) bool {
				for ok := rawWrite(c, tc.head); ok; ok = rawWrite(c, tc.flood) {
				}
				return false
			})
			id := fmt.Sprintf("sbxstalled%d", i)
			host := h.route(id, b.port)
			reqID := "stalled-" + id
			before := scrapeMetrics(t, admin)

			c := dialRaw(t, h.addr)
			upgrade := ""
			if tc.upgrade {
				upgrade = "Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
			}
			fmt.Fprintf(c, "GET /f HTTP/1.1\r\nHost: %s\r\nX-Cube-Request-Id: %s\r\n%s\r\n", host, reqID, upgrade)
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil || float64(resp.StatusCode) != tc.status {
				t.Fatalf("head: %v %v", resp, err)
			}
			// And nothing more is read: the proxy's writes fill the
			// socket buffers, and the next one times out.
			e := logs.waitJSON(t, reqID)
			if e["status"] != tc.status || e["error_code"] != CodeClientWriteTimeout {
				t.Errorf("access log: status %v error_code %q, want %v %q", e["status"], e["error_code"], tc.status, CodeClientWriteTimeout)
			}
			server, client := waitSandboxSpans(t, exp, id)
			if server.Status.Code == codes.Error || client.Status.Code == codes.Error {
				t.Errorf("server span %v %q, upstream span %v %q: a client that stopped reading is no failure",
					server.Status.Code, server.Status.Description, client.Status.Code, client.Status.Description)
			}
			checkAttrs(t, "server span", server.Attributes, map[attribute.Key]string{"cube.error.code": CodeClientWriteTimeout})
			timeouts := map[string]string{"route_kind": tc.kind, "reason": "timeout"}
			was, _ := metricValue(before, "cubeproxy_streams_ended_total", timeouts)
			testenv.WaitFor(t, 5*time.Second, "the stream's end counted as a timeout", func() bool {
				now, _ := metricValue(scrapeMetrics(t, admin), "cubeproxy_streams_ended_total", timeouts)
				return now > was
			})
		})
	}
}
