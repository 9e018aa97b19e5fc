package proxy

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// cpuTime is the CPU this process has used so far, user and system.
func cpuTime(t *testing.T) time.Duration {
	t.Helper()
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		t.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// exchangeCPU sends raw n times on one keep-alive connection to addr,
// reads each answer whole, and returns the process's CPU time for it all.
func exchangeCPU(t *testing.T, addr, raw string, n int) time.Duration {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(60 * time.Second))
	br := bufio.NewReader(c)
	start := cpuTime(t)
	for i := range n {
		if _, err := io.WriteString(c, raw); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("answer %d: %v", i, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("answer %d: %d %s", i, resp.StatusCode, body)
		}
	}
	return cpuTime(t) - start
}

// A head of thousands of lines must cost the proxy about what its bytes
// cost to read, whatever lines it loses on the way: the proxy remembered a
// repeated field's lines with a walk over the whole head at every line of
// that field, and removed an invalid or underscore-spelled name with a walk
// over the whole head at every line of it, so a 28 KB head of one name
// sent 4,000 times, plus one line to remove, took ≈ 60 ms of CPU, ≈ 3,000
// times a plain request: a client (or a sandbox's answers, for the
// response side) could keep the proxy's cores busy at a trickle of
// bandwidth. Each head is measured against one of the same lines that
// loses none (CPU of the whole test process, so the client and the
// sandbox are on both sides).
func TestManyHeaderLinesCostLinear(t *testing.T) {
	h := newHarness(t)
	reqPort := rawBackend(t, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
	reqHost := h.route("headcost", reqPort)
	const rounds = 10
	lines := func(n int, line func(i int) string) string {
		var b strings.Builder
		for i := range n {
			b.WriteString(line(i))
			b.WriteString("\r\n")
		}
		return b.String()
	}
	check := func(name string, cost, base time.Duration) {
		t.Helper()
		// Linear costs are within a small factor of each other; the
		// quadratic ones were 50 to 100 times the base.
		if base < time.Millisecond {
			base = time.Millisecond
		}
		if cost > 8*base {
			t.Errorf("%s: %v of CPU for %d heads, %.0f times the %v of the same lines losing none",
				name, cost, rounds, float64(cost)/float64(base), base)
		} else {
			t.Logf("%s: %v vs %v", name, cost, base)
		}
	}
	for _, tc := range []struct {
		name       string
		many, base func(i int) string
		n          int
		lose       string // a line to remove besides the head's own
	}{
		// The most lines a head may have (maxHeaderLines, with Host and
		// the last line); until heads had a line limit, 4,400 and 3,800.
		{"one repeated name", func(int) string { return "R: v" }, nil, maxHeaderLines - 2, "Keep-Alive: 1"},
		{"eight repeated names", func(i int) string { return fmt.Sprintf("R%d: v", i%8) }, nil, maxHeaderLines - 2, "Keep-Alive: 1"},
		{"an underscore alias, repeated", func(int) string { return "X_Real_IP: 1" }, func(int) string { return "X-Real-Ix: 1" }, maxHeaderLines - 2, ""},
	} {
		if tc.base == nil {
			tc.base = tc.many
		}
		base := exchangeCPU(t, h.addr, "GET / HTTP/1.1\r\nHost: "+reqHost+"\r\n"+lines(tc.n, tc.base)+"X-Kept: 1\r\n\r\n", rounds)
		cost := exchangeCPU(t, h.addr, "GET / HTTP/1.1\r\nHost: "+reqHost+"\r\n"+lines(tc.n, tc.many)+tc.lose+"\r\n\r\n", rounds)
		check("request: "+tc.name, cost, base)
	}

	// A sandbox's answer, its head up to upstream.max_header_size (16 KiB).
	many := lines(2500, func(int) string { return "R: v" })
	hosts := map[string]string{}
	for name, extra := range map[string]string{"base": "X-Keep-Alive: 1", "lose": "Keep-Alive: 1"} {
		port := rawBackend(t, "HTTP/1.1 200 OK\r\n"+many+extra+"\r\nContent-Length: 2\r\n\r\nok")
		hosts[name] = h.route("headcost-"+name, port)
	}
	get := func(host string) string { return "GET / HTTP/1.1\r\nHost: " + host + "\r\n\r\n" }
	base := exchangeCPU(t, h.addr, get(hosts["base"]), rounds)
	cost := exchangeCPU(t, h.addr, get(hosts["lose"]), rounds)
	check("response: one repeated name", cost, base)
}

// Lines whose names hold a space are dropped (nginx before 1.21.1 did so),
// each with a walk over the head, so a 28 KB head of 2,400 such names cost
// ≈ 4 ms of CPU, ten times the same head without them: up to
// maxInvalidNames are dropped, more are a 400 bad_request that never
// reaches the sandbox (nginx since 1.21.1 refuses a request with one).
func TestNamesWithSpaceBounded(t *testing.T) {
	h := newHarness(t)
	var hits atomic.Int64
	port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		echoHeaders().ServeHTTP(w, r)
	}))
	host := h.route("spacenames", port)
	resp, body := rawRequest(t, h.addr, "GET / HTTP/1.1\r\nHost: "+host+"\r\n"+namesWithSpace(maxInvalidNames)+"X-Kept: 1\r\n\r\n")
	var e echoed
	if resp.StatusCode != 200 || json.Unmarshal([]byte(body), &e) != nil {
		t.Fatalf("%d names with a space: %d %s, want 200", maxInvalidNames, resp.StatusCode, body)
	}
	if e.get("X-Kept") != "1" || len(e.Headers) > 8 {
		t.Errorf("%d names with a space: want them dropped and X-Kept kept, sandbox got %v", maxInvalidNames, e.Headers)
	}
	before := hits.Load()
	for _, n := range []int{maxInvalidNames + 1, 2000} {
		resp, body := rawRequest(t, h.addr, "GET / HTTP/1.1\r\nHost: "+host+"\r\n"+namesWithSpace(n)+"\r\n")
		checkProxyError(t, resp, body, 400, CodeBadRequest)
	}
	if n := hits.Load() - before; n != 0 {
		t.Errorf("refused requests reached the sandbox %d times", n)
	}
}

// namesWithSpace is n header lines whose names hold a space ("X Bad 0: v"),
// each a distinct name: the lines the proxy drops, up to maxInvalidNames.
func namesWithSpace(n int) string {
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, "X Bad %d: v\r\n", i)
	}
	return b.String()
}

// A response head that trickles in must cost about what its bytes cost to
// read: readHead parsed every byte buffered again at every piece that
// came, so a head of n pieces cost n times its size (≈ 0.8 s of CPU for
// a 16 KiB head sent a byte at a time; hours for one of
// upstream.max_header_size's 1 MiB), which a sandbox could keep up for
// upstream.response_header_timeout, or upstream.idle_timeout for a
// request that accepts an event stream. The trickled head is measured
// against a body of the same bytes, trickled in the same pieces.
func TestTrickledResponseHeadCostLinear(t *testing.T) {
	const (
		size  = 1<<20 - 4<<10 // upstream.max_header_size's largest, less room for the rest
		piece = 512
		gap   = 500 * time.Microsecond // pacing, so that the pieces arrive apart
	)
	h := newHarness(t, func(o *harnessOpts) { o.cfg.UpstreamReadBufferSize = 1 << 20 })
	var lines strings.Builder
	for i := 0; lines.Len() < size; i++ {
		fmt.Fprintf(&lines, "X-Pad-%05d: %s\r\n", i, strings.Repeat("v", 48))
	}
	pad := lines.String()
	trickle := func(head, body string) uint16 {
		ln := testenv.ServeTCP(t, func(c net.Conn) {
			defer c.Close()
			if _, err := http.ReadRequest(bufio.NewReader(c)); err != nil {
				return
			}
			if _, err := io.WriteString(c, head); err != nil {
				return
			}
			for s := body; len(s) > 0; s = s[min(piece, len(s)):] {
				time.Sleep(gap)
				if _, err := io.WriteString(c, s[:min(piece, len(s))]); err != nil {
					return
				}
			}
		})
		return uint16(ln.Addr().(*net.TCPAddr).Port)
	}
	// The head's pad lines, then its end, come piece by piece; the base
	// answer's head comes at once and the same bytes follow as its body.
	headHost := h.route("trickle-head", trickle("", "HTTP/1.1 200 OK\r\n"+pad+"Content-Length: 2\r\n\r\nok"))
	bodyHost := h.route("trickle-body", trickle(fmt.Sprintf("HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n", len(pad)+2), pad+"ok"))
	get := func(host string) string { return "GET / HTTP/1.1\r\nHost: " + host + "\r\n\r\n" }
	base := max(exchangeCPU(t, h.addr, get(bodyHost), 1), 10*time.Millisecond)
	cost := exchangeCPU(t, h.addr, get(headHost), 1)
	// Fixed, the two cost the same; parsed at every piece, 12 times more.
	if cost > 4*base {
		t.Errorf("a %d KiB head in %d-byte pieces: %v of CPU, %.0f times the %v of a body of the same pieces",
			size>>10, piece, cost, float64(cost)/float64(base), base)
	} else {
		t.Logf("trickled head %v, trickled body %v", cost, base)
	}
}
