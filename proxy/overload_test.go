package proxy

import (
	"bufio"
	"crypto/tls"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"runtime"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// maxConnsHarness is a harness with client.max_conns set to n, its log
// in logs and its metrics at the admin address metrics.
func maxConnsHarness(t *testing.T, n int) (h *harness, logs *testenv.LogBuffer, metrics string) {
	t.Helper()
	tel := obsTelemetry(t, nil)
	logs = new(testenv.LogBuffer)
	h = newHarness(t, func(o *harnessOpts) {
		o.cfg.Telemetry = tel
		o.cfg.Logger = slog.New(slog.NewTextHandler(logs, nil))
		o.srv.MaxClientConns = n
	})
	return h, logs, obsMetricsAdmin(t, h, tel)
}

// overloadBackend answers "/" with "ok" and "/sse" with an event stream
// that stays open until its client leaves.
func overloadBackend(t *testing.T) uint16 {
	return backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/sse" {
			f := sseHeaders(w)
			_, _ = io.WriteString(w, "data: one\n\n")
			f.Flush()
			<-r.Context().Done()
			return
		}
		_, _ = io.WriteString(w, "ok")
	}))
}

// rawAsk sends head on a new connection to addr and reads the answer's
// head and body (whole unless it is an event stream, whose head alone is
// read). The connection stays open until the caller (or the test) closes it.
func rawAsk(t *testing.T, addr, head string) (net.Conn, *bufio.Reader, *http.Response, string) {
	t.Helper()
	c := dialRaw(t, addr)
	if _, err := io.WriteString(c, head); err != nil {
		t.Fatalf("write to %s: %v", addr, err)
	}
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("no answer from %s: %v", addr, err)
	}
	if resp.Header.Get("Content-Type") == "text/event-stream" {
		return c, br, resp, ""
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("body from %s: %v", addr, err)
	}
	return c, br, resp, string(b)
}

// keepBusy starts a next request on c, an open keep-alive connection, and
// sends only its first line: the connection is mid-request, which a new
// client over client.max_conns never takes the place of (only ones waiting
// for a request are reclaimed). It returns once the proxy has read it.
func keepBusy(t *testing.T, h *harness, c net.Conn) {
	t.Helper()
	if _, err := io.WriteString(c, "GET / HTTP/1.1\r\n"); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 5*time.Second, "the request begun", func() bool { return waitingConns(h.proxy) == 0 })
}

// checkOverloaded fails unless resp is the refusal of a connection over
// client.max_conns, in the proxy's error shape, and the connection ends.
func checkOverloaded(t *testing.T, br *bufio.Reader, resp *http.Response, body string) {
	t.Helper()
	var e struct{ Error, Code string }
	if resp.StatusCode != 503 || json.Unmarshal([]byte(body), &e) != nil || e.Code != CodeOverloaded || e.Error == "" {
		t.Fatalf("connection over client.max_conns: %d %q, want 503 with JSON code %s", resp.StatusCode, body, CodeOverloaded)
	}
	// X-Cube-Retcode as on every other answer of the proxy's own: a
	// runbook tells it from a sandbox's 503 by that code.
	for k, want := range map[string]string{"Retry-After": "1", "Content-Type": "application/json", "Cache-Control": "no-store", HeaderRetcode: "310503"} {
		if got := resp.Header.Get(k); got != want {
			t.Errorf("refusal %s: %q, want %q", k, got, want)
		}
	}
	if !resp.Close {
		t.Error("refusal without Connection: close")
	}
	// Dated, as every answer of the proxy: this one is written by hand.
	if d := resp.Header.Values("Date"); len(d) != 1 {
		t.Errorf("refusal Date lines %q, want one", d)
	} else if at, err := http.ParseTime(d[0]); err != nil || time.Since(at) > time.Minute || time.Until(at) > time.Second {
		t.Errorf("refusal Date %q (%v), want the time of the answer", d[0], err)
	}
	// Closed: a FIN, or a reset when the request reached the socket
	// after the proxy had drained it and closed (the answer was read
	// first all the same); not more bytes, nor a read that times out.
	if _, err := br.ReadByte(); err != io.EOF && !errors.Is(err, syscall.ECONNRESET) {
		t.Errorf("after the refusal: %v, want the connection closed", err)
	}
}

// With client.max_conns connections open and busy (one mid-request, a
// detached SSE stream and a WebSocket tunnel: hijacked ones count until
// they close), the next connection is refused in the proxy's JSON shape,
// counted and logged once; the open ones keep being served; the admin
// listener takes connections regardless; and once one closes, whichever
// kind it is, a new connection is served.
func TestMaxConnsRefusesOverTheLimit(t *testing.T) {
	h, logs, metrics := maxConnsHarness(t, 3)
	web := h.route("sbxoverload", overloadBackend(t))
	ws := h.route("sbxoverloadws", wsBackend(t, make(chan error, 4)))
	get := "GET / HTTP/1.1\r\nHost: " + web + "\r\n\r\n"

	keepAlive, kaBR, resp, body := rawAsk(t, h.addr, get)
	if resp.StatusCode != 200 || body != "ok" {
		t.Fatalf("keep-alive GET: %d %q", resp.StatusCode, body)
	}
	sse, _, resp, _ := rawAsk(t, h.addr, "GET /sse HTTP/1.1\r\nHost: "+web+"\r\nAccept: text/event-stream\r\n\r\n")
	if resp.StatusCode != 200 {
		t.Fatalf("SSE GET: %d", resp.StatusCode)
	}
	// Its head is written by the hijack (a detached stream), after the handler.
	if got := resp.Header.Values(HeaderRetcode); len(got) != 1 || got[0] != "310200" {
		t.Errorf("detached SSE stream's %s %q, want 310200", HeaderRetcode, got)
	}
	tunnel := dialWS(t, h, ws)
	defer tunnel.CloseNow()
	if err := wsEcho(t, tunnel); err != nil {
		t.Fatal(err)
	}
	// Mid-request: not one to reclaim.
	keepBusy(t, h, keepAlive)

	for range 2 {
		_, br, resp, body := rawAsk(t, h.addr, get)
		checkOverloaded(t, br, resp, body)
	}
	if v, _ := metricValue(scrapeMetrics(t, metrics), "cubeproxy_connections_refused_total", nil); v != 2 {
		t.Errorf("cubeproxy_connections_refused_total = %v after two refusals, want 2", v)
	}
	if n := strings.Count(logs.String(), "refusing client connections"); n != 1 {
		t.Errorf("%d log lines for two refusals within 10 s, want 1:\n%s", n, logs.String())
	}

	// What is open keeps being served.
	if _, err := io.WriteString(keepAlive, "Host: "+web+"\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	if resp, err := http.ReadResponse(kaBR, nil); err != nil || resp.StatusCode != 200 {
		t.Fatalf("second request on the open keep-alive connection: %v %v", resp, err)
	} else {
		_, _ = io.Copy(io.Discard, resp.Body)
	}
	if err := wsEcho(t, tunnel); err != nil {
		t.Fatalf("open tunnel after the refusals: %v", err)
	}
	// The admin API is never capped.
	for range 4 {
		_, _, resp, body := rawAsk(t, h.admin, "GET /admin/healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
		if resp.StatusCode != 200 {
			t.Fatalf("admin listener with client.max_conns open: %d %q", resp.StatusCode, body)
		}
	}

	// servedAgain waits until a new connection is served rather than
	// refused, and returns it (open, mid-request: busy).
	servedAgain := func(what string) net.Conn {
		t.Helper()
		var c net.Conn
		testenv.Eventually(t, 5*time.Second, func() error {
			conn, br, resp, body := rawAsk(t, h.addr, get)
			if resp.StatusCode == 200 {
				c = conn
				return nil
			}
			checkOverloaded(t, br, resp, body)
			return io.ErrUnexpectedEOF // refused: try again
		})
		keepBusy(t, h, c)
		return c
	}
	refusedNow := func(what string) {
		t.Helper()
		_, br, resp, body := rawAsk(t, h.addr, get)
		if resp.StatusCode != 503 {
			t.Fatalf("%s: a connection over the limit was served (%d)", what, resp.StatusCode)
		}
		checkOverloaded(t, br, resp, body)
	}
	keepAlive.Close()
	c1 := servedAgain("after the keep-alive connection closed")
	refusedNow("with the stream, the tunnel and a new connection open")
	sse.Close() // the detached stream's client leaves
	c2 := servedAgain("after the SSE client left")
	refusedNow("with the tunnel and two connections open")
	tunnel.Close(websocket.StatusNormalClosure, "")
	servedAgain("after the tunnel closed")
	refusedNow("with three connections open")
	c1.Close()
	c2.Close()
}

// A refused client that never reads, or sends more than its head, or
// nothing at all, holds up neither the accept loop nor a goroutine: the
// clients behind it get their refusal (or, once room frees up, their
// answer) at once.
func TestMaxConnsRefusalNeverWaitsForTheClient(t *testing.T) {
	h := newHarness(t, func(o *harnessOpts) { o.srv.MaxClientConns = 1 })
	web := h.route("sbxoverloadslow", overloadBackend(t))
	get := "GET / HTTP/1.1\r\nHost: " + web + "\r\n\r\n"
	holder, _, resp, _ := rawAsk(t, h.addr, get)
	if resp.StatusCode != 200 {
		t.Fatalf("first connection: %d", resp.StatusCode)
	}
	keepBusy(t, h, holder)
	// One refusal first, so that what the proxy starts once (the log
	// line) is not counted below.
	_, br, resp, body := rawAsk(t, h.addr, get)
	checkOverloaded(t, br, resp, body)

	before := runtime.NumGoroutine()
	const hostile = 40
	big := "POST / HTTP/1.1\r\nHost: " + web + "\r\nContent-Length: 10000000\r\n\r\n" + strings.Repeat("x", 256<<10)
	for i := range hostile {
		c, err := net.Dial("tcp", h.addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		tc := c.(*net.TCPConn)
		_ = tc.SetReadBuffer(1) // the kernel's smallest: it takes next to nothing
		switch i % 3 {
		case 0: // connects and says nothing
		case 1: // half a head
			_, _ = io.WriteString(c, "GET / HTTP/1.1\r\nHost: "+web+"\r\n")
		case 2: // a large upload, never reading
			_ = c.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
			_, _ = io.WriteString(c, big)
		}
	}
	// The proxy took each of them off the backlog and refused it.
	start := time.Now()
	_, br, resp, body = rawAsk(t, h.addr, get)
	checkOverloaded(t, br, resp, body)
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("refusal behind %d clients that never read took %v", hostile, d)
	}
	if n := runtime.NumGoroutine(); n > before+hostile/4 {
		t.Errorf("%d goroutines after %d refusals, %d before: refusals must leave none behind", n, hostile, before)
	}
	holder.Close()
	testenv.Eventually(t, 5*time.Second, func() error {
		_, _, resp, _ := rawAsk(t, h.addr, get)
		if resp.StatusCode != 200 {
			return io.ErrUnexpectedEOF
		}
		return nil
	})
}

// The HTTPS listener shares the limit; a TLS client over it sees its
// connection closed during the handshake (answering would need one), at
// once, and is served once room frees up. The redirect listener's
// connections count too, and give their place back when they close.
func TestMaxConnsTLSAndRedirectListeners(t *testing.T) {
	h := newHarness(t, func(o *harnessOpts) { o.srv.MaxClientConns = 1 })
	web := h.route("sbxoverloadtls", overloadBackend(t))
	tlsAddr, roots := serveTLS(t, h)
	rln := listen(t, "127.0.0.1:0")
	go h.server.ServeRedirect(rln, "8443")
	handshake := func() error {
		c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", tlsAddr,
			&tls.Config{RootCAs: roots, ServerName: web})
		if err == nil {
			c.Close()
		}
		return err
	}

	holder, _, resp, _ := rawAsk(t, h.addr, "GET / HTTP/1.1\r\nHost: "+web+"\r\n\r\n")
	if resp.StatusCode != 200 {
		t.Fatalf("first connection: %d", resp.StatusCode)
	}
	keepBusy(t, h, holder)
	start := time.Now()
	if err := handshake(); err == nil {
		t.Fatal("TLS connection over client.max_conns completed its handshake")
	} else if d := time.Since(start); d > 2*time.Second {
		t.Errorf("refused TLS handshake took %v to fail (%v)", d, err)
	}
	_, br, resp, body := rawAsk(t, rln.Addr().String(), "GET / HTTP/1.1\r\nHost: "+web+"\r\n\r\n")
	checkOverloaded(t, br, resp, body)

	holder.Close()
	testenv.Eventually(t, 5*time.Second, handshake)
	// A redirected connection, closed, leaves the place it took free.
	testenv.Eventually(t, 5*time.Second, func() error {
		c, _, resp, _ := rawAsk(t, rln.Addr().String(), "GET / HTTP/1.1\r\nHost: "+web+"\r\n\r\n")
		c.Close()
		if resp.StatusCode != 308 {
			return io.ErrUnexpectedEOF
		}
		return nil
	})
	testenv.Eventually(t, 5*time.Second, handshake)
}

// fasthttp's own connection limit never answers in its place: with
// client.max_conns unset (unlimited) or set, the traffic servers'
// Concurrency is above any limit, so no client ever gets fasthttp's
// plain-text "Server.Concurrency limit exceeded" 503 (its default, 256 Ki,
// did; 256 Ki connections are more than a test can open, hence a look at
// the setting rather than at an answer).
func TestFasthttpConnectionLimitLifted(t *testing.T) {
	for _, max := range []int{0, 3} {
		h := newHarness(t, func(o *harnessOpts) { o.srv.MaxClientConns = max })
		for name, c := range map[string]int{"traffic": h.server.traffic.Concurrency, "redirect": h.server.redirect.Concurrency} {
			if c < math.MaxInt32 {
				t.Errorf("max_conns %d: the %s server's fasthttp Concurrency is %d: fasthttp would refuse in plain text", max, name, c)
			}
		}
	}
	if got := string(overloadAnswer()); !strings.HasPrefix(got, "Content-Type: application/json\r\n") ||
		!strings.HasSuffix(got, "\r\n\r\n{\"error\":\"the proxy holds as many client connections as it may (client.max_conns); retry\",\"code\":\"proxy_overloaded\"}\n") {
		t.Errorf("refusal:\n%s", got)
	}
}

// The refusal is rendered into the buffer limit sized for it, from the
// first refusal on: the status line and the Date (71 bytes) outgrew the 64
// bytes it allowed for them, so the first refusal of every listener grew
// the buffer, on the accept goroutine of a proxy out of room.
func TestRefusalRenderedInPlace(t *testing.T) {
	ln := listen(t, "127.0.0.1:0")
	l := newRetryListener(ln, slog.New(slog.NewTextHandler(io.Discard, nil)), nil)
	defer l.Close()
	var open atomic.Int64
	l.limit(&open, 1, nil)
	buf := l.answer[:1]
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	l.refuse(s)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != 503 || int64(len(body)) != resp.ContentLength || resp.Header.Get("Date") == "" {
		t.Fatalf("refusal %d, Date %q, body %d bytes of Content-Length %d (%v)", resp.StatusCode, resp.Header.Get("Date"), len(body), resp.ContentLength, err)
	}
	if &l.answer[0] != &buf[0] {
		t.Errorf("the first refusal grew its buffer from %d to %d bytes: sized too small in limit", cap(buf), cap(l.answer))
	}
}
