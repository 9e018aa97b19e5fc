package proxy

import (
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
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
			var reached atomic.Int64
			port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				reached.Add(1)
				io.WriteString(w, "ok")
			}))
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
