package proxy

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// A sandbox killed through meta/delete is gone from last_active at once,
// as DELETE /admin/routes forgets a deleted sandbox's activity, also when
// the kill cut a request it had in flight (whose end came after the
// kill). Earlier builds listed it for the hour its 410 lasts, dated at
// its last request or at the kill's cut, and a reaper reading the list
// took the dead sandbox for an active one.
func TestLastActiveForgetsAKilledSandbox(t *testing.T) {
	h := newHarness(t)
	arrived := make(chan struct{}, 1)
	host := h.route("doomed", backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/hold" {
			arrived <- struct{}{}
			<-r.Context().Done() // until the kill closes the connection
			return
		}
		w.WriteHeader(200)
	})))
	if st, _, _ := h.get(host, "/"); st != 200 {
		t.Fatalf("request before the kill: %d", st)
	}
	held := h.goStatus(h.req("GET", host, "/hold", nil))
	testenv.Recv(t, arrived, 10*time.Second, "the held request at the sandbox")
	entries := func() map[string]any {
		st, out := h.adminJSON("GET", "/admin/last_active?since=0", "")
		if st != 200 {
			t.Fatalf("last_active: %d %v", st, out)
		}
		e, _ := out["entries"].(map[string]any)
		return e
	}
	if _, ok := entries()["doomed"]; !ok {
		t.Fatal("last_active does not list the sandbox with a request in flight")
	}
	if st, out := h.adminJSON("POST", "/admin/meta/delete", `{"sandbox_id":"doomed"}`); st != 200 {
		t.Fatalf("meta/delete: %d %v", st, out)
	}
	if st := testenv.Recv(t, held, 10*time.Second, "the held request's end"); st != 410 {
		t.Fatalf("request in flight at the kill: %d, want 410", st)
	}
	sb := h.proxy.sandboxes.peek("doomed")
	testenv.Eventually(t, 10*time.Second, func() error {
		if n := sb.inFlight(); n != 0 {
			return fmt.Errorf("%d requests in flight", n)
		}
		return nil
	})
	if ts, ok := entries()["doomed"]; ok {
		t.Errorf("last_active lists the killed sandbox at %v", ts)
	}
	if st, body, _ := h.get(host, "/"); st != 410 {
		t.Errorf("killed sandbox: %d %s, want 410", st, body)
	}
}
