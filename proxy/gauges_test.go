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

	"github.com/coder/websocket"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// gaugeValue is one gauge of a scrape (summed over its labels).
func gaugeValue(t *testing.T, admin, name string) float64 {
	t.Helper()
	v, ok := metricValue(scrapeMetrics(t, admin), name, nil)
	if !ok {
		t.Fatalf("%s: no such series", name)
	}
	return v
}

// rawProxyConn dials the proxy and sends head (a whole request).
func rawProxyConn(t *testing.T, h *harness, head string) *net.TCPConn {
	t.Helper()
	c, err := net.Dial("tcp", h.addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if _, err := io.WriteString(c, head); err != nil {
		t.Fatal(err)
	}
	return c.(*net.TCPConn)
}

// reset closes c with a RST, as a client that crashes does.
func reset(c *net.TCPConn) {
	_ = c.SetLinger(0)
	_ = c.Close()
}

// An open WebSocket holds an upstream connection that is busy, not idle:
// idle_connections must not count it.
func TestMetricsIdleConnsExcludeTunnels(t *testing.T) {
	tel := obsTelemetry(t, nil)
	h := newHarness(t, func(o *harnessOpts) { o.cfg.Telemetry = tel })
	admin := obsMetricsAdmin(t, h, tel)
	wsEnded := make(chan error, 1)
	ws := dialWS(t, h, h.route("sbxidletunnel", wsBackend(t, wsEnded)))
	defer ws.CloseNow()
	if got := poolConns(h); got != 1 {
		t.Fatalf("%d upstream connections with one WebSocket open, want 1", got)
	}
	if v := gaugeValue(t, admin, "cubeproxy_websockets_open"); v != 1 {
		t.Fatalf("websockets_open = %v, want 1", v)
	}
	if v := gaugeValue(t, admin, "cubeproxy_upstream_idle_connections"); v != 0 {
		t.Errorf("upstream_idle_connections = %v with only a WebSocket's connection open, want 0", v)
	}
}

// A connection is busy from the moment a request takes it from its pool
// until it is given back, whatever the request does with it meanwhile.
// idle_connections counted every open connection but those waiting for a
// response head, streaming a body or holding a tunnel: one sending an
// upload to the sandbox (a 256 MiB one for minutes) counted as idle, and
// so did one reading a small answer the sandbox sent slowly.
func TestMetricsIdleConnsExcludeUploads(t *testing.T) {
	tel := obsTelemetry(t, nil)
	h := newHarness(t, func(o *harnessOpts) { o.cfg.Telemetry = tel })
	admin := obsMetricsAdmin(t, h, tel)
	arrived, release := make(chan struct{}), make(chan struct{})
	host := h.route("sbxidleupload", backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, err := io.ReadFull(r.Body, make([]byte, 4)); err != nil {
			t.Errorf("backend: first bytes of the upload: %v", err)
		}
		arrived <- struct{}{}
		<-release
		io.Copy(io.Discard, r.Body)
		io.WriteString(w, "ok")
	})))

	// Over fasthttpPreRead, so that the body streams to the sandbox as it
	// comes and the rest of it is still to come when the sandbox acknowledges.
	const size = 64 << 10
	c := rawProxyConn(t, h, fmt.Sprintf("POST /up HTTP/1.1\r\nHost: %s\r\nContent-Length: %d\r\n\r\n%s", host, size, strings.Repeat("a", 2*fasthttpPreRead)))
	testenv.Recv(t, arrived, 10*time.Second, "the upload's first bytes at the sandbox")
	if got := poolConns(h); got != 1 {
		t.Fatalf("%d upstream connections with one upload under way, want 1", got)
	}
	if v := gaugeValue(t, admin, "cubeproxy_upstream_idle_connections"); v != 0 {
		t.Errorf("upstream_idle_connections = %v with only an upload's connection open, want 0", v)
	}
	close(release)
	if _, err := io.WriteString(c, strings.Repeat("a", size-2*fasthttpPreRead)); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("upload: %v %v", resp, err)
	}
	io.Copy(io.Discard, resp.Body)
	// Given back to its pool, the connection is idle now.
	testenv.WaitFor(t, 5*time.Second, "the upload's connection to be counted idle", func() bool {
		return gaugeValue(t, admin, "cubeproxy_upstream_idle_connections") == 1
	})
}

// Every gauge returns to zero once a mix of requests has ended, however it
// ended: plain, HEAD, large downloads, chunked and SSE streams (detached
// or not), WebSockets (closed cleanly, reset by the client, declined by
// the sandbox), proxy errors, a refused body, a sandbox that resets, and
// clients that reset mid-body, mid-stream and while waiting for headers.
// So do the proxy's own counters behind them: requests in flight per
// sandbox, upstream readers, open and pending upstream connections.
func TestMetricsGaugesReturnToZero(t *testing.T) {
	tel := obsTelemetry(t, nil)
	h := newHarness(t, func(o *harnessOpts) {
		o.cfg.Telemetry = tel
		o.cfg.MaxRequestBodySize = 1 << 10
	})
	admin := obsMetricsAdmin(t, h, tel)

	big := strings.Repeat("x", 3*wholeBody)
	held := make(chan struct{}) // closed at the end: held answers go out
	arrived := make(chan string, 8)
	web := h.route("sbxgauges", backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/small":
			io.WriteString(w, "small")
		case "/big":
			io.WriteString(w, big)
		case "/chunked":
			f := w.(http.Flusher)
			for i := range 3 {
				fmt.Fprintf(w, "piece %d\n", i)
				f.Flush()
			}
		case "/sse":
			f := sseHeaders(w)
			io.WriteString(w, "data: one\n\n")
			f.Flush()
			if r.URL.RawQuery == "hold" {
				arrived <- r.URL.Path
				select {
				case <-held:
				case <-r.Context().Done():
				}
				return
			}
			io.WriteString(w, "data: two\n\n")
		case "/hold":
			arrived <- r.URL.Path
			<-held
			io.WriteString(w, "late")
		case "/reset":
			c, _, _ := w.(http.Hijacker).Hijack()
			c.(*net.TCPConn).SetLinger(0)
			c.Close()
		case "/ws":
			w.WriteHeader(404) // declines the upgrade
		}
	})))
	wsEnded := make(chan error, 4)
	ws := h.route("sbxgaugesws", wsBackend(t, wsEnded))
	dead := freePort(t)
	h.put("sbxgaugesdead", map[string]string{"HostIP": "127.0.0.1", "CreatedAt": "1", itoa(dead): itoa(dead)})
	deadHost := itoa(dead) + "-sbxgaugesdead.cube.test"

	// Whole exchanges.
	for _, c := range []struct {
		method, host, path string
		status             int
	}{
		{"GET", web, "/small", 200},
		{"HEAD", web, "/small", 200},
		{"GET", web, "/big", 200},
		{"GET", web, "/chunked", 200},
		{"GET", web, "/sse", 200},
		{"POST", web, "/sse", 200},
		{"GET", web, "/reset", 502},
		{"GET", deadHost, "/", 502},
		{"GET", "80-sbxgaugesmissing.cube.test", "/", 404},
		{"POST", web, "/small", 413},
	} {
		var body io.Reader
		if c.status == 413 {
			body = strings.NewReader(strings.Repeat("b", 4<<10))
		}
		resp := h.do(h.req(c.method, c.host, c.path, body))
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != c.status {
			t.Fatalf("%s %s%s: %d, want %d", c.method, c.host, c.path, resp.StatusCode, c.status)
		}
	}

	// A WebSocket closed cleanly, one reset by its client, one declined.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c1 := dialWS(t, h, ws)
	if err := c1.Write(ctx, websocket.MessageText, []byte("ping")); err != nil {
		t.Fatal(err)
	}
	if _, _, err := c1.Read(ctx); err != nil {
		t.Fatal(err)
	}
	c1.Close(websocket.StatusNormalClosure, "")
	c2 := rawProxyConn(t, h, "GET /ws HTTP/1.1\r\nHost: "+ws+"\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"+
		"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Protocol: echo.v1\r\n\r\n")
	if resp, err := http.ReadResponse(bufio.NewReader(c2), nil); err != nil || resp.StatusCode != 101 {
		t.Fatalf("raw upgrade: %v %v", resp, err)
	}
	reset(c2)
	for range 2 {
		select {
		case <-wsEnded:
		case <-ctx.Done():
			t.Fatal("backend WebSocket did not end")
		}
	}
	c3 := rawProxyConn(t, h, "GET /ws HTTP/1.1\r\nHost: "+web+"\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n")
	if resp, err := http.ReadResponse(bufio.NewReader(c3), nil); err != nil || resp.StatusCode != 404 {
		t.Fatalf("declined upgrade: %v %v", resp, err)
	}
	c3.Close()

	// Clients that reset: mid-download, mid-SSE (detached and not), and
	// while their request waits for the sandbox's headers.
	c4 := rawProxyConn(t, h, "GET /big HTTP/1.1\r\nHost: "+web+"\r\n\r\n")
	if _, err := io.ReadFull(c4, make([]byte, 1024)); err != nil {
		t.Fatal(err)
	}
	reset(c4)
	for _, method := range []string{"GET", "POST"} {
		c := rawProxyConn(t, h, method+" /sse?hold HTTP/1.1\r\nHost: "+web+"\r\nContent-Length: 0\r\n\r\n")
		br := bufio.NewReader(c)
		if resp, err := http.ReadResponse(br, nil); err != nil || resp.StatusCode != 200 {
			t.Fatalf("%s sse: %v %v", method, resp, err)
		}
		<-arrived
		reset(c)
	}
	c5 := rawProxyConn(t, h, "GET /hold HTTP/1.1\r\nHost: "+web+"\r\n\r\n")
	testenv.Recv(t, arrived, 10*time.Second, "the held request at the sandbox")
	reset(c5)
	close(held)

	h.client.CloseIdleConnections()
	testenv.WaitFor(t, 10*time.Second, "every stream, tunnel and client connection to end", func() bool {
		s := scrapeMetrics(t, admin)
		for _, name := range []string{"cubeproxy_connections_open", "cubeproxy_streams_open", "cubeproxy_websockets_open"} {
			if v, _ := metricValue(s, name, nil); v != 0 {
				return false
			}
		}
		return true
	})
	for _, id := range []string{"sbxgauges", "sbxgaugesws", "sbxgaugesdead"} {
		if sb := h.proxy.sandboxes.peek(id); sb == nil || sb.inFlight() != 0 {
			t.Errorf("sandbox %s: state %+v, want an entry with no request in flight", id, sb)
		}
	}
	if n := h.proxy.readersOut.Load(); n != 0 {
		t.Errorf("%d upstream readers still out", n)
	}
	if _, _, pending := h.proxy.pools.stats(); pending != 0 {
		t.Errorf("%d requests still waiting for headers", pending)
	}
	// What stays open is idle, and closing it leaves nothing.
	_, conns, _ := h.proxy.pools.stats()
	if v := gaugeValue(t, admin, "cubeproxy_upstream_idle_connections"); int(v) != conns {
		t.Errorf("upstream_idle_connections = %v with %d open connections and nothing in flight", v, conns)
	}
	h.proxy.pools.closeIdle()
	if v := gaugeValue(t, admin, "cubeproxy_upstream_idle_connections"); v != 0 || poolConns(h) != 0 {
		t.Errorf("after closing idle connections: idle gauge %v, %d connections counted open; want 0, 0", v, poolConns(h))
	}
}

// Every body relayed as it comes is an open stream while it lasts, a
// download over wholeBody as much as a chunked body or an event stream: an
// operator watching cubeproxy_streams_open during a drain waits for all of
// them. A download was left out (only bodies of unknown length counted),
// though it holds its sandbox connection, counts in
// cubeproxy_streams_ended_total and holds up the drain like the others. Once
// done it is timed as a response (to its last byte), a stream as a
// lifetime.
func TestStreamsOpenCountsEveryStreamedBody(t *testing.T) {
	tel := obsTelemetry(t, nil)
	h := newHarness(t, func(o *harnessOpts) { o.cfg.Telemetry = tel })
	admin := obsMetricsAdmin(t, h, tel)
	first := strings.Repeat("x", 2*wholeBody)
	const (
		respTime   = "cubeproxy_response_duration_seconds_count"
		streamTime = "cubeproxy_stream_duration_seconds_count"
	)
	for i, tc := range []struct {
		name, kind     string
		header         func(http.Header)
		timed, untimed string // the histogram that times it once done, and the other
	}{
		{"download over 64 KiB", "http", func(h http.Header) { h.Set("Content-Length", fmt.Sprint(2*len(first))) }, respTime, streamTime},
		{"chunked", "http", func(http.Header) {}, streamTime, respTime},
		{"event stream", "sse", func(h http.Header) { h.Set("Content-Type", "text/event-stream") }, streamTime, respTime},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rest := make(chan struct{})
			host := h.route(fmt.Sprintf("sbxstreamsopen%d", i), backend(t, "127.0.0.1",
				http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					tc.header(w.Header())
					io.WriteString(w, first)
					w.(http.Flusher).Flush()
					select {
					case <-rest:
					case <-r.Context().Done():
						return
					}
					io.WriteString(w, first)
				})))
			before := scrapeMetrics(t, admin)
			resp := h.do(h.req("GET", host, "/", nil))
			defer resp.Body.Close()
			if _, err := io.ReadFull(resp.Body, make([]byte, len(first))); err != nil {
				t.Fatalf("first part: %v", err)
			}
			kind := map[string]string{"route_kind": tc.kind}
			if bad := checkDeltas(before, scrapeMetrics(t, admin), []metricDelta{{"cubeproxy_streams_open", kind, 1}}); len(bad) > 0 {
				t.Errorf("while the body streams: %v", bad)
			}
			close(rest)
			if n, err := io.Copy(io.Discard, resp.Body); err != nil || n != int64(len(first)) {
				t.Fatalf("rest: %d bytes, %v", n, err)
			}
			// The stream finishes just after the client has its end.
			testenv.Eventually(t, 5*time.Second, func() error {
				after := scrapeMetrics(t, admin)
				if bad := checkDeltas(before, after, []metricDelta{
					{"cubeproxy_streams_open", kind, 0},
					{tc.timed, kind, 1},
				}); len(bad) > 0 {
					return fmt.Errorf("once the body ended: %v", bad)
				}
				b, _ := metricValue(before, tc.untimed, kind) // absent: 0
				if a, _ := metricValue(after, tc.untimed, kind); a != b {
					return fmt.Errorf("%s%v moved by %v, want 0", tc.untimed, kind, a-b)
				}
				return nil
			})
		})
	}
}

// The redirect listener's connections count against client.max_conns, so
// cubeproxy_connections_open, which shows how close a node runs to that
// limit, counts them too while they are open: a kept-alive one after its
// 308, and one whose Expect head was answered and lingers (a hijack);
// both are counted down when they close.
func TestConnectionsOpenCountsRedirectListener(t *testing.T) {
	tel := obsTelemetry(t, nil)
	h := newHarness(t, func(o *harnessOpts) { o.cfg.Telemetry = tel })
	admin := obsMetricsAdmin(t, h, tel)
	ln := listen(t, "127.0.0.1:0")
	go h.server.ServeRedirect(ln, "8443")
	const name = "cubeproxy_connections_open"
	base := gaugeValue(t, admin, name)
	for _, tc := range []struct{ name, head string }{
		{"kept alive", "GET /a HTTP/1.1\r\nHost: 50005-box.cube.test\r\n\r\n"},
		{"Expect head", "POST /a HTTP/1.1\r\nHost: 50005-box.cube.test\r\nContent-Length: 100\r\nExpect: 100-continue\r\n\r\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, _, resp, _ := rawAsk(t, ln.Addr().String(), tc.head)
			if resp.StatusCode != 308 {
				t.Fatalf("status %d, want 308", resp.StatusCode)
			}
			if got := gaugeValue(t, admin, name); got != base+1 {
				t.Errorf("%s %v with a redirect connection open, want %v", name, got, base+1)
			}
			c.Close()
			testenv.WaitFor(t, 5*time.Second, name+" back to its base", func() bool {
				return gaugeValue(t, admin, name) == base
			})
			h.waitClientConnsClosed(t)
		})
	}
}
