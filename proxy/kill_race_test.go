package proxy

import (
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// A kill (meta/delete) that answers while a request is between serve's
// look at the sandbox's state (running) and its pool lookup ends that
// request too: it is not forwarded to the killed sandbox. The kill took
// the sandbox's pools out of the map, so the request made a fresh pool
// under the old sandbox's key, which the kill had not marked, and sent
// the request to the dead VM after meta/delete's 200 (and the pool stayed
// until the sweep). A kill cuts what is open, and this request had no
// connection yet for it to cut: it answers 410 as one a moment later.
func TestKillDuringPoolLookupIsNotForwarded(t *testing.T) {
	for _, tc := range []struct {
		name    string
		upgrade bool
	}{{"request", false}, {"upgrade", true}} {
		t.Run(tc.name, func(t *testing.T) {
			port, reached := countingBackend(t)
			h := newHarness(t)
			host := h.route("kp", port)
			var fired atomic.Bool
			h.proxy.beforePool = func() {
				if !fired.CompareAndSwap(false, true) {
					return
				}
				if st, err := h.call(adminCall{"POST", "/admin/meta/delete", `{"sandbox_id":"kp"}`}); err != nil || st != 200 {
					t.Errorf("meta/delete: %d %v", st, err)
				}
			}
			r := h.req("GET", host, "/", nil)
			if tc.upgrade {
				r.Header.Set("Connection", "Upgrade")
				r.Header.Set("Upgrade", "websocket")
				r.Header.Set("Sec-WebSocket-Version", "13")
				r.Header.Set("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ==")
			}
			resp := h.do(r)
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if !fired.Load() {
				t.Fatal("the request did not reach its pool lookup: the case tests nothing")
			}
			if n := reached.Load(); n != 0 {
				t.Errorf("the killed sandbox got %d requests after meta/delete answered 200", n)
			}
			if resp.StatusCode != 410 || !strings.Contains(string(body), CodeSandboxKilled) {
				t.Errorf("request during the kill: %d %s, want 410 %s", resp.StatusCode, body, CodeSandboxKilled)
			}
			if pools, _, _ := h.proxy.pools.stats(); pools != 0 {
				t.Errorf("%d pools left for the killed sandbox", pools)
			}
		})
	}
}

// A pool the janitor's sweep drops (no connection, unused for two idle
// timeouts) just after a request looked it up is one a kill no longer
// finds: the request opened its connection on it all the same, was sent
// to the sandbox after meta/delete had answered 200, and its wait for an
// answer the kill should have cut was left to the header timeout. A
// request that took a pool the sweep then dropped takes a fresh one,
// which the kill finds or which finds the kill.
func TestKillReachesARequestWhosePoolWasSwept(t *testing.T) {
	port, reached := countingBackend(t)
	h := newHarness(t)
	host := h.route("ks", port)
	if code, body, _ := h.get(host, "/"); code != 200 { // the pool, with an idle connection
		t.Fatalf("first request: %d %s", code, body)
	}
	h.proxy.pools.closeIdle()
	reached.Store(0)
	var fired atomic.Bool
	h.proxy.pools.afterGet = func() {
		if !fired.CompareAndSwap(false, true) {
			return
		}
		// The pool is unused long enough for the sweep to drop it.
		stop := make(chan struct{})
		close(stop)
		h.proxy.pools.sweep(time.Now().Add(time.Hour), time.Minute, time.Minute, 0, stop)
		if pools, _, _ := h.proxy.pools.stats(); pools != 0 {
			t.Errorf("the sweep left %d pools: the case tests nothing", pools)
		}
	}
	// The kill once the request found the sandbox running, before it
	// takes a connection.
	var killed atomic.Bool
	h.proxy.afterPool = func() {
		if !fired.Load() || !killed.CompareAndSwap(false, true) {
			return
		}
		if st, err := h.call(adminCall{"POST", "/admin/meta/delete", `{"sandbox_id":"ks"}`}); err != nil || st != 200 {
			t.Errorf("meta/delete: %d %v", st, err)
		}
	}
	code, body, _ := h.get(host, "/")
	if !fired.Load() {
		t.Fatal("the request did not look its pool up")
	}
	if n := reached.Load(); n != 0 {
		t.Errorf("the killed sandbox got %d requests after meta/delete answered 200", n)
	}
	if code != 410 || !strings.Contains(body, CodeSandboxKilled) {
		t.Errorf("request during the sweep and kill: %d %s, want 410 %s", code, body, CodeSandboxKilled)
	}
}

// countingBackend is a sandbox that answers "ok" and counts the requests
// that reached it.
func countingBackend(t *testing.T) (port uint16, reached *atomic.Int64) {
	reached = new(atomic.Int64)
	port = backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reached.Add(1)
		io.WriteString(w, "ok")
	}))
	return port, reached
}
