package proxy

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/auth"
	"github.com/cube-sandbox/cubeproxy/internal/testenv"
	"github.com/valyala/fasthttp"
)

// chunkedWithTrailer is a chunked POST of "abc" to host whose trailer is
// trailer (lines, each ending in CRLF).
func chunkedWithTrailer(host, trailer string) string {
	return "POST /p HTTP/1.1\r\nHost: " + host + "\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n" + trailer + "\r\n"
}

// A chunked body's trailer lines whose names hold a space are dropped, as
// the head's are, each with a delete that walks the whole header: 3,000
// of them in a 30 KB trailer cost ≈ 10 ms of the proxy's CPU a request,
// where the head refuses more than maxInvalidNames. So does the trailer
// now: more are a 400 bad_request_body, as a trailer field the proxy
// sets is.
func TestTrailerNamesWithSpaceBounded(t *testing.T) {
	h := newHarness(t)
	var got atomic.Value
	port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		got.Store(fmt.Sprintf("%s %d %q", body, len(r.Trailer), r.Trailer.Get("X-Kept")))
		io.WriteString(w, "ok")
	}))
	host := h.route("trailerspace", port)
	resp, body := rawRequest(t, h.addr, chunkedWithTrailer(host, namesWithSpace(maxInvalidNames)+"X-Kept: 1\r\n"))
	if resp.StatusCode != 200 || body != "ok" {
		t.Fatalf("%d names with a space: %d %s, want 200", maxInvalidNames, resp.StatusCode, body)
	}
	if s, _ := got.Load().(string); s != `abc 1 "1"` {
		t.Errorf("%d names with a space: the sandbox got %s, want the body and X-Kept alone in the trailer", maxInvalidNames, s)
	}
	for _, n := range []int{maxInvalidNames + 1, 2000} {
		resp, body := rawRequest(t, h.addr, chunkedWithTrailer(host, namesWithSpace(n)))
		checkProxyError(t, resp, body, 400, CodeBadBody)
	}
}

// A chunked body's trailer is parsed into the request's header, as its
// head is, and fasthttp keeps the parsed lines (≈ 100 bytes each) with the
// connection: 200 connections
// idle after a chunked upload whose trailer held 6,000 "a:b" lines (30 KB,
// under client.max_header_size, which bounds a trailer as it bounds a
// head, in bytes) held ≈ 530 KiB each against GOMEMLIMIT, where the head
// refuses more than maxHeaderLines lines and lets go of more than
// keptHeadLines (headDrop). A request that carried a trailer now lets go
// of its header once answered, as one of many head lines does.
func TestManyTrailerLinesHoldNoMemory(t *testing.T) {
	const conns = 200
	h, host, kib, allowed := headLinesMemoryCase(t, conns)
	rl := listen(t, "127.0.0.1:0")
	go h.server.ServeRedirect(rl, "8443")
	lines := strings.Repeat("a:b\r\n", 6000)
	for _, tc := range []struct {
		name    string
		addr    string
		host    string
		trailer string
	}{
		{"6,000 lines", h.addr, host, lines},
		// Every line deleted (stripTrailerFields): the trailer is empty
		// when answered, its storage kept all the same.
		{"1,000 lines the proxy deletes", h.addr, host, strings.Repeat(auth.HeaderCubeTrafficToken+":b\r\n", 1000)},
		{"6,000 lines, redirect listener", rl.Addr().String(), host, lines},
		{"6,000 lines, admin listener", h.admin, "127.0.0.1", lines},
	} {
		t.Run(tc.name, func(t *testing.T) {
			testenv.WaitFor(t, 10*time.Second, "earlier connections closed", func() bool { return h.proxy.held.len() == 0 })
			before := limitCounted()
			answeredConns(t, tc.addr, chunkedWithTrailer(tc.host, tc.trailer), conns, func(resp *http.Response) {
				if resp.Close {
					t.Fatalf("got %d with the connection closed, want it kept", resp.StatusCode)
				}
			})
			per := (int64(limitCounted()) - int64(before)) / conns
			t.Logf("%d bytes counted per connection", per)
			if per > allowed {
				t.Errorf("a connection holds %.0f KiB against GOMEMLIMIT after a trailer of %d bytes, over the README's %d KiB for the heads the proxy takes",
					float64(per)/1024, len(tc.trailer), kib)
			}
		})
	}
}

// TestTrailerOfManyNamesCostsLinearly checks that keeping a chunked body's
// trailer lines in order costs time linear in its names: each name's
// lines were looked up with a walk over the whole trailer, and a 64 KiB
// trailer of 8,000 names cost ≈ 0.2 s of CPU a request. The cost of 16
// times the names is compared (best of three each), not timed: linear is
// ≈ 16 times, quadratic ≈ 256. The cost is the CPU time of the thread
// that does the work (threadCPU): wall time, on a machine loaded by the
// race run, once made 16 times 180.
func TestTrailerOfManyNamesCostsLinearly(t *testing.T) {
	cost := func(names int) time.Duration {
		var b strings.Builder
		b.WriteString("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n")
		for i := range names {
			fmt.Fprintf(&b, "a%d: b\r\n", i)
		}
		b.WriteString("X_Real_IP: 1\r\n\r\n") // one field to drop
		best := time.Duration(1 << 62)
		for range 3 {
			var req fasthttp.Request
			if err := req.Read(bufio.NewReaderSize(strings.NewReader(b.String()), 1<<20)); err != nil {
				t.Fatal(err)
			}
			var err error
			d := threadCPU(t, func() { err = stripTrailerFields(&req.Header, nil) })
			if err != nil {
				t.Fatal(err)
			}
			best = min(best, d)
		}
		return best
	}
	small, large := cost(500), cost(8000)
	if large > 64*small {
		t.Fatalf("a trailer of 8,000 names took %v, of 500 %v: %.0f times, want linear (≈ 16)", large, small, float64(large)/float64(small))
	}
}

// A trailer field the head has too keeps the head's line: its lines are
// counted over both, so the trailer's are not put back in order, and the
// head's line is left where it was, not deleted with them.
func TestTrailerFieldAlsoInTheHeadKeepsTheHeadsLine(t *testing.T) {
	raw := "POST / HTTP/1.1\r\nHost: a\r\nX-A: head\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n" +
		"X-A: t1\r\nX_Real_IP: 1\r\nX-A: t2\r\nX-B: 1\r\n\r\n"
	var req fasthttp.Request
	if err := req.Read(bufio.NewReader(strings.NewReader(raw))); err != nil {
		t.Fatal(err)
	}
	if err := stripTrailerFields(&req.Header, nil); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, v := range req.Header.PeekAll("X-A") {
		got = append(got, string(v))
	}
	if !slices.Contains(got, "head") || len(got) != 3 {
		t.Errorf("X-A lines after the trailer's strip: %q, want the head's and the trailer's two", got)
	}
	if v := req.Header.PeekAll("X_Real_IP"); len(v) != 0 {
		t.Errorf("X_Real_IP kept: %q", v)
	}
}
