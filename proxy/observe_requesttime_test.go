package proxy

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/accesslog"
)

// request_time runs, as nginx's $request_time, from the first byte of the
// request to its last: the time a client took to send its head, and the
// part of its body fasthttp reads before the handler (a small body
// whole), is in it, and the keep-alive wait before the request is not. It
// ran from the handler's start, so a client that took two seconds over its
// head was logged 0.003, and a 408 for a head stalled for all of
// client.read_timeout was logged 0.000. The redirect listener's lines run
// from there too: they kept the handler's start after the traffic
// listeners' were fixed.
func TestAccessLogRequestTimeFromFirstByte(t *testing.T) {
	t.Parallel()
	const (
		pause       = 300 * time.Millisecond
		readTimeout = 900 * time.Millisecond
	)
	h, buf := logHarness(t, accesslog.FormatJSON, func(o *harnessOpts) {
		o.srv.ClientReadTimeout = readTimeout
		o.srv.ClientBodyTimeout = readTimeout
	})
	host := h.route("rtime", backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		io.WriteString(w, "ok")
	})))
	rln := listen(t, "127.0.0.1:0")
	go h.server.ServeRedirect(rln, "8443")
	// Each case sends its parts with a gap between them (the client's
	// slowness is what is measured, not an ordering), after first, which
	// may be sent and answered on the connection before. The lower bounds
	// are half the gap: on a loaded machine the server reads the first
	// part late (298 ms for a 300 ms gap seen), and before the fix these
	// cases logged a few milliseconds. A 408's bound is half the read
	// timeout for the same reason: the timeout runs from the read's start,
	// and a loaded CI run read the first byte 34 ms after it (866 ms
	// logged for 900); before the fix these logged 0.000.
	for _, tc := range []struct {
		name     string
		first    string // a request answered first on the connection, or ""
		parts    []string
		gap      time.Duration // between parts; pause when 0
		status   int
		min, max time.Duration // bounds of the logged request_time
		redirect bool          // on the redirect listener
	}{
		{
			name:   "head sent in two parts",
			parts:  []string{"GET /a HTTP/1.1\r\nHost: %[1]s\r\n", "X-Cube-Request-Id: %[2]s\r\n\r\n"},
			status: 200, min: pause / 2, max: readTimeout,
		},
		{
			name:   "small body trickled",
			parts:  []string{"POST /a HTTP/1.1\r\nHost: %[1]s\r\nX-Cube-Request-Id: %[2]s\r\nContent-Length: 4\r\n\r\nab", "cd"},
			status: 200, min: pause / 2, max: readTimeout,
		},
		{
			name:   "head sent in two parts, second request",
			first:  "GET /first HTTP/1.1\r\nHost: %[1]s\r\n\r\n",
			parts:  []string{"GET /a HTTP/1.1\r\nHost: %[1]s\r\n", "X-Cube-Request-Id: %[2]s\r\n\r\n"},
			status: 200, min: pause / 2, max: readTimeout,
		},
		{
			// The idle wait between requests is not the second one's.
			name:   "keep-alive wait before a whole head",
			first:  "GET /first HTTP/1.1\r\nHost: %[1]s\r\n\r\n",
			parts:  []string{"", "GET /a HTTP/1.1\r\nHost: %[1]s\r\nX-Cube-Request-Id: %[2]s\r\n\r\n"},
			gap:    4 * pause,
			status: 200, min: 0, max: 2 * pause,
		},
		{
			// fasthttp forgets the head (and the client's id) before
			// the 408; the line is found by its status.
			name:   "head stalled until client.read_timeout, second request",
			first:  "GET /first HTTP/1.1\r\nHost: %[1]s\r\n\r\n",
			parts:  []string{"", "GET /a HTTP/1.1\r\nHost: %[1]s\r\n"},
			status: 408, min: readTimeout / 2, max: 3 * readTimeout,
		},
		// The redirect listener's answers and refusals are timed so too:
		// they ran from its handler, and from its error handler.
		{
			name:   "redirect, head sent in two parts",
			parts:  []string{"GET /a HTTP/1.1\r\nHost: %[1]s\r\n", "X-Cube-Request-Id: %[2]s\r\n\r\n"},
			status: 308, min: pause / 2, max: readTimeout, redirect: true,
		},
		{
			name:   "redirect, small body trickled, second request",
			first:  "GET /first HTTP/1.1\r\nHost: %[1]s\r\n\r\n",
			parts:  []string{"POST /a HTTP/1.1\r\nHost: %[1]s\r\nX-Cube-Request-Id: %[2]s\r\nContent-Length: 4\r\n\r\nab", "cd"},
			status: 308, min: pause / 2, max: readTimeout, redirect: true,
		},
		{
			name:   "redirect, head stalled until client.read_timeout",
			parts:  []string{"GET /a HTTP/1.1\r\nHost: %[1]s\r\n"},
			status: 408, min: readTimeout / 2, max: 3 * readTimeout, redirect: true,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id := "rtime-" + strings.ReplaceAll(tc.name, " ", "-")
			addr := h.addr
			if tc.redirect {
				addr = rln.Addr().String()
			}
			c := dialRaw(t, addr)
			br := bufio.NewReader(c)
			if tc.first != "" {
				fmt.Fprintf(c, tc.first, host)
				resp, err := http.ReadResponse(br, nil)
				if err != nil {
					t.Fatalf("first request: %v", err)
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
			before := len(buf.String())
			gap := tc.gap
			if gap == 0 {
				gap = pause
			}
			for i, part := range tc.parts {
				if i > 0 {
					time.Sleep(gap)
				}
				if part != "" {
					fmt.Fprintf(c, part, host, id)
				}
			}
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatalf("no answer: %v", err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d, want %d", resp.StatusCode, tc.status)
			}
			// The log is written in order: once a later request's line
			// is there, so is this one's.
			later := h.req("GET", host, "/later", nil)
			later.Header.Set("X-Cube-Request-Id", id+"-later")
			lresp := h.do(later)
			_, _ = io.Copy(io.Discard, lresp.Body)
			lresp.Body.Close()
			buf.waitJSON(t, id+"-later")
			var got []float64
			for _, ln := range strings.Split(buf.String()[before:], "\n") {
				var e map[string]any
				if json.Unmarshal([]byte(ln), &e) != nil || e["status"] != float64(tc.status) ||
					(tc.status != 408 && e["x_cube_request_id"] != id) {
					continue
				}
				got = append(got, e["request_time"].(float64))
			}
			if len(got) != 1 {
				t.Fatalf("%d lines for the request, want 1:\n%s", len(got), buf.String()[before:])
			}
			// The line has milliseconds, truncated.
			if rt := time.Duration(got[0] * float64(time.Second)); rt < tc.min-time.Millisecond || rt > tc.max {
				t.Errorf("request_time %v, want between %v and %v", rt, tc.min, tc.max)
			}
		})
	}
}
