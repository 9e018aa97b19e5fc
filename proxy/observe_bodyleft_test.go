package proxy

import (
	"bufio"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/cube-sandbox/cubeproxy/accesslog"
)

// A client that sends a request head and leaves (a close or a reset) in
// the middle of a body fasthttp reads whole before the handler (one under
// 8 KiB; the redirect listener reads every body so) made a request: it is
// logged and counted as one that left halfway through a streamed upload is,
// 499 client_closed_request, as nginx logs it (400 there, "client
// prematurely closed connection" in its error log). fasthttp drops the
// head before its error handler runs, so the line has no method, target or
// version, unless the proxy had admitted it before the body (Expect:
// 100-continue), and kept it for this. So did one that leaves in the middle of a head, on a first
// request or a later one (nginx logs it 400 too, "client prematurely
// closed connection"): 499 as well, the proxy's status for a client that
// left, whatever it had sent. A connection that closes or resets without a
// byte of a request (a probe, a keep-alive connection the client lets go)
// made none: it is neither logged nor counted. Before, a client leaving
// mid-body or mid-head left no trace at all. A 499's body_bytes_sent is 0,
// as nginx's: the JSON answer fasthttp writes after it is not counted sent.
//
// With the access log off, what is counted differs where the proxy has no
// record of a connection's first byte (see README, Decisions): a first
// request's body left halfway goes uncounted, a head left halfway does not,
// nor does a body left after an admitted head's 100.
func TestSmallBodyLeftLogged(t *testing.T) {
	// Parallel: its 80 cases each wait for the proxy to count their
	// connection closed (6.4 s of a loaded machine's sequential run,
	// 2.2 s of CPU), and each half has a harness, telemetry and metrics
	// of its own.
	t.Parallel()
	for _, logged := range []bool{true, false} {
		t.Run(fmt.Sprintf("access log %v", logged), func(t *testing.T) {
			t.Parallel()
			testSmallBodyLeftLogged(t, logged)
		})
	}
}

func testSmallBodyLeftLogged(t *testing.T, accessLog bool) {
	tel := obsTelemetry(t, nil)
	var h *harness
	buf := new(obsLogBuf) // stays empty with the access log off
	if accessLog {
		h, buf = logHarness(t, accesslog.FormatJSON, func(o *harnessOpts) { o.cfg.Telemetry = tel })
	} else {
		h = newHarness(t, func(o *harnessOpts) { o.cfg.Telemetry = tel })
	}
	admin := obsMetricsAdmin(t, h, tel)
	tlsAddr, roots := serveTLS(t, h)
	rln := listen(t, "127.0.0.1:0")
	go h.server.ServeRedirect(rln, "8443")
	port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t.Errorf("the sandbox got %s %s: its client never sent the body", r.Method, r.URL)
	}))
	host := h.route("sbxbodyleft", port)
	class4xx := map[string]string{"status_class": "4xx", "route_kind": "error"}

	const (
		bodyPart = "POST /up HTTP/1.1\r\nHost: 50005-left.cube.test\r\nContent-Length: 100\r\n\r\nabc"
		headPart = "POST /up HTTP/1.1\r\nHost: 50005-left.cube.test\r\nContent-Le"
		linePart = "POST /u"
	)
	for _, tc := range []struct {
		name     string
		listener string // "traffic", "tls" or "redirect"
		second   bool   // the connection carried a request before
		expect   bool   // the head asks for 100-continue (routed, so admitted)
		sent     string
		reset    bool // the client resets rather than closes
		half     bool // the client half-closes and reads the answer
		logged   bool
	}{
		{name: "close in a small body", listener: "traffic", sent: bodyPart, logged: true},
		{name: "reset in a small body", listener: "traffic", sent: bodyPart, reset: true, logged: true},
		{name: "close in a small body, second request", listener: "traffic", second: true, sent: bodyPart, logged: true},
		{name: "reset in a small body, second request", listener: "traffic", second: true, sent: bodyPart, reset: true, logged: true},
		// Its head was admitted: logged with what it said, and counted
		// with the access log off too (admittedHead).
		{name: "close in a body after 100-continue", listener: "traffic", expect: true, logged: true},
		{name: "reset in a body after 100-continue", listener: "traffic", expect: true, reset: true, logged: true},
		{name: "TLS, close in a body after 100-continue", listener: "tls", expect: true, logged: true},
		// It still reads the 499 the line counts 0 bytes of: the
		// proxy cannot tell it from a client that closed.
		{name: "half-close in a small body", listener: "traffic", sent: bodyPart, half: true, logged: true},
		{name: "TLS, close in a small body", listener: "tls", sent: bodyPart, logged: true},
		{name: "TLS, reset in a small body", listener: "tls", sent: bodyPart, reset: true, logged: true},
		{name: "TLS, close in a small body, second request", listener: "tls", second: true, sent: bodyPart, logged: true},
		{name: "redirect, close in a body", listener: "redirect", sent: bodyPart, logged: true},
		{name: "redirect, reset in a body", listener: "redirect", sent: bodyPart, reset: true, logged: true},
		{name: "redirect, close in a body, second request", listener: "redirect", second: true, sent: bodyPart, logged: true},

		// fasthttp wraps a head's read error: some of it came, whatever
		// the connection carried before, and the access log on or off.
		{name: "close in a head", listener: "traffic", sent: headPart, logged: true},
		{name: "reset in a head", listener: "traffic", sent: headPart, reset: true, logged: true},
		{name: "close in a request line", listener: "traffic", sent: linePart, logged: true},
		{name: "close in a head, second request", listener: "traffic", second: true, sent: headPart, logged: true},
		{name: "reset in a head, second request", listener: "traffic", second: true, sent: headPart, reset: true, logged: true},
		{name: "half-close in a head", listener: "traffic", sent: headPart, half: true, logged: true},
		{name: "TLS, close in a head", listener: "tls", sent: headPart, logged: true},
		{name: "TLS, reset in a head", listener: "tls", sent: headPart, reset: true, logged: true},
		{name: "TLS, close in a head, second request", listener: "tls", second: true, sent: headPart, logged: true},
		{name: "redirect, close in a head", listener: "redirect", sent: headPart, logged: true},
		{name: "redirect, reset in a head", listener: "redirect", sent: headPart, reset: true, logged: true},
		{name: "redirect, close in a head, second request", listener: "redirect", second: true, sent: headPart, logged: true},

		{name: "close with nothing sent", listener: "traffic"},
		{name: "reset with nothing sent", listener: "traffic", reset: true},
		{name: "keep-alive close", listener: "traffic", second: true},
		{name: "keep-alive reset", listener: "traffic", second: true, reset: true},
		// A blank line before a request line is skipped (RFC 9112 2.2):
		// one alone is no head begun.
		{name: "close after a blank line", listener: "traffic", second: true, sent: "\r\n"},
		{name: "TLS, close after the handshake", listener: "tls"},
		{name: "TLS, reset after the handshake", listener: "tls", reset: true},
		{name: "TLS, keep-alive close", listener: "tls", second: true},
		{name: "redirect, close with nothing sent", listener: "redirect"},
		{name: "redirect, reset with nothing sent", listener: "redirect", reset: true},
		{name: "redirect, keep-alive close", listener: "redirect", second: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h.waitClientConnsClosed(t) // the last case's connections are gone
			var c, raw net.Conn
			switch tc.listener {
			case "tls":
				raw = dialRaw(t, tlsAddr)
				tlc := tls.Client(raw, &tls.Config{RootCAs: roots, ServerName: "50005-left.cube.test"})
				if err := tlc.Handshake(); err != nil {
					t.Fatal(err)
				}
				c = tlc
			case "redirect":
				raw = dialRaw(t, rln.Addr().String())
				c = raw
			default:
				raw = dialRaw(t, h.addr)
				c = raw
			}
			br := bufio.NewReader(c)
			if tc.second {
				id := "left-first-" + strings.ReplaceAll(tc.name, " ", "-")
				keptRequest(t, c, br, "GET / HTTP/1.1\r\nHost: 50005-none.cube.test\r\nX-Cube-Request-Id: "+id+"\r\n\r\n")
				if accessLog {
					buf.waitJSON(t, id)
				}
			}
			before := len(buf.String())
			counted, _ := metricValue(scrapeMetrics(t, admin), "cubeproxy_requests_total", class4xx)

			if tc.expect {
				fmt.Fprintf(c, "POST /up HTTP/1.1\r\nHost: %s\r\nExpect: 100-continue\r\nContent-Length: 100\r\n\r\n", host)
				resp, err := http.ReadResponse(br, nil)
				if err != nil || resp.StatusCode != 100 {
					t.Fatalf("want 100 Continue, got %v %v", resp, err)
				}
				io.WriteString(c, "abc")
			} else {
				io.WriteString(c, tc.sent)
			}
			switch {
			case tc.reset:
				raw.(*net.TCPConn).SetLinger(0)
				raw.Close()
			case tc.half:
				raw.(*net.TCPConn).CloseWrite()
				resp, err := http.ReadResponse(br, nil)
				if err != nil {
					t.Fatalf("half-closed client: %v", err)
				}
				b, _ := io.ReadAll(resp.Body)
				if !accessLog && !tc.second && tc.sent == bodyPart {
					// Taken for a connection that sent nothing (no
					// first-byte record): fasthttp's 400, uncounted.
					checkProxyError(t, resp, string(b), 400, CodeBadRequest)
				} else {
					checkProxyError(t, resp, string(b), 499, CodeClientClosed)
				}
				c.Close()
			default:
				c.Close()
			}
			// fasthttp is done with the connection once it counts it
			// closed: whatever it logged is in the log's queue by then.
			h.waitClientConnsClosed(t)

			// The log is written in order: once a later request's line is
			// there, so is any line of this one.
			later := "left-later-" + strings.ReplaceAll(tc.name, " ", "-")
			lc := dialRaw(t, h.addr)
			fmt.Fprintf(lc, "GET / HTTP/1.1\r\nHost: 50005-none.cube.test\r\nX-Cube-Request-Id: %s\r\nConnection: close\r\n\r\n", later)
			lresp, err := http.ReadResponse(bufio.NewReader(lc), nil)
			if err != nil {
				t.Fatalf("later request: %v", err)
			}
			lresp.Body.Close()
			lc.Close()
			after, _ := metricValue(scrapeMetrics(t, admin), "cubeproxy_requests_total", class4xx)
			if !accessLog {
				// Without a first-byte record a first request's body
				// cannot be told from a silent connection; a head's
				// wrapped error can.
				head := tc.sent == headPart || tc.sent == linePart
				want := 0.0
				if tc.logged && (head || tc.second || tc.expect) {
					want = 1
				}
				if got := after - counted - 1; got != want {
					t.Errorf("cubeproxy_requests_total{4xx,error} grew by %v besides the later request, want %v", got, want)
				}
				return
			}
			buf.waitJSON(t, later)
			var lines []map[string]any
			for _, ln := range strings.Split(buf.String()[before:], "\n") {
				var e map[string]any
				if json.Unmarshal([]byte(ln), &e) == nil && e["x_cube_request_id"] != later {
					lines = append(lines, e)
				}
			}
			want := 0.0 // the later request's 404 aside
			switch {
			case tc.logged && len(lines) != 1:
				t.Fatalf("lines %v, want one", lines)
			case tc.logged && (lines[0]["status"] != float64(499) || lines[0]["error_code"] != CodeClientClosed):
				t.Fatalf("logged status %v error_code %v, want 499 %s", lines[0]["status"], lines[0]["error_code"], CodeClientClosed)
			case tc.logged && tc.expect && (lines[0]["method"] != "POST" || lines[0]["request_uri"] != "/up" || lines[0]["sandbox_id"] != "sbxbodyleft"):
				// The head the proxy admitted, which fasthttp dropped.
				t.Fatalf("logged %v %v for sandbox %v, want POST /up for sbxbodyleft", lines[0]["method"], lines[0]["request_uri"], lines[0]["sandbox_id"])
			case tc.logged && !tc.expect && (lines[0]["method"] != "" || lines[0]["request_uri"] != "" || lines[0]["protocol"] != ""):
				// fasthttp dropped the head: not its defaults (GET / HTTP/1.1).
				t.Fatalf("logged %v %v %v, want no method, target or version", lines[0]["method"], lines[0]["request_uri"], lines[0]["protocol"])
			case tc.logged && lines[0]["body_bytes_sent"] != float64(0):
				// No answer reached the client, as nginx logs its 499.
				t.Fatalf("logged body_bytes_sent %v, want 0", lines[0]["body_bytes_sent"])
			case tc.logged:
				want = 1
			case len(lines) != 0:
				t.Fatalf("lines %v, want none", lines)
			}
			if got := after - counted - 1; got != want {
				t.Errorf("cubeproxy_requests_total{4xx,error} grew by %v besides the later request, want %v", got, want)
			}
		})
	}
}
