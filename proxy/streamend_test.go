package proxy

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/cube-sandbox/cubeproxy/accesslog"
	"github.com/cube-sandbox/cubeproxy/internal/testenv"
	"github.com/cube-sandbox/cubeproxy/telemetry"
)

// streamEndReasons are the reason label values of
// cubeproxy_streams_ended_total.
var streamEndReasons = []string{"complete", "client", "sandbox", "timeout", "drain", "killed", "error"}

// The heads a sandbox sends in TestStreamEndReasonCounted, each with the
// first bytes of its body (or of the tunnel).
const (
	chunkedHead  = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n"
	sseHead      = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n9\r\ndata: x\n\n\r\n"
	downloadHead = "HTTP/1.1 200 OK\r\nContent-Length: 10000000\r\n\r\n"
	switchedHead = "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n" +
		"Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n\r\nxx"
)

// streamEndCtl is what a row of TestStreamEndReasonCounted acts on once
// its client has the stream's first bytes.
type streamEndCtl struct {
	h       *harness
	client  net.Conn // the client's connection to the proxy
	sandbox net.Conn // the sandbox's connection from the proxy
	id      string   // the sandbox id
}

// The rows' ways to end a stream or a tunnel, shared by the tests of what
// each end is called (TestStreamEndReasonCounted,
// TestTunnelUpstreamSpanOutcome): shortDrain and shortIdle are harness
// options for the rows the drain's deadline or the idle timeout ends.
func shortDrain(o *harnessOpts) { o.srv.DrainTimeout = 200 * time.Millisecond }

func shortIdle(o *harnessOpts) { o.cfg.IdleStreamTimeout = 300 * time.Millisecond }

// drainNow starts the proxy's drain, which cuts what is left at its
// deadline.
func drainNow(_ *testing.T, c streamEndCtl) { go c.h.server.Shutdown(context.Background()) }

// killSandbox kills the sandbox through the admin API.
func killSandbox(t *testing.T, c streamEndCtl) {
	if st, body := c.h.adminDo("POST", "/admin/meta/delete", `{"sandbox_id":"`+c.id+`"}`, ""); st != 200 {
		t.Errorf("meta/delete: %d %s", st, body)
	}
}

// leaveAlone does nothing: the row's option (the idle timeout) ends it.
func leaveAlone(*testing.T, streamEndCtl) {}

// hangUpClient closes the client's connection.
func hangUpClient(_ *testing.T, c streamEndCtl) { _ = c.client.Close() }

// resetSandbox resets the sandbox's side, as a crashed server's.
func resetSandbox(_ *testing.T, c streamEndCtl) {
	_ = c.sandbox.(*net.TCPConn).SetLinger(0)
	_ = c.sandbox.Close()
}

// Every way a streamed response or a WebSocket ends after its head went
// out moves cubeproxy_streams_ended_total for exactly its reason, and for
// its route kind: the requests counter has long counted all of them as the
// 2xx (101) of their head, and only the access log and the spans told a
// complete stream from one the sandbox, the client, the drain, a kill or
// the idle timeout ended.
func TestStreamEndReasonCounted(t *testing.T) {
	t.Parallel()
	finish := func(_ *testing.T, c streamEndCtl) { rawWrite(c.sandbox, "0\r\n\r\n") }
	cases := []struct {
		name   string
		kind   string // route_kind label
		reason string
		opts   func(*harnessOpts)
		head   string                         // what the sandbox sends first
		act    func(*testing.T, streamEndCtl) // then, once the client has the first bytes
	}{
		{name: "chunked complete", kind: "http", reason: "complete", head: chunkedHead,
			act: finish},
		{name: "chunked sandbox reset", kind: "http", reason: "sandbox", head: chunkedHead,
			act: resetSandbox},
		{name: "download sandbox reset", kind: "http", reason: "sandbox", head: downloadHead + strings.Repeat("x", 100<<10),
			act: resetSandbox},
		{name: "chunked client hangs up", kind: "http", reason: "client", head: chunkedHead,
			act: hangUpClient},
		{name: "chunked drain deadline", kind: "http", reason: "drain", opts: shortDrain, head: chunkedHead, act: drainNow},
		{name: "chunked killed", kind: "http", reason: "killed", head: chunkedHead, act: killSandbox},
		{name: "chunked idle timeout", kind: "http", reason: "timeout", opts: shortIdle, head: chunkedHead, act: leaveAlone},
		{name: "sse complete", kind: "sse", reason: "complete", head: sseHead,
			act: finish},
		{name: "sse sandbox reset", kind: "sse", reason: "sandbox", head: sseHead, act: resetSandbox},
		{name: "sse killed", kind: "sse", reason: "killed", head: sseHead, act: killSandbox},
		{name: "sse client hangs up", kind: "sse", reason: "client", head: sseHead,
			act: hangUpClient},
		// A GET's event stream ends cleanly at the drain's start, and its
		// client reconnects elsewhere: no cut, as its log line says.
		{name: "sse ended by the drain's start", kind: "sse", reason: "drain", opts: shortDrain, head: sseHead, act: drainNow},
		{name: "websocket sandbox closes", kind: "websocket", reason: "complete", head: switchedHead,
			act: func(_ *testing.T, c streamEndCtl) { _ = c.sandbox.Close() }},
		// Close frames pass end to end: a client's close is a tunnel's
		// normal end.
		{name: "websocket client closes", kind: "websocket", reason: "complete", head: switchedHead,
			act: hangUpClient},
		{name: "websocket sandbox reset", kind: "websocket", reason: "sandbox", head: switchedHead, act: resetSandbox},
		{name: "websocket drain deadline", kind: "websocket", reason: "drain", opts: shortDrain, head: switchedHead, act: drainNow},
		{name: "websocket killed", kind: "websocket", reason: "killed", head: switchedHead, act: killSandbox},
		{name: "websocket idle timeout", kind: "websocket", reason: "timeout", opts: shortIdle, head: switchedHead, act: leaveAlone},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tel := obsTelemetry(t, nil)
			h := newHarness(t, func(o *harnessOpts) {
				o.cfg.Telemetry = tel
				if tc.opts != nil {
					tc.opts(o)
				}
			})
			admin := obsMetricsAdmin(t, h, tel)
			sandbox := make(chan net.Conn, 1)
			b := newScriptBackend(t, func(c net.Conn, _ *http.Request, _ int) bool {
				rawWrite(c, tc.head)
				sandbox <- c
				_, _ = io.Copy(io.Discard, c) // until the proxy (or the row) closes it
				return false
			})
			ctl := streamEndCtl{h: h, id: fmt.Sprintf("sbxstreamend%d", i)}
			host := h.route(ctl.id, b.port)
			before := scrapeMetrics(t, admin)

			ctl.client = dialRaw(t, h.addr)
			br := bufio.NewReader(ctl.client)
			var body io.Reader = br
			if tc.kind == "websocket" {
				fmt.Fprintf(ctl.client, "GET /ws HTTP/1.1\r\nHost: %s\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"+
					"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n", host)
				if resp, err := http.ReadResponse(br, nil); err != nil || resp.StatusCode != 101 {
					t.Fatalf("upgrade: %v %v", resp, err)
				}
			} else {
				fmt.Fprintf(ctl.client, "GET /stream HTTP/1.1\r\nHost: %s\r\n\r\n", host)
				resp, err := http.ReadResponse(br, nil)
				if err != nil || resp.StatusCode != 200 {
					t.Fatalf("stream head: %v %v", resp, err)
				}
				body = resp.Body
			}
			if _, err := io.ReadFull(body, make([]byte, 2)); err != nil {
				t.Fatalf("the stream's first bytes: %v", err)
			}
			ctl.sandbox = <-sandbox
			tc.act(t, ctl)
			_, _ = io.Copy(io.Discard, body) // to the stream's end (at once for a closed client)

			total := func(s []promSample) float64 {
				v, _ := metricValue(s, "cubeproxy_streams_ended_total", map[string]string{"route_kind": tc.kind})
				return v
			}
			var after []promSample
			testenv.WaitFor(t, 5*time.Second, "the stream's end counted", func() bool {
				after = scrapeMetrics(t, admin)
				return total(after) > total(before)
			})
			want := make([]metricDelta, 0, len(streamEndReasons)+1)
			for _, r := range streamEndReasons {
				d := 0.0
				if r == tc.reason {
					d = 1
				}
				want = append(want, metricDelta{"cubeproxy_streams_ended_total", map[string]string{"route_kind": tc.kind, "reason": r}, d})
			}
			for _, bad := range checkDeltas(before, after, want) {
				t.Error(bad)
			}
		})
	}
}

// streamEnd is the reason the metric gets from an exchange's error code:
// every code a stream or tunnel can end with maps to its fixed reason.
func TestStreamEndFromErrorCode(t *testing.T) {
	timeout := &net.OpError{Op: "write", Err: errTimeoutForTest{}}
	for _, tc := range []struct {
		code string
		err  error
		want telemetry.StreamEnd
	}{
		{"", nil, telemetry.StreamComplete},
		{"", io.ErrUnexpectedEOF, telemetry.StreamError},
		{CodeClientWriteTimeout, timeout, telemetry.StreamTimeout}, // a write the client did not take in time
		{CodeClientClosed, errClientLeft, telemetry.StreamClient},
		{CodeUpstreamReset, io.ErrUnexpectedEOF, telemetry.StreamSandbox},
		{CodeUpstreamBadHeader, errBadChunk, telemetry.StreamSandbox},
		{CodeUpstreamTimeout, timeout, telemetry.StreamTimeout},
		{CodeDrainTimeout, nil, telemetry.StreamDrain},
		{CodeSandboxKilled, nil, telemetry.StreamKilled},
		{CodeCredentialRevoked, errCredentialRevoked, telemetry.StreamRouteChanged},
		{CodeRouteChanged, errRouteChanged, telemetry.StreamRouteChanged},
		{CodeProxyLoop, nil, telemetry.StreamError},
	} {
		if got := streamEnd(tc.code, tc.err); got != tc.want {
			t.Errorf("streamEnd(%q, %v) = %v, want %v", tc.code, tc.err, got, tc.want)
		}
	}
}

// errTimeoutForTest is a net.Error that timed out.
type errTimeoutForTest struct{}

func (errTimeoutForTest) Error() string   { return "i/o timeout" }
func (errTimeoutForTest) Timeout() bool   { return true }
func (errTimeoutForTest) Temporary() bool { return true }

// A client that leaves before the head of its answer goes out, where the
// proxy writes that head itself after the handler (a WebSocket's 101, a
// GET event stream's head, both on a hijacked connection), ended the
// exchange, not the sandbox: as a request whose client hung up before its
// answer, it is logged and counted 499 client_closed_request, with the
// sandbox's status in upstream_status and no body bytes sent; neither span
// is an error, and the stream's end counts as the client's. That holds
// whether the head's write fails (the hijack handler ran) or fasthttp
// closes the connection without handing it over (it could not flush the
// answer to a request pipelined ahead: abandon). Such a client was logged
// and counted with the sandbox's 101 or 200, which the cube format, without
// error_code, showed as an upgrade or a stream that its client got.
func TestClientGoneBeforeHijackedHeadIsTheClients(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tel := obsTelemetry(t, exp)
	h, logs := logHarness(t, accesslog.FormatJSON, func(o *harnessOpts) { o.cfg.Telemetry = tel })
	admin := obsMetricsAdmin(t, h, tel)
	const (
		upgrade = "Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
		events  = "Accept: text/event-stream\r\n"
	)
	for _, tc := range []struct {
		name, id   string
		kind       string // route_kind
		headers    string // of the request
		head       string // the sandbox's answer
		upStatus   float64
		ahead      bool // a request pipelined ahead, its answer not yet flushed
		detachable bool // the case needs a detached event stream (Linux)
	}{
		{"websocket, the 101's write fails", "gone101write", "websocket", upgrade, switchedHead, 101, false, false},
		{"websocket, pipelined: fasthttp skips the handover", "gone101abandon", "websocket", upgrade, switchedHead, 101, true, false},
		{"event stream, the head's write fails", "goneheadwrite", "sse", events, sseHead, 200, false, true},
		{"event stream, pipelined: fasthttp skips the handover", "goneheadabandon", "sse", events, sseHead, 200, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.detachable && !canWaitReadable {
				t.Skip("event streams are detached only where the proxy can wait for readability")
			}
			arrived := make(chan struct{}, 1)
			goAhead := make(chan struct{})
			stop := make(chan struct{}) // a failed test must not leave the handler waiting
			b := newScriptBackend(t, func(c net.Conn, req *http.Request, _ int) bool {
				if req.URL.Path == "/small" {
					return rawWrite(c, okResponse("small"))
				}
				arrived <- struct{}{}
				select {
				case <-goAhead:
				case <-stop:
					return false
				}
				rawWrite(c, tc.head)
				_, _ = io.Copy(io.Discard, c) // until the proxy closes its side
				return false
			})
			t.Cleanup(func() { close(stop) }) // before the backend's cleanup waits for its handlers
			id := tc.id
			host := h.route(id, b.port)
			// The proxy looks for a client's hang-up only once the request
			// has waited clientCheck: a loaded machine may let it find this
			// one first (a 499 without the sandbox's answer). Then the case
			// is tried again.
			for attempt := 1; ; attempt++ {
				reqID := fmt.Sprintf("%s-%d", id, attempt)
				before := scrapeMetrics(t, admin)
				c, err := net.Dial("tcp", h.addr)
				if err != nil {
					t.Fatal(err)
				}
				var ahead string
				if tc.ahead {
					ahead = "GET /small HTTP/1.1\r\nHost: " + host + "\r\n\r\n"
				}
				fmt.Fprintf(c, "%sGET /s HTTP/1.1\r\nHost: %s\r\n%sX-Cube-Request-Id: %s\r\n\r\n", ahead, host, tc.headers, reqID)
				testenv.Recv(t, arrived, 10*time.Second, "the stream's request at the sandbox") // the request waits on the sandbox
				_ = c.(*net.TCPConn).SetLinger(0)
				clientPort := c.LocalAddr().(*net.TCPAddr).Port
				proxyPort := c.RemoteAddr().(*net.TCPAddr).Port
				c.Close()
				testenv.WaitFor(t, 5*time.Second, "the proxy's socket to take the reset", func() bool {
					return !tcpSocketOpen(t, proxyPort, clientPort)
				})
				goAhead <- struct{}{}

				e := logs.waitJSON(t, reqID)
				if e["upstream_status"] == nil && attempt < 3 {
					t.Logf("attempt %d: the hang-up was found before the sandbox answered; again", attempt)
					continue
				}
				if e["status"] != float64(499) || e["error_code"] != CodeClientClosed || e["upstream_status"] != tc.upStatus ||
					e["body_bytes_sent"] != float64(0) {
					t.Errorf("access log: status %v error_code %q upstream_status %v body_bytes_sent %v, want 499 %q %v 0",
						e["status"], e["error_code"], e["upstream_status"], e["body_bytes_sent"], CodeClientClosed, tc.upStatus)
				}
				server, client := waitSandboxSpans(t, exp, id)
				if server.Status.Code == codes.Error || client.Status.Code == codes.Error {
					t.Errorf("server span %v %q, upstream span %v %q: a client that left is no failure",
						server.Status.Code, server.Status.Description, client.Status.Code, client.Status.Description)
				}
				kind := func(l map[string]string) map[string]string { l["route_kind"] = tc.kind; return l }
				testenv.Eventually(t, 5*time.Second, func() error {
					if bad := checkDeltas(before, scrapeMetrics(t, admin), []metricDelta{
						{"cubeproxy_streams_ended_total", kind(map[string]string{"reason": "client"}), 1},
						{"cubeproxy_streams_ended_total", kind(map[string]string{"reason": "complete"}), 0},
						{"cubeproxy_requests_total", kind(map[string]string{"status_class": "4xx"}), 1},
						{"cubeproxy_requests_total", kind(map[string]string{}), 1},
					}); len(bad) > 0 {
						return fmt.Errorf("%v", bad)
					}
					return nil
				})
				return
			}
		})
	}
}

// Counting a stream's end allocates nothing: the reason is a switch over
// the exchange's code and the series are prebuilt.
func TestStreamEndCountNoAllocs(t *testing.T) {
	if raceDetectorOn {
		t.Skip("the race detector changes allocation counts; run without -race")
	}
	m := obsTelemetry(t, nil).Metrics
	codes := []string{CodeClientClosed, CodeClientWriteTimeout, CodeUpstreamReset, CodeUpstreamTimeout, CodeDrainTimeout, CodeSandboxKilled}
	if n := testing.AllocsPerRun(200, func() {
		for _, c := range codes {
			m.StreamEnded(telemetry.RouteSSE, streamEnd(c, nil))
			m.StreamEnded(telemetry.RouteHTTP, streamEnd(c, errClientLeft))
		}
		m.StreamEnded(telemetry.RouteWebSocket, streamEnd("", nil)) // complete
	}); n != 0 {
		t.Errorf("counting a stream's end: %v allocs, want 0", n)
	}
}
