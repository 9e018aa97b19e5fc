package proxy

import (
	"encoding/json"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// resumeCallSeen is one call the fake lifecycle manager received.
type resumeCallSeen struct {
	method, path, sandboxID, requestID, contentLength string
	body                                              int
	rawQuery                                          string // as sent: the README shows its order
}

// fakeSidecar is a real HTTP server standing in for the lifecycle
// manager's POST /internal/resume; answer decides each call's status.
type fakeSidecar struct {
	addr   string
	mu     sync.Mutex
	calls  []resumeCallSeen
	answer func() int
}

func newFakeSidecar(t *testing.T, answer func() int) *fakeSidecar {
	t.Helper()
	f := &fakeSidecar{answer: answer}
	port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		q := r.URL.Query()
		f.mu.Lock()
		f.calls = append(f.calls, resumeCallSeen{r.Method, r.URL.Path, q.Get("sandbox_id"), q.Get("request_id"), r.Header.Get("Content-Length"), len(b), r.URL.RawQuery})
		f.mu.Unlock()
		w.WriteHeader(f.answer())
	}))
	f.addr = "127.0.0.1:" + itoa(port)
	return f
}

func (f *fakeSidecar) seen() []resumeCallSeen {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]resumeCallSeen(nil), f.calls...)
}

func ok200() int { return 200 }

// resumeHarness is a proxy whose lifecycle.sidecar_addr is sc, with a
// backend answering 200 "up" behind the route of id; more adjust its
// options further.
func resumeHarness(t *testing.T, sc *fakeSidecar, timeout time.Duration, more ...func(*harnessOpts)) (*harness, string) {
	t.Helper()
	h := newHarness(t, func(o *harnessOpts) {
		if sc != nil {
			o.cfg.ResumeAddr = sc.addr
		}
		o.cfg.ResumeTimeout = timeout
		for _, f := range more {
			f(o)
		}
	})
	port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "up") }))
	return h, h.route("sleepy", port)
}

// resumeMetrics is resumeHarness with metrics, served on the admin
// address it returns as well.
func resumeMetrics(t *testing.T, sc *fakeSidecar, timeout time.Duration) (h *harness, host, admin string) {
	t.Helper()
	tel := obsTelemetry(t, nil)
	h, host = resumeHarness(t, sc, timeout, func(o *harnessOpts) { o.cfg.Telemetry = tel })
	return h, host, obsMetricsAdmin(t, h, tel)
}

// checkResumes checks what cubeproxy_sandbox_resumes_total moved by since
// before: resumed and failed calls.
func checkResumes(t *testing.T, admin string, before []promSample, resumed, failed float64) {
	t.Helper()
	for _, b := range checkDeltas(before, scrapeMetrics(t, admin), []metricDelta{
		{"cubeproxy_sandbox_resumes_total", map[string]string{"outcome": "resumed"}, resumed},
		{"cubeproxy_sandbox_resumes_total", map[string]string{"outcome": "failed"}, failed},
	}) {
		t.Error(b)
	}
}

func (h *harness) setSandboxState(id, st string) {
	h.t.Helper()
	if code, body := h.adminDo("POST", "/admin/state", `{"sandbox_id":"`+id+`","state":"`+st+`"}`, ""); code != 200 {
		h.t.Fatalf("/admin/state %s: %d %s", st, code, body)
	}
}

// errorCode returns the code of a JSON error body.
func errorCode(t *testing.T, body string) string {
	t.Helper()
	var e struct{ Code string }
	if err := json.Unmarshal([]byte(body), &e); err != nil {
		t.Fatalf("error body %q: %v", body, err)
	}
	return e.Code
}

// A request to a paused sandbox has the lifecycle manager resume it (POST
// /internal/resume, the sandbox's id and the request's id, no body) and
// is then served; the sandbox is running from there, so the next request
// makes no call. The call counts as resumed.
func TestResumePausedSandboxIsServed(t *testing.T) {
	sc := newFakeSidecar(t, ok200)
	h, host, admin := resumeMetrics(t, sc, 0)
	h.setSandboxState("sleepy", "paused")
	before := scrapeMetrics(t, admin)

	r := h.req("POST", host, "/run", nil)
	r.Header.Set("X-Cube-Request-Id", "rid-42")
	resp := h.do(r)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(b) != "up" {
		t.Fatalf("paused sandbox with resume on: %d %q, want 200 from the backend", resp.StatusCode, b)
	}
	// The query in the order the README and the platform's proxy write
	// it, sandbox_id first: the lifecycle manager's own logs show it so.
	want := resumeCallSeen{"POST", "/internal/resume", "sleepy", "rid-42", "0", 0, "sandbox_id=sleepy&request_id=rid-42"}
	if got := sc.seen(); len(got) != 1 || got[0] != want {
		t.Fatalf("lifecycle manager saw %+v, want one call %+v", got, want)
	}
	if st, _, _ := h.get(host, "/"); st != 200 {
		t.Fatalf("next request: %d", st)
	}
	if n := len(sc.seen()); n != 1 {
		t.Errorf("%d resume calls after a second request, want 1: the resumed sandbox is running", n)
	}
	checkResumes(t, admin, before, 1, 0)
}

// Requests that arrive together for one paused sandbox make one resume
// call and all wait for it; the metric counts that one call.
func TestResumeConcurrentRequestsMakeOneCall(t *testing.T) {
	const n = 8
	release := make(chan struct{})
	sc := newFakeSidecar(t, func() int { <-release; return 200 })
	h, host, admin := resumeMetrics(t, sc, 0)
	var joined atomic.Int32
	h.proxy.resumer.beforeWait = func() { joined.Add(1) }
	h.setSandboxState("sleepy", "paused")
	before := scrapeMetrics(t, admin)

	codes := make(chan int, n)
	for range n {
		go func() {
			resp, err := h.client.Do(h.req("GET", host, "/", nil))
			if err != nil {
				codes <- 0
				return
			}
			resp.Body.Close()
			codes <- resp.StatusCode
		}()
	}
	// Every request but the caller's joins the call in flight.
	for deadline := time.Now().Add(10 * time.Second); joined.Load() < n-1; {
		if time.Now().After(deadline) {
			close(release)
			t.Fatalf("%d requests joined the resume call, want %d", joined.Load(), n-1)
		}
		time.Sleep(time.Millisecond)
	}
	close(release)
	for range n {
		if c := <-codes; c != 200 {
			t.Errorf("a request during the resume: %d, want 200", c)
		}
	}
	if got := len(sc.seen()); got != 1 {
		t.Errorf("%d resume calls for %d concurrent requests, want 1", got, n)
	}
	checkResumes(t, admin, before, 1, 0)
}

// A resume that fails (an error status, no answer in time, no lifecycle
// manager listening) is a 503 resume_failed with Retry-After 5, within
// the configured timeout, and the sandbox stays paused: the next request
// asks again. Each call counts as failed.
func TestResumeFailedIs503(t *testing.T) {
	hang := make(chan struct{})
	t.Cleanup(func() { close(hang) })
	for _, tc := range []struct {
		name   string
		answer func() int
		closed bool // the address refuses connections
	}{
		{"status 500", func() int { return 500 }, false},
		{"no answer", func() int { <-hang; return 200 }, false},
		{"refused", nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sc := &fakeSidecar{addr: "127.0.0.1:" + itoa(closedPort(t))}
			if !tc.closed {
				sc = newFakeSidecar(t, tc.answer)
			}
			h, host, admin := resumeMetrics(t, sc, 300*time.Millisecond)
			h.setSandboxState("sleepy", "paused")
			before := scrapeMetrics(t, admin)
			for i := range 2 {
				start := time.Now()
				st, body, hdr := h.get(host, "/")
				if took := time.Since(start); took > 5*time.Second {
					t.Errorf("answered after %v: the resume call is not bounded by its timeout", took)
				}
				if st != 503 || errorCode(t, body) != CodeResumeFailed || hdr.Get("Retry-After") != "5" {
					t.Fatalf("request %d: %d %s Retry-After %q, want 503 resume_failed Retry-After 5", i, st, body, hdr.Get("Retry-After"))
				}
			}
			if !tc.closed {
				if n := len(sc.seen()); n != 2 {
					t.Errorf("%d resume calls for 2 requests, want 2: a failed resume leaves the sandbox paused", n)
				}
			}
			checkResumes(t, admin, before, 0, 2)
		})
	}
}

// closedPort returns a loopback port nothing listens on.
func closedPort(t *testing.T) uint16 {
	ln := listen(t, "127.0.0.1:0")
	port := uint16(ln.Addr().(*net.TCPAddr).Port)
	ln.Close()
	return port
}

// A pausing sandbox is not resumed (that would race the pause): 503
// sandbox_pausing and no call; once paused, the same sandbox is resumed.
func TestResumeNotWhilePausing(t *testing.T) {
	sc := newFakeSidecar(t, ok200)
	h, host := resumeHarness(t, sc, 0)
	h.setSandboxState("sleepy", "pausing")
	if st, body, _ := h.get(host, "/"); st != 503 || errorCode(t, body) != CodeSandboxPausing {
		t.Fatalf("pausing: %d %s, want 503 sandbox_pausing", st, body)
	}
	if n := len(sc.seen()); n != 0 {
		t.Fatalf("%d resume calls for a pausing sandbox, want 0", n)
	}
	h.setSandboxState("sleepy", "paused")
	if st, body, _ := h.get(host, "/"); st != 200 || len(sc.seen()) != 1 {
		t.Fatalf("paused: %d %s with %d resume calls, want 200 and 1", st, body, len(sc.seen()))
	}
}

// The traffic token is checked before the resume: a request without it
// wakes no sandbox (403, no call); one with it does.
func TestResumeAfterAuthorization(t *testing.T) {
	sc := newFakeSidecar(t, ok200)
	h, _ := resumeHarness(t, sc, 0)
	tok := "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "up") }))
	h.put("locked", map[string]string{"HostIP": "127.0.0.1", "SandboxIP": "127.0.0.1", "CreatedAt": "1",
		"AllowPublicTraffic": "false", "TrafficAccessToken": tok, itoa(port): itoa(port)})
	host := itoa(port) + "-locked.cube.test"
	h.setSandboxState("locked", "paused")

	for _, wrong := range []string{"", "f" + tok[1:]} {
		r := h.req("GET", host, "/", nil)
		if wrong != "" {
			r.Header.Set("e2b-traffic-access-token", wrong)
		}
		resp := h.do(r)
		resp.Body.Close()
		if resp.StatusCode != 403 {
			t.Fatalf("token %q: %d, want 403", wrong, resp.StatusCode)
		}
	}
	if n := len(sc.seen()); n != 0 {
		t.Fatalf("%d resume calls for unauthorized requests, want 0", n)
	}
	r := h.req("GET", host, "/", nil)
	r.Header.Set("e2b-traffic-access-token", tok)
	resp := h.do(r)
	resp.Body.Close()
	if resp.StatusCode != 200 || len(sc.seen()) != 1 {
		t.Fatalf("authorized: %d with %d resume calls, want 200 and 1", resp.StatusCode, len(sc.seen()))
	}
}

// Without lifecycle.sidecar_addr (the default) nothing is dialed: a
// paused sandbox is today's 503 sandbox_pausing, for the control plane to
// resume.
func TestResumeOffByDefaultPaused503(t *testing.T) {
	h, host := resumeHarness(t, nil, 0)
	h.setSandboxState("sleepy", "paused")
	st, body, hdr := h.get(host, "/")
	if st != 503 || errorCode(t, body) != CodeSandboxPausing || hdr.Get("Retry-After") != "1" {
		t.Fatalf("paused, resume off: %d %s Retry-After %q, want 503 sandbox_pausing Retry-After 1", st, body, hdr.Get("Retry-After"))
	}
	if h.proxy.resumer != nil {
		t.Error("a resumer with no sidecar address")
	}
}
