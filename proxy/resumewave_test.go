package proxy

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// A request that found the sandbox paused just before the resume call in
// flight ended, and reaches the resumer just after, makes no second call:
// the call it would have joined has marked the sandbox running, and the
// request is served. Earlier builds made a call of their own (one wave of
// requests, two calls to the lifecycle manager, for a sandbox already
// running). The hook holds the second request between its look at the
// state and the resumer until the first request's answer is read.
func TestResumeNoSecondCallAfterTheWave(t *testing.T) {
	release := make(chan struct{})
	called := make(chan struct{}, 4)
	sc := newFakeSidecar(t, func() int {
		called <- struct{}{}
		<-release
		return 200
	})
	h, host, admin := resumeMetrics(t, sc, 0)
	held := make(chan struct{}, 1)
	letGo := make(chan struct{})
	t.Cleanup(func() {
		select {
		case <-letGo:
		default:
			close(letGo)
		}
		select {
		case <-release:
		default:
			close(release)
		}
	})
	var arrived atomic.Int32
	h.proxy.resumer.beforeResume = func() {
		if arrived.Add(1) == 2 {
			held <- struct{}{}
			<-letGo
		}
	}
	h.setSandboxState("sleepy", "paused")
	before := scrapeMetrics(t, admin)

	answers := make(chan answer, 2)
	for range 2 {
		h.getAsync(host, answers)
	}
	testenv.Recv(t, called, 10*time.Second, "the first request's resume call")
	testenv.Recv(t, held, 10*time.Second, "the second request at the resumer")
	close(release)
	// Only the first request can answer: the second is held.
	if a := testenv.Recv(t, answers, 10*time.Second, "the first answer"); a.status != 200 {
		t.Fatalf("the request that made the call: %d %s, want 200", a.status, a.body)
	}
	close(letGo)
	if a := testenv.Recv(t, answers, 10*time.Second, "the second answer"); a.status != 200 {
		t.Fatalf("the request that came at the call's end: %d %s, want 200", a.status, a.body)
	}
	if n := len(sc.seen()); n != 1 {
		t.Errorf("%d resume calls for one wave of requests, want 1: the sandbox was running when the second came", n)
	}
	checkResumes(t, admin, before, 1, 0)
}

// A request the proxy refuses whatever the sandbox's state wakes no paused
// sandbox: a port the route does not expose (404 port_not_mapped, as when
// running) and a declared body over max_request_body (413, also to an
// Expect: 100-continue head) get their answer without a resume call.
// Earlier builds had the lifecycle manager restore the VM first, and a
// scanner trying ports of a paused sandbox's name woke it with each
// refusal the reaper had paused it since. A request it can serve then
// resumes it as ever.
func TestResumeNotForARequestRefusedAnyway(t *testing.T) {
	sc := newFakeSidecar(t, ok200)
	h, host := resumeHarness(t, sc, 0, func(o *harnessOpts) { o.cfg.MaxRequestBodySize = 64 })
	h.setSandboxState("sleepy", "paused")
	mapped, _, _ := strings.Cut(host, "-")
	for _, tc := range []struct {
		name   string
		raw    string
		status int
		code   string
	}{
		{"port not mapped", "GET / HTTP/1.1\r\nHost: 9-sleepy.cube.test\r\n\r\n", 404, CodePortNotMapped},
		{"body too large", "POST / HTTP/1.1\r\nHost: " + host + "\r\nContent-Length: 100\r\n\r\n" + strings.Repeat("x", 100), 413, CodeBodyTooLarge},
		{"Expect, body too large", "POST / HTTP/1.1\r\nHost: " + host + "\r\nContent-Length: 100\r\nExpect: 100-continue\r\n\r\n", 413, CodeBodyTooLarge},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h.setSandboxState("sleepy", "paused")
			c, err := net.DialTimeout("tcp", h.addr, 5*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(10 * time.Second))
			if _, err := io.WriteString(c, tc.raw); err != nil {
				t.Fatal(err)
			}
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Fatalf("%q: %v", tc.raw, err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tc.status || errorCode(t, string(b)) != tc.code {
				t.Errorf("paused sandbox: %d %s, want %d %s", resp.StatusCode, b, tc.status, tc.code)
			}
			if n := len(sc.seen()); n != 0 {
				t.Errorf("%d resume calls for a request refused %d, want 0", n, tc.status)
			}
		})
	}
	if st, body, _ := h.get(host, "/"); st != 200 || len(sc.seen()) != 1 {
		t.Fatalf("a request for port %s of the paused sandbox: %d %s with %d resume calls, want 200 and 1", mapped, st, body, len(sc.seen()))
	}
}

// A state the control plane sets between a request's look at the paused
// sandbox and its resume call stands, and no call is made: a kill is the
// 410 (earlier builds asked the lifecycle manager to restore the killed
// sandbox, the kill having found no call to cut, and answered only once
// it had failed), pausing the 503, running the sandbox served.
func TestResumeNotAfterAStateChangeAtTheResumer(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(h *harness)
		status int
		code   string
	}{
		{"killed", func(h *harness) {
			if code, body := h.adminDo("POST", "/admin/meta/delete", `{"sandbox_id":"sleepy"}`, ""); code != 200 {
				t.Fatalf("meta/delete: %d %s", code, body)
			}
		}, 410, CodeSandboxKilled},
		{"pausing", func(h *harness) { h.setSandboxState("sleepy", "pausing") }, 503, CodeSandboxPausing},
		{"running", func(h *harness) { h.setSandboxState("sleepy", "running") }, 200, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sc := newFakeSidecar(t, ok200)
			h, host := resumeHarness(t, sc, 0)
			held, letGo := make(chan struct{}, 1), make(chan struct{})
			t.Cleanup(func() {
				select {
				case <-letGo:
				default:
					close(letGo)
				}
			})
			h.proxy.resumer.beforeResume = func() {
				held <- struct{}{}
				<-letGo
			}
			h.setSandboxState("sleepy", "paused")
			answers := make(chan answer, 1)
			h.getAsync(host, answers)
			testenv.Recv(t, held, 10*time.Second, "the request at the resumer")
			tc.change(h)
			close(letGo)
			a := testenv.Recv(t, answers, 10*time.Second, "the answer")
			if a.status != tc.status || tc.code != "" && errorCode(t, a.body) != tc.code {
				t.Errorf("state %s set as the request came to resume: %d %s, want %d %s", tc.name, a.status, a.body, tc.status, tc.code)
			}
			if n := len(sc.seen()); n != 0 {
				t.Errorf("%d resume calls after the state was set %s, want 0", n, tc.name)
			}
		})
	}
}

// answer is a request's status and body (status 0 and the error's text for
// a request that got no answer).
type answer struct {
	status int
	body   string
}

// getAsync sends GET / for host from a goroutine, for a test that holds
// the request inside the proxy, and delivers its answer on answers.
func (h *harness) getAsync(host string, answers chan<- answer) {
	go func() {
		resp, err := h.client.Do(h.req("GET", host, "/", nil))
		if err != nil {
			answers <- answer{0, err.Error()}
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		answers <- answer{resp.StatusCode, string(b)}
	}()
}
