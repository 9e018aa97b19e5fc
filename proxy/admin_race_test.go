package proxy

import (
	"context"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

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

// A request that found no route forgets the sandbox's state (a route
// deleted in the store is a sandbox gone). A request that read "no route"
// just before the route was stored and the sandbox paused (a client
// polling for a sandbox being created) must not forget that pause when it
// ends: it is newer than what the request read, and the sandbox was
// served as running, to a paused VM.
func TestRequestThatFoundNoRouteKeepsALaterPause(t *testing.T) {
	port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
	reached, release := make(chan struct{}), make(chan struct{})
	var gated atomic.Bool
	gs := &answerHeldStore{after: func(id string) {
		if id == "late" && gated.CompareAndSwap(false, true) {
			close(reached)
			<-release
		}
	}}
	h := newHarness(t, func(o *harnessOpts) { o.store = gs })
	gs.inner.Store(h.store)

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
	select {
	case <-reached:
	case <-time.After(10 * time.Second):
		t.Fatal("the request did not read the store")
	}
	// The sandbox is created and paused while the request's answer is on
	// its way.
	for _, c := range []adminCall{
		{"PUT", "/admin/routes/late", `{"HostIP":"127.0.0.1","80":"` + itoa(port) + `"}`},
		{"POST", "/admin/state", `{"sandbox_id":"late","state":"paused"}`},
	} {
		if st, err := h.call(c); err != nil || st != 200 {
			t.Fatalf("%s %s: %d %v", c.method, c.path, st, err)
		}
	}
	close(release)
	if st := <-first; st != 404 {
		t.Fatalf("the request that read no route: %d, want 404", st)
	}
	if code, body, _ := h.get("80-late.cube.test", "/"); code != 503 {
		t.Errorf("the paused sandbox answers %d %s, want 503", code, body)
	}
}
