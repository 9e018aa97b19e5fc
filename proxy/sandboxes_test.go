package proxy

import (
	"io"
	"net/http"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// A request that sees a sandbox killed must also see when: serve un-kills
// a sandbox whose route is newer than the kill (a sandbox re-created
// under the same id), so a kill seen with the time of an earlier change,
// or none, would be undone by the next request of the sandbox it killed.
func TestKillIsSeenWithItsTime(t *testing.T) {
	var s sandboxes
	for i := range 2000 {
		id := "sbx" + strconv.Itoa(i)
		e := s.get([]byte(id)) // made by traffic: its state never changed
		done := make(chan struct{})
		go func() {
			s.setState(id, stateKilled)
			close(done)
		}()
		// Spin, to read the state the moment it changes, but yield now and
		// then: the writer may be waiting for this goroutine's P (one P,
		// or a P whose thread the OS does not run), and a bare spin then
		// lasts until the 10 ms preemption, every round.
		for n := 1; e.state.Load() != stateKilled; n++ {
			if n%(1<<12) == 0 {
				runtime.Gosched()
			}
		}
		if at := e.changedAt.Load(); at == 0 {
			t.Fatalf("round %d: sandbox seen killed before the time of its kill was set", i)
		}
		<-done
	}
}

// A last_active poll that finds a sandbox's request done must also find
// the time of its answer: respond, a stream's end and a tunnel's release
// store the time before lowering the count, and the poll must read them in
// the opposite order. Read the other way round, a poll that read the time
// while the request was in flight and the count once it was done reported
// the sandbox idle since the request began (here: not active since 2).
func TestLastActiveSeesTheAnswerOfADoneRequest(t *testing.T) {
	var s sandboxes
	e := new(sandboxState)
	for i := range 1000 { // one sandbox, many times: the poll reads it over and over
		s.m.Store("sbx"+strconv.Itoa(i), e)
	}
	for round := range 300 {
		e.lastActive.Store(1) // the request's start
		e.active.Store(1)
		start, done := make(chan struct{}), make(chan struct{})
		go func() {
			<-start
			e.lastActive.Store(2) // its answer
			e.active.Add(-1)
			close(done)
		}()
		close(start)
		_, got := s.appendLastActive(nil, 2, 3)
		<-done
		if got != 1000 {
			t.Fatalf("round %d: the poll lost %d of 1000 readings of a sandbox active until 2", round, 1000-got)
		}
	}
}

// sandboxCount is how many sandboxes the proxy holds state for.
func sandboxCount(p *Proxy) int {
	n := 0
	p.sandboxes.m.Range(func(any, any) bool { n++; return true })
	return n
}

// The admin API's route churn (store a sandbox, serve it, maybe pause it,
// delete it) must not leave an entry behind per sandbox: the soak test
// found the state map one entry larger for every sandbox that ever got a
// request, and a paused one is never swept, so a node whose sandboxes are
// paused and deleted grew without end. A kill's tombstone stays: the id
// answers 410 for its hour, deleted route or not.
func TestDeletedRouteForgetsSandboxState(t *testing.T) {
	h := newHarness(t)
	port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") }))
	route := `{"HostIP":"127.0.0.1","SandboxIP":"127.0.0.1","CreatedAt":"1","` + itoa(port) + `":"` + itoa(port) + `"}`
	const perCase = 40
	cases := []struct {
		name string
		// then runs after the sandbox served a request, before its route is deleted.
		then  func(id string)
		kept  bool
		after int // status of a request once the route is deleted
	}{
		{"running", func(string) {}, false, 404},
		{"paused", func(id string) { h.adminDo("POST", "/admin/state", `{"sandbox_id":"`+id+`","state":"paused"}`, "") }, false, 404},
		{"pausing", func(id string) { h.adminDo("POST", "/admin/state", `{"sandbox_id":"`+id+`","state":"pausing"}`, "") }, false, 404},
		{"killed", func(id string) { h.proxy.kill(id) }, true, 410},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := sandboxCount(h.proxy)
			for i := range perCase {
				id := "churn-" + tc.name + "-" + strconv.Itoa(i)
				host := itoa(port) + "-" + id + ".cube.test"
				if st, body := h.adminDo("PUT", "/admin/routes/"+id, route, ""); st != 200 {
					t.Fatalf("PUT %s: %d %s", id, st, body)
				}
				if st, _, _ := h.get(host, "/"); st != 200 {
					t.Fatalf("GET %s: %d", id, st)
				}
				tc.then(id)
				if st, body := h.adminDo("DELETE", "/admin/routes/"+id, "", ""); st != 200 || !strings.Contains(body, `"deleted":true`) {
					t.Fatalf("DELETE %s: %d %s", id, st, body)
				}
				if st, _, _ := h.get(host, "/"); st != tc.after {
					t.Fatalf("GET %s after DELETE: %d, want %d", id, st, tc.after)
				}
			}
			want := before
			if tc.kept {
				want += perCase
			}
			testenv.WaitFor(t, 5*time.Second, "sandbox entries back to "+strconv.Itoa(want), func() bool {
				return sandboxCount(h.proxy) == want
			})
		})
	}

	// Stored again, a deleted paused sandbox is a new one: it is served,
	// not answered 503 for the pause of the one deleted.
	id := "churn-paused-0"
	if st, body := h.adminDo("PUT", "/admin/routes/"+id, route, ""); st != 200 {
		t.Fatalf("PUT %s again: %d %s", id, st, body)
	}
	if st, _, _ := h.get(itoa(port)+"-"+id+".cube.test", "/"); st != 200 {
		t.Fatalf("GET re-created %s: %d, want 200", id, st)
	}
}

// A paused sandbox deleted while a request of its is still in flight keeps
// its entry (the request's count) but not its pause: a paused entry is
// never swept, so it would outlive the request for ever.
func TestDeletedRouteInFlightLosesItsPause(t *testing.T) {
	h := newHarness(t)
	release := make(chan struct{})
	port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		<-release
		_, _ = io.WriteString(w, "ok")
	}))
	route := `{"HostIP":"127.0.0.1","SandboxIP":"127.0.0.1","CreatedAt":"1","` + itoa(port) + `":"` + itoa(port) + `"}`
	const id = "held"
	if st, body := h.adminDo("PUT", "/admin/routes/"+id, route, ""); st != 200 {
		t.Fatalf("PUT: %d %s", st, body)
	}
	before := sandboxCount(h.proxy)
	answered := make(chan int, 1)
	go func() {
		resp, err := h.client.Do(h.req("GET", itoa(port)+"-"+id+".cube.test", "/", nil))
		if err != nil {
			answered <- 0
			return
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		answered <- resp.StatusCode
	}()
	testenv.WaitFor(t, 5*time.Second, "the request in flight", func() bool {
		sb := h.proxy.sandboxes.peek(id)
		return sb != nil && sb.active.Load() == 1
	})
	h.adminDo("POST", "/admin/state", `{"sandbox_id":"`+id+`","state":"paused"}`, "")
	if st, body := h.adminDo("DELETE", "/admin/routes/"+id, "", ""); st != 200 {
		t.Fatalf("DELETE: %d %s", st, body)
	}
	close(release)
	if st := <-answered; st != 200 {
		t.Fatalf("request in flight: %d, want 200", st)
	}
	testenv.WaitFor(t, 5*time.Second, "the request done", func() bool {
		return h.proxy.sandboxes.peek(id).active.Load() == 0
	})
	// A day and more later the sweep forgets it, as any idle sandbox.
	h.proxy.sandboxes.sweep(time.Now().Add(25*time.Hour), 24*time.Hour, time.Hour)
	if n := sandboxCount(h.proxy); n != before {
		t.Fatalf("sandbox entries after the sweep: %d, want %d (state %s)", n, before, stateNames[h.proxy.sandboxes.peek(id).state.Load()])
	}
}

// An invalidation does not make every instance read the route of each
// running sandbox it knows at once: the janitor's round asks about them
// through the cache, so a sandbox that had a request since (its route
// read again then) costs no store read; only idle ones do.
func TestRecheckReadsOnlyIdleSandboxes(t *testing.T) {
	h := newHarness(t)
	port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") }))
	busy, idle := h.route("busy", port), h.route("idle", port)
	for _, host := range []string{busy, idle} {
		if st, _, _ := h.get(host, "/"); st != 200 {
			t.Fatalf("GET %s: %d", host, st)
		}
	}
	before := h.counts.n.Load()
	h.proxy.Invalidate("busy")
	h.proxy.Invalidate("idle")
	if n := h.counts.n.Load(); n != before {
		t.Fatalf("invalidating running sandboxes read the store %d times, want 0 until the janitor's round", n-before)
	}
	if st, _, _ := h.get(busy, "/"); st != 200 {
		t.Fatalf("GET busy: %d", st)
	}
	h.proxy.recheckInvalidated(nil)
	if n := h.counts.n.Load() - before; n != 2 { // busy's request, idle's check
		t.Errorf("%d store reads, want 2: the request for busy and the check of idle", n)
	}
	if c := sandboxCount(h.proxy); c != 2 {
		t.Errorf("%d sandbox entries, want 2: both routes are there", c)
	}
}

// A kill cuts its sandbox's WebSockets through the sandbox's own pools.
// It walked every tunnel of the instance instead, under the registry lock
// that every event stream and WebSocket registers with: ≈ 1 ms a kill at
// 10k open WebSockets, at the platform's 100-300 kills a second, while
// new streams waited. With that lock held (a walk in progress), a kill
// must still go through.
func TestKillDoesNotWaitForTheStreamRegistry(t *testing.T) {
	h := newHarness(t)
	h.proxy.streams.mu.Lock()
	done := make(chan struct{})
	go func() {
		h.proxy.kill("gone")
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Error("kill waited for the stream registry's lock")
	}
	h.proxy.streams.mu.Unlock()
	<-done
}
