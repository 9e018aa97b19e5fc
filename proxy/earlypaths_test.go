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

	"github.com/cube-sandbox/cubeproxy/accesslog"
	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// Every path of the redirect listener gives its connection's place under
// client.max_conns back, logs each request once, and numbers it as the
// request it is on its connection.
func TestRedirectListenerEveryPathCountedOnce(t *testing.T) {
	tel := obsTelemetry(t, nil)
	h, buf := logHarness(t, accesslog.FormatJSON, func(o *harnessOpts) { o.cfg.Telemetry = tel })
	admin := obsMetricsAdmin(t, h, tel)
	ln := listen(t, "127.0.0.1:0")
	go h.server.ServeRedirect(ln, "8443")
	addr := ln.Addr().String()
	before := scrapeMetrics(t, admin)
	head := func(id, extra string) string {
		return fmt.Sprintf("POST /up HTTP/1.1\r\nHost: 50005-box.cube.test\r\nX-Cube-Request-Id: %s\r\n%s\r\n", id, extra)
	}
	type step struct {
		id, send string
		body     int // bytes of body written after the head
		status   int
		conn     float64
	}
	for _, tc := range []struct {
		name  string
		steps []step
		reset bool // the client resets after the last answer
	}{
		{name: "two plain", steps: []step{
			{"rv-a1", head("rv-a1", "Content-Length: 0\r\n"), 0, 308, 1},
			{"rv-a2", head("rv-a2", "Content-Length: 0\r\n"), 0, 308, 2},
		}},
		{name: "expect second", steps: []step{
			{"rv-b1", head("rv-b1", "Content-Length: 0\r\n"), 0, 308, 1},
			{"rv-b2", head("rv-b2", "Content-Length: 100\r\nExpect: 100-continue\r\n"), 0, 308, 2},
		}},
		{name: "expect reset mid linger", reset: true, steps: []step{
			{"rv-c1", head("rv-c1", "Content-Length: 1000000\r\nExpect: 100-continue\r\n"), 0, 308, 1},
		}},
		{name: "too large first", steps: []step{
			{"rv-d1", head("rv-d1", "Content-Length: 8388608\r\n"), 1 << 20, 308, 1},
		}},
		{name: "too large second", steps: []step{
			{"rv-e1", head("rv-e1", "Content-Length: 0\r\n"), 0, 308, 1},
			{"rv-e2", head("rv-e2", "Content-Length: 8388608\r\n"), 0, 308, 2},
		}},
		{name: "expect body over linger limit", steps: []step{
			{"rv-f1", head("rv-f1", "Content-Length: 20000000\r\nExpect: 100-continue\r\n"), -1, 308, 1},
		}},
		{name: "expect bad host", steps: []step{
			{"rv-g1", "POST /up HTTP/1.1\r\nHost: a@evil.test\r\nX-Cube-Request-Id: rv-g1\r\nContent-Length: 10\r\nExpect: 100-continue\r\n\r\n", 0, 400, 1},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := dialRaw(t, addr)
			br := bufio.NewReader(c)
			for _, s := range tc.steps {
				io.WriteString(c, s.send)
				if s.body > 0 {
					c.Write(make([]byte, s.body))
				} else if s.body < 0 {
					// Sent at once, more than the linger reads: the write
					// may fail once the linger gives up.
					go c.Write(make([]byte, 20000000))
				}
				resp, err := http.ReadResponse(br, nil)
				if err != nil {
					t.Fatal(err)
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != s.status {
					t.Fatalf("%s: %d, want %d", s.id, resp.StatusCode, s.status)
				}
				e := buf.waitJSON(t, s.id)
				if e["connection_requests"] != s.conn {
					t.Errorf("%s: connection_requests %v, want %v", s.id, e["connection_requests"], s.conn)
				}
			}
			if tc.reset {
				c.(*net.TCPConn).SetLinger(0)
			}
			c.Close()
			for _, s := range tc.steps {
				if n := strings.Count(buf.String(), `"x_cube_request_id":"`+s.id+`"`); n != 1 {
					t.Errorf("%s logged %d times", s.id, n)
				}
			}
			h.waitClientConnsClosed(t)
		})
	}
	after := scrapeMetrics(t, admin)
	for _, name := range []string{"cubeproxy_connections_open", "cubeproxy_connections_refused_total"} {
		b, _ := metricValue(before, name, nil)
		a, _ := metricValue(after, name, nil)
		if a != b {
			t.Errorf("%s %v -> %v", name, b, a)
		}
	}
}

// A drain waits for the lingering close after an answer to an Expect
// head, on the redirect listener (its 308) as on the traffic listener (a
// refusal), as nginx's graceful stop waits for its lingering closes: the
// client's late body is taken, not reset, and the drain ends when the
// client closes, not at its deadline nor at the linger's read timeout;
// the place it holds under client.max_conns is given back when the client
// goes.
func TestExpectLingerOutlivesDrain(t *testing.T) {
	for _, tc := range []struct {
		name     string
		redirect bool
		host     string
		status   int
	}{
		{"redirect listener", true, "50005-box.cube.test", 308},
		{"traffic listener", false, "8080-nobox.cube.test", 404},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, buf := logHarness(t, accesslog.FormatJSON, func(o *harnessOpts) { o.srv.DrainTimeout = 20 * time.Second })
			addr := h.addr
			if tc.redirect {
				ln := listen(t, "127.0.0.1:0")
				go h.server.ServeRedirect(ln, "8443")
				addr = ln.Addr().String()
			}
			c := dialRaw(t, addr)
			fmt.Fprintf(c, "POST /up HTTP/1.1\r\nHost: %s\r\nX-Cube-Request-Id: rv-drain\r\nContent-Length: 100\r\nExpect: 100-continue\r\n\r\n", tc.host)
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil || resp.StatusCode != tc.status {
				t.Fatalf("%v %v, want %d", resp, err, tc.status)
			}
			buf.waitJSON(t, "rv-drain")
			testenv.WaitFor(t, 5*time.Second, "the lingering close", func() bool { return h.proxy.lingering.Load() == 1 })
			start := time.Now()
			shutdownDone := make(chan error, 1)
			go func() { shutdownDone <- h.server.Shutdown(context.Background()) }()
			h.waitListenerClosed(10 * time.Second)
			// The linger still reads: the client's late body is taken, not reset.
			if _, err := c.Write([]byte("0123456789")); err != nil {
				t.Errorf("write during the drain: %v", err)
			}
			drainGoesOn(t, shutdownDone, "the drain ended while the client of a lingering close was still connected")
			c.Close()
			drainEnds(t, shutdownDone, 10*time.Second, "the drain did not end after the lingering client closed")
			// It ended on the client's close, not on the linger's read timeout.
			if d := time.Since(start); d >= lingerTimeout {
				t.Errorf("the drain took %s", d)
			}
			h.waitClientConnsClosed(t)
		})
	}
}

// A client still sending the rest of an upload the proxy refused (a 404,
// a 413) when the drain begins keeps its lingering close until it has sent
// everything, and so gets its answer: a client that reads only once its
// body is sent (Python's http.client and requests) saw a broken pipe
// instead. Measured on the binary: the client of a 26 MB upload to an
// unknown sandbox got BrokenPipeError as the SIGTERM came, and its 404
// without one; nginx 1.22's nginx -s quit waited for the lingering close
// (4.5 s) and the client got its 413.
func TestDrainWaitsForLingeringUpload(t *testing.T) {
	const size = 8 << 20
	h, buf := logHarness(t, accesslog.FormatJSON, func(o *harnessOpts) { o.srv.DrainTimeout = 20 * time.Second })
	c := dialRaw(t, h.addr)
	fmt.Fprintf(c, "POST /up HTTP/1.1\r\nHost: 8080-nobox.cube.test\r\nX-Cube-Request-Id: linger-drain\r\nContent-Length: %d\r\n\r\n", size)
	piece := make([]byte, 64<<10)
	sent := 0
	for ; sent < 1<<20; sent += len(piece) {
		if _, err := c.Write(piece); err != nil {
			t.Fatalf("the body before the drain: %v", err)
		}
	}
	buf.waitJSON(t, "linger-drain")
	testenv.WaitFor(t, 5*time.Second, "the lingering close", func() bool { return h.proxy.held.len() == 1 })

	shutdownDone := make(chan error, 1)
	go func() { shutdownDone <- h.server.Shutdown(context.Background()) }()
	h.waitListenerClosed(10 * time.Second)
	for ; sent < size; sent += len(piece) {
		if _, err := c.Write(piece); err != nil {
			t.Fatalf("the rest of the body during the drain, at %d of %d bytes: %v (the lingering close was cut: a client that reads after sending never sees its answer)", sent, size, err)
		}
	}
	lingeredUntilClientCloses(t, c, shutdownDone)
}

// lingeredUntilClientCloses reads the 404 a drain's lingering close sent a
// client that has sent its whole refused body, and checks that the drain
// (shut gets Shutdown's result) waits for that client and ends once it
// closes.
func lingeredUntilClientCloses(t *testing.T, c net.Conn, shut <-chan error) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("the answer after the body: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 404 || !strings.Contains(string(body), "sandbox_not_found") {
		t.Fatalf("answer %d %s, want 404 sandbox_not_found", resp.StatusCode, body)
	}
	drainGoesOn(t, shut, "the drain ended before the lingering client closed")
	c.Close()
	drainEnds(t, shut, 10*time.Second, "the drain did not end after the lingering client closed")
}

// Pipelined: a plain request and an Expect upload in one write; and on
// the traffic listener a request and a malformed one. Both answers come,
// in order, and each is numbered as the request it is.
func TestEarlyAnswersPipelinedNumbered(t *testing.T) {
	h, buf := logHarness(t, accesslog.FormatJSON)
	ln := listen(t, "127.0.0.1:0")
	go h.server.ServeRedirect(ln, "8443")
	for _, tc := range []struct {
		name, addr, send string
		ids              []string
		status           []int
	}{
		{"redirect", ln.Addr().String(),
			"GET /a HTTP/1.1\r\nHost: 50005-box.cube.test\r\nX-Cube-Request-Id: rvp-1\r\n\r\n" +
				"POST /b HTTP/1.1\r\nHost: 50005-box.cube.test\r\nX-Cube-Request-Id: rvp-2\r\nContent-Length: 10\r\nExpect: 100-continue\r\n\r\n",
			[]string{"rvp-1", "rvp-2"}, []int{308, 308}},
		{"traffic expect refused", h.addr,
			"GET /a HTTP/1.1\r\nHost: 8080-nobox.cube.test\r\nX-Cube-Request-Id: rvp-3\r\n\r\n" +
				"POST /b HTTP/1.1\r\nHost: 8080-nobox.cube.test\r\nX-Cube-Request-Id: rvp-4\r\nContent-Length: 10\r\nExpect: 100-continue\r\n\r\n",
			[]string{"rvp-3", "rvp-4"}, []int{404, 404}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := dialRaw(t, tc.addr)
			io.WriteString(c, tc.send)
			br := bufio.NewReader(c)
			for i, id := range tc.ids {
				resp, err := http.ReadResponse(br, nil)
				if err != nil {
					t.Fatal(err)
				}
				io.Copy(io.Discard, resp.Body)
				if resp.StatusCode != tc.status[i] || resp.Header.Get(HeaderRequestID) != id {
					t.Fatalf("answer %d: %d %s", i, resp.StatusCode, resp.Header.Get(HeaderRequestID))
				}
				if e := buf.waitJSON(t, id); e["connection_requests"] != float64(i+1) {
					t.Errorf("%s: connection_requests %v, want %d", id, e["connection_requests"], i+1)
				}
			}
			c.Close()
			h.waitClientConnsClosed(t)
		})
	}
	// The traffic listener: a malformed request pipelined behind a good one.
	c := dialRaw(t, h.addr)
	io.WriteString(c, "GET /a HTTP/1.1\r\nHost: 8080-nobox.cube.test\r\nX-Cube-Request-Id: rvp-5\r\n\r\n"+
		"GET /b HTTP/1.1\r\nHost: 8080-nobox.cube.test\r\nContent-Length: zz\r\n\r\n")
	br := bufio.NewReader(c)
	for i := range 2 {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		if want := []int{404, 400}[i]; resp.StatusCode != want {
			t.Fatalf("answer %d: %d, want %d", i, resp.StatusCode, want)
		}
	}
	if e := buf.waitJSONLine(t, `"status":400`); e["connection_requests"] != float64(2) {
		t.Errorf("malformed second: connection_requests %v, want 2", e["connection_requests"])
	}
}

// An Expect head admitted, then a chunked body that cannot be parsed: the
// 400 (the handler's, from the body stream, not fasthttp's ErrorHandler)
// is numbered as the request it is, first or second on its connection.
func TestExpectAdmittedThenMalformedBodyNumbered(t *testing.T) {
	h, buf := logHarness(t, accesslog.FormatJSON)
	port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
	}))
	host := h.route("rvbody", port)
	for _, first := range []bool{true, false} {
		c := dialRaw(t, h.addr)
		br := bufio.NewReader(c)
		want := 1.0
		if !first {
			want = 2
			fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: %s\r\n\r\n", host)
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
		}
		fmt.Fprintf(c, "PUT /up HTTP/1.1\r\nHost: %s\r\nTransfer-Encoding: chunked\r\nExpect: 100-continue\r\n\r\n", host)
		resp, _ := readExpectAnswer(t, br)
		if resp.StatusCode != 100 {
			t.Fatalf("head: %d", resp.StatusCode)
		}
		io.WriteString(c, "zz\r\nhello\r\n0\r\n\r\n")
		resp, _ = readExpectAnswer(t, br)
		if resp.StatusCode != 400 {
			t.Fatalf("malformed body: %d, want 400", resp.StatusCode)
		}
		c.Close()
		e := buf.waitJSONLine(t, `"connection_requests":`+fmt.Sprint(want)+`,"sandbox_id":"rvbody"`)
		if e["status"] != float64(400) || e["error_code"] != "bad_request_body" {
			t.Errorf("request %v on its connection logged as %v", want, e)
		}
	}
}
