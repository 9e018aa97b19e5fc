package proxy

import (
	"bufio"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// The platform proxy's own families count the sandbox's envd calls as it
// does: a /process.Process/ stream is in flight while it streams (proved
// with the sandbox holding it open until the client has its first chunk),
// then counted by method and result; /files too, by host or by path; a
// DELETE is in flight but never counted; other paths not at all.
func TestEnvdMetricsThroughTheProxy(t *testing.T) {
	tel := obsTelemetry(t, nil)
	h := newHarness(t, func(o *harnessOpts) { o.cfg.Telemetry = tel })
	admin := obsMetricsAdmin(t, h, tel)
	release := make(chan struct{})
	port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/process.Process/Start":
			w.Header().Set("Content-Type", "application/connect+json")
			io.WriteString(w, "first\n")
			w.(http.Flusher).Flush()
			<-release
			io.WriteString(w, "exit\n")
		case "/files":
			if r.Method == "GET" {
				w.WriteHeader(404)
			}
		}
	}))
	host := h.route("envdbox", port)
	exec := map[string]string{"route": "sandbox_exec"}
	files := map[string]string{"route": "sandbox_files"}
	before := scrapeMetrics(t, admin)

	resp := h.do(h.req("POST", host, "/process.Process/Start", strings.NewReader("{}")))
	line, err := bufio.NewReader(resp.Body).ReadString('\n')
	if err != nil || line != "first\n" {
		t.Fatalf("first chunk: %q %v", line, err)
	}
	for _, b := range checkDeltas(before, scrapeMetrics(t, admin), []metricDelta{
		{"cube_proxy_inflight_requests", exec, 1},
		{"cube_proxy_request_total", exec, 0},
	}) {
		t.Errorf("while the stream is open: %s", b)
	}
	close(release)
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()

	if st, _, _ := h.get(h.addr, "/sandbox/envdbox/"+itoa(port)+"/files?path=/x"); st != 404 {
		t.Fatalf("GET /files by path: %d", st)
	}
	resp = h.do(h.req("DELETE", host, "/files", nil))
	resp.Body.Close()
	if st, _, _ := h.get(host, "/other"); st != 200 {
		t.Fatalf("GET /other: %d", st)
	}

	waitMetrics(t, admin, before, []metricDelta{
		{"cube_proxy_inflight_requests", exec, 0},
		{"cube_proxy_inflight_requests", files, 0},
		{"cube_proxy_request_total", map[string]string{"route": "sandbox_exec", "method": "POST", "result": "success"}, 1},
		{"cube_proxy_request_total", map[string]string{"route": "sandbox_files", "method": "GET", "result": "fail"}, 1},
		{"cube_proxy_request_total", files, 1}, // the DELETE is not counted
		{"cube_proxy_request_total", nil, 2},   // nor /other
		{"cube_proxy_request_duration_seconds_count", map[string]string{"route": "sandbox_exec", "method": "POST", "result": "success"}, 1},
	})
}

// waitMetrics waits until every delta since before holds: a stream's end
// is counted when the proxy sees it end, just after its client did.
func waitMetrics(t *testing.T, admin string, before []promSample, want []metricDelta) {
	t.Helper()
	testenv.Eventually(t, 5*time.Second, func() error {
		if bad := checkDeltas(before, scrapeMetrics(t, admin), want); len(bad) > 0 {
			return errors.New(strings.Join(bad, "; "))
		}
		return nil
	})
}

// An envd call counted in flight is brought down once whatever way it
// ends: one that waits for a stream slot and is judged again (goto lookup)
// and then served, one whose client leaves while it waits (499), and an
// "Expect: 100-continue" head, judged alone first, whose request is then
// served (counted once, for the request, not for the head).
func TestEnvdInflightAfterSlotWaitsAndExpect(t *testing.T) {
	w := newSlotWaitBox(t, time.Minute)
	exec := map[string]string{"route": "sandbox_exec"}
	files := map[string]string{"route": "sandbox_files"}
	before := scrapeMetrics(t, w.admin)
	a := w.openSSE(t)

	w.abandonWait(t, "/files?path=/x")

	answer := w.send(w.h.req("GET", slotWaitHost, "/files", nil))
	w.waiting(t, answer)
	w.releaseOnce()
	if _, err := io.Copy(io.Discard, a); err != nil {
		t.Fatal(err)
	}
	if b := <-answer; b.err != nil || b.status != 200 {
		t.Fatalf("GET /files after its wait: %d %v", b.status, b.err)
	}

	c := dialRaw(t, w.h.addr)
	io.WriteString(c, "POST /process.Process/Start HTTP/1.1\r\nHost: "+slotWaitHost+"\r\nContent-Length: 2\r\nExpect: 100-continue\r\n\r\n")
	br := bufio.NewReader(c)
	if line, err := br.ReadString('\n'); err != nil || !strings.HasPrefix(line, "HTTP/1.1 100") {
		t.Fatalf("Expect head: %q %v", line, err)
	}
	if line, err := br.ReadString('\n'); err != nil || line != "\r\n" {
		t.Fatalf("after the 100: %q %v", line, err)
	}
	io.WriteString(c, "{}")
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("the request after its 100: %v %v", resp, err)
	}
	io.Copy(io.Discard, resp.Body)
	c.Close()

	waitMetrics(t, w.admin, before, []metricDelta{
		{"cube_proxy_inflight_requests", files, 0},
		{"cube_proxy_inflight_requests", exec, 0},
		{"cube_proxy_request_total", map[string]string{"route": "sandbox_files", "method": "GET", "result": "success"}, 1},
		{"cube_proxy_request_total", map[string]string{"route": "sandbox_files", "method": "GET", "result": "fail"}, 1}, // the 499
		{"cube_proxy_request_total", map[string]string{"route": "sandbox_exec", "method": "POST", "result": "success"}, 1},
	})
}

// An envd upload refused from its "Expect: 100-continue" head (curl sends
// one with a body over 1 MiB: a file upload to /files) is counted as the
// same request refused without it is, a fail of its route and method: the
// platform proxy counts every request it answers, and earlier builds
// counted these nowhere, so a dashboard of failed uploads missed them.
func TestEnvdCountsExpectRefusals(t *testing.T) {
	tel := obsTelemetry(t, nil)
	h := newHarness(t, func(o *harnessOpts) {
		o.cfg.Telemetry = tel
		o.cfg.MaxRequestBodySize = 1 << 10
	})
	admin := obsMetricsAdmin(t, h, tel)
	port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	public := h.route("envdexpect", port)
	h.put("envdexpectpriv", map[string]string{
		"HostIP": "127.0.0.1", "CreatedAt": "1", itoa(port): itoa(port),
		"AllowPublicTraffic": "false", "TrafficAccessToken": strings.Repeat("ab", 32),
	})
	private := itoa(port) + "-envdexpectpriv.cube.test"
	before := scrapeMetrics(t, admin)
	for _, tc := range []struct {
		name, host, path, length string
		status                   int
	}{
		{"no token", private, "/files?path=/x", "5", 403},
		{"too large", public, "/files", "4096", 413},
		{"unknown sandbox", "49999-envdexpectmissing.cube.test", "/process.Process/Start", "2", 404},
	} {
		c := dialRaw(t, h.addr)
		io.WriteString(c, "POST "+tc.path+" HTTP/1.1\r\nHost: "+tc.host+"\r\nContent-Length: "+tc.length+"\r\nExpect: 100-continue\r\n\r\n")
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil || resp.StatusCode != tc.status {
			t.Fatalf("%s: %v %v, want %d", tc.name, resp, err, tc.status)
		}
		c.Close()
	}
	waitMetrics(t, admin, before, []metricDelta{
		{"cube_proxy_inflight_requests", map[string]string{"route": "sandbox_files"}, 0},
		{"cube_proxy_inflight_requests", map[string]string{"route": "sandbox_exec"}, 0},
		{"cube_proxy_request_total", map[string]string{"route": "sandbox_files", "method": "POST", "result": "fail"}, 2},
		{"cube_proxy_request_total", map[string]string{"route": "sandbox_exec", "method": "POST", "result": "fail"}, 1},
		{"cube_proxy_request_duration_seconds_count", map[string]string{"route": "sandbox_files", "method": "POST", "result": "fail"}, 2},
	})
}
