package proxy

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
	"github.com/cube-sandbox/cubeproxy/routing"
)

// A request that joins a store read already in flight for its sandbox
// (concurrent misses share one read) gets what that read found, and the
// read began before the request did. When it found no route, the request
// forgot the sandbox's state as though the store had said so at the
// request's start: a route the control plane stored meanwhile (not yet
// announced, as it may be) and a pause set on it after the read began
// were lost, and the paused sandbox was then served as running. A state
// set after the read began must stay, as for the request that started it
// (TestRequestThatFoundNoRouteKeepsALaterPause). So for the janitor's
// re-read of a sandbox an invalidation left unsure (recheckInvalidated).
func TestJoiningAnEarlierReadKeepsALaterPause(t *testing.T) {
	for _, tc := range []struct {
		name string
		// join reads the sandbox's route again, joining the read in
		// flight, and reports how it ended on done; waiting marks its
		// goroutine's stack while it waits on the read.
		join    func(t *testing.T, h *harness, done chan<- struct{})
		waiting string
	}{
		{"request", func(t *testing.T, h *harness, done chan<- struct{}) {
			defer close(done)
			resp, err := h.client.Do(h.req("GET", "80-joined.cube.test", "/", nil))
			if err != nil {
				t.Error(err)
				return
			}
			resp.Body.Close()
			if resp.StatusCode != 404 {
				t.Errorf("the request that joined the read of no route: %d, want 404", resp.StatusCode)
			}
		}, "proxy.(*Proxy).serve"},
		{"janitor", func(t *testing.T, h *harness, done chan<- struct{}) {
			defer close(done)
			h.proxy.recheckInvalidated(context.Background())
		}, "proxy.(*Proxy).rereadRoute"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hr := newHeldRead(t, "joined")
			h := hr.h
			// Known here, and announced changed: the janitor asks about it.
			h.proxy.sandboxes.get([]byte("joined"))
			h.proxy.Invalidate("joined")

			// A read of the sandbox's route begins (a request's, the
			// janitor's): no route yet.
			go h.cache.Get(context.Background(), []byte("joined"))
			hr.holding(t, "the first read to reach the store")
			// The control plane stores the route, unannounced, and
			// pauses the sandbox.
			h.putUnannounced(t, "joined", hr.port)
			if st, err := h.call(adminCall{"POST", "/admin/state", `{"sandbox_id":"joined","state":"paused"}`}); err != nil || st != 200 {
				t.Fatalf("pause: %d %v", st, err)
			}
			done := make(chan struct{})
			go tc.join(t, h, done)
			testenv.WaitFor(t, 10*time.Second, "a wait on the read in flight", func() bool {
				for _, g := range testenv.Stacks() {
					if strings.Contains(g, "routing.(*Cache).wait") && strings.Contains(g, tc.waiting) {
						return true
					}
				}
				return false
			})
			close(hr.release)
			testenv.Recv(t, done, 10*time.Second, "the joined read to end")
			// Past the negative entry that read left (its 2 s).
			h.cache.Invalidate("joined")
			if code, body, _ := h.get("80-joined.cube.test", "/"); code != 503 {
				t.Errorf("the paused sandbox answers %d %s, want 503", code, body)
			}
		})
	}
}

// putUnannounced stores a route for id in the harness's store as the
// control plane writes Redis: without telling the cache.
func (h *harness) putUnannounced(t *testing.T, id string, port uint16) {
	t.Helper()
	r, err := routing.ParseRouteStrict(id, map[string]string{"HostIP": "127.0.0.1", "80": itoa(port)})
	if err != nil {
		t.Fatal(err)
	}
	if err := h.store.Put(r); err != nil {
		t.Fatal(err)
	}
}
