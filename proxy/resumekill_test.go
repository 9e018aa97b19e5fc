package proxy

import (
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/accesslog"
	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// The control plane's word that comes during a resume call stands over
// the call's failure, for the requests waiting on it:
//
//   - a kill (meta/delete) ends them at once with the kill's 410, as it
//     ends every other request of the sandbox on its way to it. They
//     waited for the lifecycle manager's answer (up to
//     lifecycle.resume_timeout), and its failure, likely for a sandbox
//     killed meanwhile, was a 503 resume_failed, which a client retries
//     (the go-sdk keeps its session) instead of learning of the kill. The
//     cut call counts neither as resumed nor as failed.
//   - running (the control plane resumed the sandbox itself) has them
//     served when the call then fails, not answered 503.
func TestStateDuringResumeCallStands(t *testing.T) {
	const n = 3
	const resumeTimeout = 4 * time.Second
	for _, tc := range []struct {
		name   string
		change func(h *harness)
		status int
		code   string
		failed float64 // resume calls counted failed
	}{
		{"killed", func(h *harness) {
			if code, body := h.adminDo("POST", "/admin/meta/delete", `{"sandbox_id":"sleepy"}`, ""); code != 200 {
				t.Fatalf("meta/delete: %d %s", code, body)
			}
		}, 410, CodeSandboxKilled, 0},
		{"running", func(h *harness) { h.setSandboxState("sleepy", "running") }, 200, "", 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			release := make(chan struct{})
			called := make(chan struct{}, 1)
			sc := newFakeSidecar(t, func() int {
				called <- struct{}{}
				select {
				case <-release:
				case <-time.After(2 * resumeTimeout):
				}
				return 500
			})
			h, host, admin := resumeMetrics(t, sc, resumeTimeout)
			var joined atomic.Int32
			h.proxy.resumer.beforeWait = func() { joined.Add(1) }
			h.setSandboxState("sleepy", "paused")
			before := scrapeMetrics(t, admin)

			answers := make(chan answer, n)
			for range n {
				h.getAsync(host, answers)
			}
			select {
			case <-called:
			case <-time.After(5 * time.Second):
				t.Fatal("no resume call")
			}
			for deadline := time.Now().Add(5 * time.Second); joined.Load() < n-1; {
				if time.Now().After(deadline) {
					t.Fatalf("%d requests joined the resume call, want %d", joined.Load(), n-1)
				}
				time.Sleep(time.Millisecond)
			}
			tc.change(h)
			changed := time.Now()
			if tc.code == "" {
				close(release) // the call fails now
			}
			for range n {
				a := <-answers
				if a.status != tc.status || tc.code != "" && errorCode(t, a.body) != tc.code {
					t.Errorf("a request waiting on the resume call: %d %s, want %d %s", a.status, a.body, tc.status, tc.code)
				}
			}
			if took := time.Since(changed); took > resumeTimeout/2 {
				t.Errorf("answered %v after the change: the requests waited for the resume call", took)
			}
			checkResumes(t, admin, before, 0, tc.failed)
		})
	}
}

// A redirect from the lifecycle manager is not followed: it is an answer
// other than 200, a failed resume (503 resume_failed), as with the
// platform's proxy. Followed (net/http's default), a 302 to a page that
// answers 200, or a trailing-slash redirect of a mux, counted the sandbox
// resumed and sent the request to a sandbox still paused.
func TestResumeRedirectIsAFailure(t *testing.T) {
	for _, code := range []int{301, 302, 303, 307, 308} {
		t.Run(strconv.Itoa(code), func(t *testing.T) {
			var resumes, followed atomic.Int32
			port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path == "/internal/resume" {
					resumes.Add(1)
					http.Redirect(w, r, "/elsewhere", code)
					return
				}
				followed.Add(1)
				w.WriteHeader(200)
			}))
			sc := &fakeSidecar{addr: "127.0.0.1:" + itoa(port)}
			h, host, admin := resumeMetrics(t, sc, time.Second)
			h.setSandboxState("sleepy", "paused")
			before := scrapeMetrics(t, admin)
			st, body, _ := h.get(host, "/")
			if st != 503 || errorCode(t, body) != CodeResumeFailed {
				t.Errorf("resume answered %d: %d %s, want 503 resume_failed", code, st, body)
			}
			if resumes.Load() != 1 || followed.Load() != 0 {
				t.Errorf("%d resume calls, %d redirects followed; want 1 and 0", resumes.Load(), followed.Load())
			}
			checkResumes(t, admin, before, 0, 1)
		})
	}
}

// A client that closes its connection while its request waits on the
// sandbox's resume call is not sent on to the sandbox once the call ends:
// nobody reads the answer, and a command or tool call it carried (which
// the client, having given up, may send again) would run in the sandbox
// all the same. It is logged 499 client_closed_request, as a request whose
// client left during a wait for a slot. The resume itself goes on: it is
// the sandbox's, and counts.
func TestResumeWaitClientGoneIsNotForwarded(t *testing.T) {
	// Over TLS the client's close_notify comes before its FIN, and a peek
	// at the socket reads it as data (clientLeft).
	for _, useTLS := range []bool{false, true} {
		t.Run(map[bool]string{false: "http", true: "https"}[useTLS], func(t *testing.T) {
			release := make(chan struct{})
			called := make(chan struct{}, 1)
			sc := newFakeSidecar(t, func() int {
				called <- struct{}{}
				<-release
				return 200
			})
			var reached atomic.Int32
			h, buf := logHarness(t, accesslog.FormatJSON, func(o *harnessOpts) {
				o.cfg.ResumeAddr = sc.addr
				o.cfg.ResumeTimeout = time.Minute
			})
			host := h.route("sleepy", backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				reached.Add(1)
				io.WriteString(w, "ran")
			})))
			h.setSandboxState("sleepy", "paused")
			var c net.Conn = dialRaw(t, h.addr)
			if useTLS {
				addr, roots := serveTLS(t, h)
				c = tls.Client(dialRaw(t, addr), &tls.Config{RootCAs: roots, ServerName: host})
			}
			io.WriteString(c, "POST /run HTTP/1.1\r\nHost: "+host+"\r\nX-Cube-Request-Id: gone-during-resume\r\nContent-Length: 5\r\n\r\nrm -r")
			testenv.Recv(t, called, 5*time.Second, "the resume call")
			c.Close()
			close(release)
			testenv.WaitFor(t, 10*time.Second, "the request's access-log line", func() bool {
				return strings.Contains(buf.String(), `"x_cube_request_id":"gone-during-resume"`)
			})
			if n := reached.Load(); n != 0 {
				t.Errorf("the sandbox got %d requests whose client had left during the resume, want 0", n)
			}
			if line := buf.String(); !strings.Contains(line, `"status":499`) || !strings.Contains(line, CodeClientClosed) {
				t.Errorf("access log %s, want status 499 %s", line, CodeClientClosed)
			}
			// The sandbox was resumed: the next request is served without a call.
			if st, body, _ := h.get(host, "/"); st != 200 || body != "ran" || len(sc.seen()) != 1 {
				t.Errorf("after the resume: %d %q with %d calls, want 200 ran and 1", st, body, len(sc.seen()))
			}
		})
	}
}

// A request that waited on its sandbox's resume goes where the route says
// once the sandbox is resumed, not to the address it read before the
// call: a sandbox restored from its snapshot may come back on another node
// or with another address, which the lifecycle manager stores (and
// announces) before it answers, and the old address may by then be
// another sandbox's. As after a wait for a slot or a held body's read, the
// route is looked up again after the wait (up to
// lifecycle.resume_timeout).
func TestResumedSandboxIsServedAtItsNewAddress(t *testing.T) {
	var h *harness
	var moved atomic.Bool
	var newPort uint16
	sc := newFakeSidecar(t, func() int {
		// The lifecycle manager restores the sandbox elsewhere and
		// stores its new route before it answers.
		h.put("sleepy", map[string]string{
			"HostIP": "127.0.0.1", "SandboxIP": "127.0.0.1", "CreatedAt": "1",
			itoa(oldPortForMove): itoa(newPort),
		})
		moved.Store(true)
		return 200
	})
	h = newHarness(t, func(o *harnessOpts) {
		o.cfg.ResumeAddr = sc.addr
		o.cfg.NodeIP = netip.MustParseAddr("127.0.0.2") // dial HostIP:<mapped port>
	})
	newPort = backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "new") }))
	oldPort := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "old") }))
	h.put("sleepy", map[string]string{
		"HostIP": "127.0.0.1", "SandboxIP": "127.0.0.1", "CreatedAt": "1",
		itoa(oldPortForMove): itoa(oldPort),
	})
	host := itoa(oldPortForMove) + "-sleepy.cube.test"
	h.setSandboxState("sleepy", "paused")
	st, body, _ := h.get(host, "/")
	if !moved.Load() {
		t.Fatal("no resume call")
	}
	if st != 200 || body != "new" {
		t.Errorf("after a resume that moved the sandbox: %d %q, want 200 from its new address", st, body)
	}
}

// oldPortForMove is the container port of TestResumedSandboxIsServedAtItsNewAddress.
const oldPortForMove = 8080

// The lifecycle manager's status is the resume's outcome: a body it then
// leaves unfinished does not hold the requests waiting on the call. They
// waited for the body until the call's whole timeout (2 s and
// lifecycle.resume_timeout), and were then served (or refused) anyway.
func TestResumeOutcomeIsTheStatus(t *testing.T) {
	const resumeTimeout = 4 * time.Second
	for _, tc := range []struct {
		status int
		want   int
	}{{200, 200}, {500, 503}} {
		t.Run(strconv.Itoa(tc.status), func(t *testing.T) {
			hang := make(chan struct{})
			t.Cleanup(func() { close(hang) })
			port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Length", "100")
				w.WriteHeader(tc.status)
				io.WriteString(w, `{"ok":`)
				w.(http.Flusher).Flush()
				<-hang
			}))
			h, host := resumeHarness(t, &fakeSidecar{addr: "127.0.0.1:" + itoa(port)}, resumeTimeout)
			h.setSandboxState("sleepy", "paused")
			start := time.Now()
			st, body, _ := h.get(host, "/")
			if took := time.Since(start); took > resumeTimeout/2 {
				t.Errorf("answered %v after the request: the resume waited for the lifecycle manager's body", took)
			}
			if st != tc.want {
				t.Errorf("lifecycle manager answered %d: %d %s, want %d", tc.status, st, body, tc.want)
			}
		})
	}
}
