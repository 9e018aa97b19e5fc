package proxy

import (
	"io"
	"net/http"
	"strconv"
	"testing"

	"github.com/cube-sandbox/cubeproxy/routing"
)

// /admin/state running reads the route from the store again only for a
// resume (a sandbox set pausing or paused): the memory store too serves a
// sandbox the control plane restored at another address there, while a
// running replayed for a running sandbox, or sent for an id this instance
// holds nothing of, costs no store read (a registry replay after a control
// plane restart sends one per sandbox). The Redis test
// (TestRedisSandboxSetRunningIsServedAtItsNewAddress) checks the resume
// only, and passed with the expiry made unconditional.
func TestSetRunningReadsTheRouteOnlyForAResume(t *testing.T) {
	h := newHarness(t)
	oldPort := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "old") }))
	newPort := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "new") }))
	const port = 3000
	put := func(backend uint16) {
		r, err := routing.ParseRouteStrict("sleepy", map[string]string{"HostIP": "127.0.0.1", "SandboxIP": "127.0.0.1",
			"CreatedAt": "1", strconv.Itoa(port): strconv.Itoa(int(backend))})
		if err != nil {
			t.Fatal(err)
		}
		// Written to the store only, as the control plane writes Redis:
		// the cached route is not touched.
		if err := h.store.Put(r); err != nil {
			t.Fatal(err)
		}
	}
	put(oldPort)
	host := strconv.Itoa(port) + "-sleepy.cube.test"
	want := func(step, body string) {
		t.Helper()
		if st, got, _ := h.get(host, "/"); st != 200 || got != body {
			t.Fatalf("%s: %d %q, want 200 %q", step, st, got, body)
		}
	}
	want("before", "old")
	reads := h.counts.n.Load()

	h.setSandboxState("sleepy", "running")
	h.setSandboxState("never-seen", "running")
	want("running replayed for a running sandbox", "old")
	if n := h.counts.n.Load() - reads; n != 0 {
		t.Errorf("running for a running sandbox and for an unknown id: %d store reads, want 0", n)
	}

	h.setSandboxState("sleepy", "paused")
	put(newPort) // restored elsewhere, not announced
	h.setSandboxState("sleepy", "running")
	want("after the resume", "new")
}
