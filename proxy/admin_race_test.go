package proxy

import (
	"context"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
	"github.com/cube-sandbox/cubeproxy/routing"
)

// waiting returns how many changes of id hold or wait for its lock.
func (l *sandboxLocks) waiting(id string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	if e := l.m[id]; e != nil {
		return e.refs
	}
	return 0
}

// adminCall is one admin API call a test makes.
type adminCall struct{ method, path, body string }

// call makes c without the harness's t.Fatal, so that it can run outside
// the test's goroutine.
func (h *harness) call(c adminCall) (int, error) {
	r, err := http.NewRequest(c.method, "http://"+h.admin+c.path, strings.NewReader(c.body))
	if err != nil {
		return 0, err
	}
	resp, err := http.DefaultClient.Do(r)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, nil
}

// Two admin changes of one sandbox made at once take effect one after the
// other, each whole. A change is a route store step and a sandbox state
// step; here the second change comes between the first one's two steps,
// and must wait for the first to finish. Interleaved, a DELETE forgot the
// pause set after a PUT that followed it had been answered (traffic went
// to a paused sandbox), a meta/delete killed the route a PUT had stored
// since (410 for an hour after the PUT's 200), and a PUT lifted the kill
// of a meta/delete that had removed its route (404, not 410).
func TestAdminChangesOfOneSandboxDoNotInterleave(t *testing.T) {
	port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
	put := adminCall{"PUT", "/admin/routes/rc", `{"HostIP":"127.0.0.1","80":"` + itoa(port) + `"}`}
	for _, tc := range []struct {
		name   string
		first  adminCall
		then   []adminCall // made between first's two steps, one after the other
		route  bool        // whether the route exists after both
		status int         // of a request to the sandbox after both
	}{
		{"DELETE, then PUT and pause", adminCall{"DELETE", "/admin/routes/rc", ""},
			[]adminCall{put, {"POST", "/admin/state", `{"sandbox_id":"rc","state":"paused"}`}}, true, 503},
		{"meta/delete, then PUT", adminCall{"POST", "/admin/meta/delete", `{"sandbox_id":"rc"}`},
			[]adminCall{put}, true, 200},
		{"PUT, then meta/delete", put,
			[]adminCall{{"POST", "/admin/meta/delete", `{"sandbox_id":"rc"}`}}, false, 410},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			h.put("rc", map[string]string{"HostIP": "127.0.0.1", "80": itoa(port)})
			var fired atomic.Bool
			done := make(chan struct{})
			h.adm.afterStoreChange = func(id string) {
				if id != "rc" || !fired.CompareAndSwap(false, true) {
					return
				}
				go func() {
					defer close(done)
					for _, c := range tc.then {
						if st, err := h.call(c); err != nil || st != 200 {
							t.Errorf("%s %s: %d %v", c.method, c.path, st, err)
						}
					}
				}()
				// Until the calls are done, or the next one waits for
				// this change to finish.
				for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
					select {
					case <-done:
						return
					default:
					}
					if h.adm.locks.waiting(id) > 1 {
						return
					}
					if time.Now().After(deadline) {
						t.Error("the calls neither finished nor waited")
						return
					}
				}
			}
			if st, err := h.call(tc.first); err != nil || st != 200 {
				t.Fatalf("%s %s: %d %v", tc.first.method, tc.first.path, st, err)
			}
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				t.Fatal("the calls made during the first did not finish")
			}
			if _, ok := h.store.Get("rc"); ok != tc.route {
				t.Errorf("route stored: %v, want %v", ok, tc.route)
			}
			if code, body, _ := h.get("80-rc.cube.test", "/"); code != tc.status {
				t.Errorf("request after both: %d %s, want %d", code, body, tc.status)
			}
			if n := h.adm.locks.waiting("rc"); n != 0 {
				t.Errorf("the sandbox's lock is still counted %d times after every change ended", n)
			}
		})
	}
}

// answerHeldStore is a real store whose Lookup, once it has read the store,
// runs after (tests hold a read's answer back with it).
type answerHeldStore struct {
	inner atomic.Pointer[routing.MemoryStore]
	after func(id string)
}

func (g *answerHeldStore) Lookup(ctx context.Context, id string) (*routing.Route, error) {
	r, err := g.inner.Load().Lookup(ctx, id)
	g.after(id)
	return r, err
}

// heldRead is a harness whose store, once armed, holds the answer of its
// next read of one id, after reading the store, until release is closed;
// reached closes when it holds. port is a sandbox answering "ok", for the
// route a test stores meanwhile.
type heldRead struct {
	h                *harness
	port             uint16
	armed            atomic.Bool
	reached, release chan struct{}
}

// newHeldRead starts a heldRead on id, armed.
func newHeldRead(t *testing.T, id string) *heldRead {
	hr := &heldRead{reached: make(chan struct{}), release: make(chan struct{})}
	hr.armed.Store(true)
	hr.port = backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
	gs := &answerHeldStore{after: func(got string) {
		if got == id && hr.armed.CompareAndSwap(true, false) {
			close(hr.reached)
			<-hr.release
		}
	}}
	hr.h = newHarness(t, func(o *harnessOpts) { o.store = gs })
	gs.inner.Store(hr.h.store)
	return hr
}

// holding waits for the armed read to hold its answer.
func (hr *heldRead) holding(t *testing.T, what string) {
	t.Helper()
	testenv.Recv(t, hr.reached, 10*time.Second, what)
}

// A request that found no route forgets the sandbox's state (a route
// deleted in the store is a sandbox gone). A request that read "no route"
// just before the route was stored and the sandbox paused (a client
// polling for a sandbox being created) must not forget that pause when it
// ends: it is newer than what the request read, and the sandbox was
// served as running, to a paused VM.
func TestRequestThatFoundNoRouteKeepsALaterPause(t *testing.T) {
	hr := newHeldRead(t, "late")
	h := hr.h

	first := make(chan int, 1)
	go func() {
		resp, err := h.client.Do(h.req("GET", "80-late.cube.test", "/", nil))
		if err != nil {
			t.Error(err)
			first <- 0
			return
		}
		resp.Body.Close()
		first <- resp.StatusCode
	}()
	hr.holding(t, "the request to read the store")
	// The sandbox is created and paused while the request's answer is on
	// its way.
	createPaused(t, h, "late", hr.port)
	close(hr.release)
	if st := <-first; st != 404 {
		t.Fatalf("the request that read no route: %d, want 404", st)
	}
	if code, body, _ := h.get("80-late.cube.test", "/"); code != 503 {
		t.Errorf("the paused sandbox answers %d %s, want 503", code, body)
	}
}

// With routes in Redis, meta/delete (kill) and meta/upsert (lift the kill
// of a sandbox created again) are changes of the sandbox too, and take
// effect one after the other. An upsert that came between meta/delete's
// cache invalidation and its kill lifted nothing, and the kill that
// followed answered the re-created sandbox 410 for an hour after the
// upsert's 200.
func TestAdminRedisModeUpsertDuringKillIsNotUndone(t *testing.T) {
	port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
	var h *harness
	var fired atomic.Bool
	done := make(chan struct{})
	// The publish of meta/delete's invalidation is the point between its
	// steps: invalidate, then kill.
	publish := func(id string) error {
		if id != "rk" || !fired.CompareAndSwap(false, true) {
			return nil
		}
		go func() {
			defer close(done)
			// The platform created the sandbox again: its route is in
			// Redis (it never left h.store here), and it says so.
			c := adminCall{"POST", "/admin/meta/upsert", `{"sandbox_id":"rk"}`}
			if st, err := h.call(c); err != nil || st != 200 {
				t.Errorf("%s %s: %d %v", c.method, c.path, st, err)
			}
		}()
		// Until the upsert is done, or waits for the kill to finish.
		testenv.WaitFor(t, 10*time.Second, "the upsert to end or wait", func() bool {
			select {
			case <-done:
				return true
			default:
				return h.adm.locks.waiting(id) > 1
			}
		})
		return nil
	}
	h = newHarness(t, func(o *harnessOpts) { o.noAdminRoutes, o.publish = true, publish })
	h.put("rk", map[string]string{"HostIP": "127.0.0.1", "80": itoa(port)})
	if st, body := h.adminDo("POST", "/admin/meta/delete", `{"sandbox_id":"rk"}`, ""); st != 200 {
		t.Fatalf("meta/delete: %d %s", st, body)
	}
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the upsert made during meta/delete did not finish")
	}
	if code, body, _ := h.get("80-rk.cube.test", "/"); code != 200 {
		t.Errorf("the re-created sandbox, after the upsert answered 200: %d %s, want 200", code, body)
	}
}

// An invalidation of a paused sandbox reads its route again and forgets
// the pause when the store has none (rereadRoute). A sandbox created
// again and paused while that read's answer is on its way keeps the
// pause: it is newer than what the read found. Timed from after the
// read, the pause was forgotten, and the paused VM served as running.
func TestInvalidationReadThatFoundNoRouteKeepsALaterPause(t *testing.T) {
	hr := newHeldRead(t, "again")
	hr.armed.Store(false)
	h := hr.h
	// Paused, then removed from the store (no route left).
	if st, body := h.adminDo("POST", "/admin/state", `{"sandbox_id":"again","state":"paused"}`, ""); st != 200 {
		t.Fatalf("state: %d %s", st, body)
	}
	hr.armed.Store(true)
	settled := make(chan bool, 1)
	go func() { settled <- h.proxy.rereadRoute(context.Background(), "again") }()
	hr.holding(t, "the read to reach the store")
	createPaused(t, h, "again", hr.port)
	close(hr.release)
	if !<-settled {
		t.Fatal("the store's \"not found\" did not settle the question")
	}
	if code, body, _ := h.get("80-again.cube.test", "/"); code != 503 {
		t.Errorf("the paused sandbox answers %d %s, want 503", code, body)
	}
}

// A sandbox's lock excludes every later change until its holder and all
// its waiters are done, and leaves the map then: one entry per sandbox
// ever changed would grow for ever. Dropped while a waiter still used
// it, the next change made a fresh entry and ran beside that waiter.
func TestSandboxLocksExcludeUntilTheLastLeaves(t *testing.T) {
	var l sandboxLocks
	const id = "sbx"
	unlockA := l.lock(id)
	acquired := make(chan func(), 2)
	go func() { acquired <- l.lock(id) }() // B
	testenv.WaitFor(t, 10*time.Second, "B to wait", func() bool { return l.waiting(id) == 2 })
	unlockA()
	var unlockB func()
	select {
	case unlockB = <-acquired:
	case <-time.After(10 * time.Second):
		t.Fatal("B did not get the lock A released")
	}
	go func() { acquired <- l.lock(id) }() // C, while B holds the lock
	testenv.WaitFor(t, 10*time.Second, "C to wait behind B, or take the lock", func() bool {
		return l.waiting(id) == 2 || len(acquired) > 0
	})
	if len(acquired) > 0 {
		t.Fatal("C took the lock B holds")
	}
	unlockB()
	select {
	case unlockC := <-acquired:
		unlockC()
	case <-time.After(10 * time.Second):
		t.Fatal("C did not get the lock B released")
	}
	l.mu.Lock()
	n := len(l.m)
	l.mu.Unlock()
	if n != 0 {
		t.Errorf("%d entries left once every change ended, want 0", n)
	}
	for _, other := range []string{"a", "b"} { // other sandboxes do not wait
		l.lock(other)()
	}
}

// createPaused stores sandbox id's route to port through the admin API
// and pauses it, as the control plane creates a sandbox and pauses it at
// once.
func createPaused(t *testing.T, h *harness, id string, port uint16) {
	t.Helper()
	for _, c := range []adminCall{
		{"PUT", "/admin/routes/" + id, `{"HostIP":"127.0.0.1","80":"` + itoa(port) + `"}`},
		{"POST", "/admin/state", `{"sandbox_id":"` + id + `","state":"paused"}`},
	} {
		if st, err := h.call(c); err != nil || st != 200 {
			t.Fatalf("%s %s: %d %v", c.method, c.path, st, err)
		}
	}
}

// A route stored again lifts the sandbox's kill, and only a kill: a pause
// set through /admin/state while the store's change finds the sandbox
// killed stands. Both calls answer 200, and in either order the sandbox
// ends paused (a pause replaces the kill, a store keeps a pause); the
// lift read "killed", then set running over the pause that had landed
// since, and traffic went to a sandbox the control plane had paused.
func TestAdminRouteStoredKeepsAPauseThatLandsOnTheKill(t *testing.T) {
	port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
	for _, store := range []adminCall{
		{"PUT", "/admin/routes/rk", `{"HostIP":"127.0.0.1","80":"` + itoa(port) + `"}`},
		{"POST", "/admin/meta/upsert", `{"sandbox_id":"rk","HostIP":"127.0.0.1","80":"` + itoa(port) + `"}`},
	} {
		t.Run(store.path, func(t *testing.T) {
			h := newHarness(t)
			h.route("rk", port)
			host := "80-rk.cube.test" // as the stored route maps it
			if st, body := h.adminDo("POST", "/admin/meta/delete", `{"sandbox_id":"rk"}`, ""); st != 200 {
				t.Fatalf("meta/delete: %d %s", st, body)
			}
			var fired atomic.Bool
			pause := make(chan int, 1)
			h.proxy.sandboxes.beforeLiftKill = func() {
				if fired.CompareAndSwap(false, true) {
					st, err := h.call(adminCall{"POST", "/admin/state", `{"sandbox_id":"rk","state":"paused"}`})
					if err != nil {
						t.Error(err)
					}
					pause <- st
				}
			}
			st, err := h.call(store)
			h.proxy.sandboxes.beforeLiftKill = nil
			if err != nil || st != 200 {
				t.Fatalf("%s %s: %d %v", store.method, store.path, st, err)
			}
			if !fired.Load() {
				t.Fatal("the store did not lift the kill: the case tests nothing")
			}
			if st := <-pause; st != 200 {
				t.Fatalf("state paused: %d", st)
			}
			if st, body, _ := h.get(host, "/"); st != 503 || !strings.Contains(body, CodeSandboxPausing) {
				t.Errorf("GET after both: %d %s, want 503 %s", st, body, CodeSandboxPausing)
			}
		})
	}
}
