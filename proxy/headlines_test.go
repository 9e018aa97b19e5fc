package proxy

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
	"github.com/valyala/fasthttp"
)

// headOfLines is a request head for host with n header lines in all (Host
// and extra included): line repeated, then extra.
func headOfLines(method, host string, n int, line, extra string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s /p HTTP/1.1\r\nHost: %s\r\n", method, host)
	n-- // Host
	if extra != "" {
		n -= strings.Count(extra, "\r\n")
	}
	for range n {
		b.WriteString(line)
		b.WriteString("\r\n")
	}
	b.WriteString(extra)
	b.WriteString("\r\n")
	return b.String()
}

// A head is refused past maxHeaderLines lines, however short they are, as
// nginx 1.22 refuses one of more than 1,000 (400, "Request Header Or
// Cookie Too Large"): a 32 KiB head of 6,400 "a:b" lines, under
// client.max_header_size, was served, and fasthttp kept its parsed lines
// (≈ 100 bytes each) for as long as the connection stayed open.
func TestHeadLinesBounded(t *testing.T) {
	h := newHarness(t)
	var hits atomic.Int64
	port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		io.WriteString(w, "ok")
	}))
	host := h.route("headlines", port)
	rl := listen(t, "127.0.0.1:0")
	go h.server.ServeRedirect(rl, "8443")
	for _, tc := range []struct {
		name     string
		raw      string
		status   int
		redirect bool // sent to the redirect listener
		admin    bool // sent to the admin listener, for /admin/healthz
	}{
		{"the most lines", headOfLines("GET", host, maxHeaderLines, "X-L: v", ""), 200, false, false},
		{"one line more", headOfLines("GET", host, maxHeaderLines+1, "X-L: v", ""), 431, false, false},
		{"32 KiB of three-byte lines", headOfLines("GET", host, 6400, "a:b", ""), 431, false, false},
		{"cookie lines", headOfLines("GET", host, maxHeaderLines+1, "Cookie: a=b", ""), 431, false, false},
		{"the most lines, Expect", headOfLines("POST", host, maxHeaderLines, "X-L: v", "Expect: 100-continue\r\nContent-Length: 2\r\n"), 100, false, false},
		{"one line more, Expect", headOfLines("POST", host, maxHeaderLines+1, "X-L: v", "Expect: 100-continue\r\nContent-Length: 2\r\n"), 431, false, false},
		{"one line more, HEAD", headOfLines("HEAD", host, maxHeaderLines+1, "X-L: v", ""), 431, false, false},
		{"one line more, HEAD with Expect", headOfLines("HEAD", host, maxHeaderLines+1, "X-L: v", "Expect: 100-continue\r\nContent-Length: 2\r\n"), 431, false, false},
		{"redirect listener, the most lines", headOfLines("GET", host, maxHeaderLines, "X-L: v", ""), 308, true, false},
		{"redirect listener, one line more", headOfLines("GET", host, maxHeaderLines+1, "X-L: v", ""), 431, true, false},
		{"redirect listener, one line more, Expect", headOfLines("POST", host, maxHeaderLines+1, "X-L: v", "Expect: 100-continue\r\nContent-Length: 2\r\n"), 431, true, false},
		{"admin listener, the most lines", headOfLines("GET", "127.0.0.1", maxHeaderLines, "X-L: v", ""), 200, false, true},
		{"admin listener, one line more", headOfLines("GET", "127.0.0.1", maxHeaderLines+1, "X-L: v", ""), 431, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := hits.Load()
			addr, raw := h.addr, tc.raw
			switch {
			case tc.redirect:
				addr = rl.Addr().String()
			case tc.admin:
				addr, raw = h.admin, strings.Replace(raw, " /p ", " /admin/healthz ", 1)
			}
			c := dialRaw(t, addr)
			if _, err := io.WriteString(c, raw); err != nil {
				t.Fatal(err)
			}
			br := bufio.NewReader(c)
			method, _, _ := strings.Cut(tc.raw, " ")
			resp, err := http.ReadResponse(br, &http.Request{Method: method})
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			switch tc.status {
			case 100:
				if resp.StatusCode != 100 {
					t.Fatalf("got %d %s, want 100 Continue", resp.StatusCode, body)
				}
				io.WriteString(c, "ok")
				if resp, err = http.ReadResponse(br, nil); err != nil || resp.StatusCode != 200 {
					t.Fatalf("after the body: %v %v, want 200", resp, err)
				}
			case 200:
				if tc.admin {
					if resp.StatusCode != 200 {
						t.Fatalf("got %d %s, want the health check's 200", resp.StatusCode, body)
					}
					break
				}
				if resp.StatusCode != 200 || string(body) != "ok" {
					t.Fatalf("got %d %s, want the sandbox's 200", resp.StatusCode, body)
				}
			case 308:
				if resp.StatusCode != 308 || resp.Header.Get("Location") == "" {
					t.Fatalf("got %d %s, want the redirect to HTTPS", resp.StatusCode, body)
				}
			default:
				if method == "HEAD" {
					if len(body) != 0 || resp.StatusCode != tc.status {
						t.Fatalf("got %d with %d body bytes, want %d and none", resp.StatusCode, len(body), tc.status)
					}
				} else {
					checkProxyError(t, resp, string(body), tc.status, CodeHeaderTooLarge)
					if strings.Contains(string(body), "sandbox_id") {
						t.Errorf("refused before the target is read, yet names a sandbox: %s", body)
					}
				}
				if !resp.Close {
					t.Error("the refusal keeps the connection open")
				}
				if n := hits.Load() - before; n != 0 {
					t.Errorf("the sandbox got %d refused requests", n)
				}
			}
		})
	}
}

// A connection must not hold more memory after a head of many short lines
// than the README says one holds at most after a head the proxy takes
// (Decisions, "Header limits are nginx's"): 200 connections that had each
// sent a 32 KiB head of 6,400 "a:b" lines held ≈ 630 KiB each against
// GOMEMLIMIT (≈ 900 KiB of RSS each in the binary), fasthttp's parsed
// lines. Nor may one after a head the proxy takes or refuses on any
// listener: until headDrop covered them, a head of 1,000 short lines left
// ≈ 83 KiB with a connection whose target was refused (the lines were not
// yet counted), ≈ 135 KiB on the redirect and admin listeners, against
// ≈ 36 KiB once let go of. The clients keep their connections; the proxy
// may close them.
func TestManyHeadLinesHoldNoMemory(t *testing.T) {
	const conns = 200
	h, host, kib, allowed := headLinesMemoryCase(t, 200)
	rl := listen(t, "127.0.0.1:0")
	go h.server.ServeRedirect(rl, "8443")
	for _, tc := range []struct {
		name     string
		raw      string
		redirect bool // sent to the redirect listener
		admin    bool // sent to the admin listener
	}{
		{"32 KiB of three-byte lines", headOfLines("GET", host, 6400, "a:b", ""), false, false},
		{"32 KiB of three-byte lines, redirect listener", headOfLines("GET", host, 6400, "a:b", ""), true, false},
		// Not counted under client.max_conns: no bound on such connections.
		{"32 KiB of three-byte lines, admin listener", headOfLines("GET", "127.0.0.1", 6400, "a:b", ""), false, true},
		{"32 KiB of 1 KiB lines", headOfLines("GET", host, 31, "X-Long: "+strings.Repeat("v", 1000), ""), false, false},
		// The most lines taken, the head filled with one long line.
		{"the most lines, 32 KiB", headOfLines("GET", host, maxHeaderLines, "a:b", "X-Pad: "+strings.Repeat("p", 32000-5*maxHeaderLines)+"\r\n"), false, false},
		{"the most lines, 5 KiB", headOfLines("GET", host, maxHeaderLines, "a:b", ""), false, false},
		// Refused by its target, checked before the lines: the connection stays open.
		{"32 KiB of three-byte lines, a refused target", strings.Replace(headOfLines("GET", host, 6400, "a:b", ""), "/p", "/../p", 1), false, false},
		{"the most lines, 5 KiB, a refused target", strings.Replace(headOfLines("GET", host, maxHeaderLines, "a:b", ""), "/p", "/../p", 1), false, false},
		{"the most lines, redirect listener", headOfLines("GET", host, maxHeaderLines, "a:b", "X-Pad: "+strings.Repeat("p", 32000-5*maxHeaderLines)+"\r\n"), true, false},
		{"the most lines, admin listener", headOfLines("GET", "127.0.0.1", maxHeaderLines, "a:b", "X-Pad: "+strings.Repeat("p", 32000-5*maxHeaderLines)+"\r\n"), false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if len(tc.raw) > 32<<10 {
				t.Fatalf("a head of %d bytes: over client.max_header_size", len(tc.raw))
			}
			addr := h.addr
			switch {
			case tc.redirect:
				addr = rl.Addr().String()
			case tc.admin:
				addr = h.admin
			}
			// The last case's connections, closed by its cleanup, gone
			// first: their memory freed while this one is counted made
			// its count low.
			testenv.WaitFor(t, 10*time.Second, "earlier connections closed", func() bool { return h.proxy.held.len() == 0 })
			before := limitCounted()
			answeredConns(t, addr, tc.raw, conns, nil)
			per := (int64(limitCounted()) - int64(before)) / conns
			t.Logf("%d bytes counted per connection", per)
			if per > allowed {
				t.Errorf("a connection holds %.0f KiB against GOMEMLIMIT after a head of %d bytes, over the README's %d KiB for the heads the proxy takes",
					float64(per)/1024, len(tc.raw), kib)
			}
		})
	}
}

// headLinesMemoryCase is the set-up of the tests that count what a
// connection holds after heads of many lines, which open opens
// connections: a proxy, the host of a sandbox that answers "ok", and the
// README's figure (mostLinesHold).
func headLinesMemoryCase(t *testing.T, opens int) (h *harness, host string, kib int, allowed int64) {
	t.Helper()
	if testing.Short() {
		t.Skipf("opens %d connections", opens)
	}
	if raceDetectorOn {
		// The memory the binary counts, not the race detector's; and
		// its thousands of head lines a connection, parsed for 200
		// connections, took up to a minute under the detector.
		t.Skip("counts memory; make test runs this without -race")
	}
	kib, allowed = mostLinesHold(t)
	uncalibrateBodyPools()
	h = newHarness(t)
	port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
	return h, h.route("headlines", port), kib, allowed
}

// uncalibrateBodyPools gives fasthttp's process-wide request and response
// body buffer pools back the size a proxy process alone calibrates them
// to: the smallest. A connection's request and response keep their body
// buffers between requests, and a buffer is first taken from those pools
// at the size they last calibrated to (bytebufferpool: the most common
// length put back over the last 42,000 puts). In a proxy process nothing
// puts long bodies back (its server keeps them; keptBody, lentBody), but
// the Alloc tests' fasthttp sandboxes and clients in this test process
// do: after TestLentBodyAllocs's 32 KiB answers every connection counted
// here took a 32 KiB buffer for its 2-byte "ok" (the heap profile:
// bytebufferpool.Get under Response.SwapBody, readWholeBody), and
// TestManyTrailerLinesHoldNoMemory counted 81-96 KiB a connection against
// 47-58 run alone, over the README's 64. 42,001 puts of a short body make
// the shortest length the most common and calibrate once.
func uncalibrateBodyPools() {
	var req fasthttp.Request
	var resp fasthttp.Response
	for range 42001 {
		req.AppendBodyString("x")
		req.ResetBody() // a Request of its own keeps no buffer: put back
		resp.AppendBodyString("x")
		resp.ResetBody()
	}
}

// mostLinesHold is the README's figure for the most a connection holds
// against GOMEMLIMIT after a head the proxy takes (Decisions, "Header
// limits are nginx's"), in KiB, and the bytes a test allows for it: the
// count varies by a few percent with where the slices land.
func mostLinesHold(t *testing.T) (kib int, allowed int64) {
	t.Helper()
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`1,000 short lines and a long one, each of them under ≈ (\d+) KiB`).FindSubmatch(readme)
	if m == nil {
		t.Fatal("README: no figure for a connection idle after a head of the most lines (Decisions, Header limits are nginx's)")
	}
	kib, _ = strconv.Atoi(string(m[1]))
	return kib, int64(kib) << 10 * 11 / 10
}

// A refused head's parsed lines must not pass to the connections that
// come after it: fasthttp pools a closed connection's context, parsed head
// and all, and hands it to a new connection, which keeps it while it
// stays open. 200 connections idle after one request each held ≈ 550 KiB
// each against GOMEMLIMIT when 200 heads of 6,000 short lines and a
// malformed one (fasthttp's 400, after parsing the 6,000) had been refused
// just before.
func TestRefusedHeadsPassNoMemoryOn(t *testing.T) {
	const conns = 200
	h, host, kib, allowed := headLinesMemoryCase(t, 400)
	for _, tc := range []struct {
		name   string
		raw    string
		status int
		admin  bool // on the admin listener
	}{
		{"too many lines", headOfLines("GET", host, 6000, "a:b", ""), 431, false},
		{"a malformed line after many", headOfLines("GET", host, 6000, "a:b", "X Y\x01: z\r\n"), 400, false},
		{"admin listener, too many lines", headOfLines("GET", "127.0.0.1", 6000, "a:b", ""), 431, true},
		{"admin listener, a malformed line after many", headOfLines("GET", "127.0.0.1", 6000, "a:b", "X Y\x01: z\r\n"), 400, true},
		// Taken by the line count, refused before the body is asked for.
		{"an upload to no sandbox, the most lines", headOfLines("POST", strings.Replace(host, "headlines", "nosuchbox", 1), maxHeaderLines, "a:b", "Expect: 100-continue\r\nContent-Length: 2\r\n"), 404, false},
		{"an upload to no sandbox, 32 KiB", headOfLines("POST", strings.Replace(host, "headlines", "nosuchbox", 1), 20, "X-Long: "+strings.Repeat("v", 1500), "Expect: 100-continue\r\nContent-Length: 2\r\n"), 404, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addr, next := h.addr, "GET /p HTTP/1.1\r\nHost: "+host+"\r\n\r\n"
			if tc.admin {
				addr, next = h.admin, "GET /admin/healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
			}
			// The count moves with the collector's timing by tens of KiB
			// (17-62 KiB in twelve runs of one case, once 72): one over
			// the bound is measured again. The leak this guards against
			// is ≈ 550 KiB a connection, over it every time.
			per := refusedThenHeld(t, h.proxy, addr, tc.raw, next, tc.status, conns)
			if per > allowed {
				t.Logf("%d bytes counted per connection, over %d: measuring again", per, allowed)
				per = refusedThenHeld(t, h.proxy, addr, tc.raw, next, tc.status, conns)
			}
			if per > allowed {
				t.Errorf("a connection idle after one small request holds %.0f KiB against GOMEMLIMIT, over the README's %d KiB for the heads the proxy takes",
					float64(per)/1024, kib)
			}
		})
	}
}

// refusedThenHeld sends raw on conns connections to addr, all before any
// answer, wants status for each and closes them; then it opens conns more,
// each idle after one request next, and returns the memory counted
// against GOMEMLIMIT per connection held, which it closes before it
// returns.
func refusedThenHeld(t *testing.T, p *Proxy, addr, raw, next string, status, conns int) int64 {
	t.Helper()
	// A measure before this one closed its connections: gone first, or
	// what they free would be taken off this count.
	testenv.WaitFor(t, 10*time.Second, "earlier connections closed", func() bool { return p.clientConns.Load() == 0 })
	before := limitCounted()
	// All sent before any is answered: each takes a context of
	// its own, and all go back to the pool together.
	refused := make([]net.Conn, 0, conns)
	for range conns {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		refused = append(refused, c)
		if _, err := io.WriteString(c, raw); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range refused {
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		c.Close()
		if resp.StatusCode != status {
			t.Fatalf("got %d, want %d", resp.StatusCode, status)
		}
	}
	testenv.WaitFor(t, 10*time.Second, "refused connections closed", func() bool { return p.clientConns.Load() == 0 && p.held.len() == 0 })
	held := make([]net.Conn, 0, conns)
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	for range conns {
		c := dialRaw(t, addr)
		held = append(held, c)
		keptRequest(t, c, bufio.NewReader(c), next)
	}
	per := (int64(limitCounted()) - int64(before)) / int64(conns)
	t.Logf("%d bytes counted per connection", per)
	return per
}
