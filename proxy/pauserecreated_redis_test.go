package proxy

import (
	"context"
	"io"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cube-sandbox/cubeproxy/routing/redisstore"
)

// A pause lives in the memory of the instance that was told. It ended
// when that instance read the sandbox's route gone from Redis, so a
// sandbox created again under the id was served; but an instance that
// never saw it gone kept the old sandbox's pause for the new one: its
// invalidation missed while the instance was unsubscribed, or the delete
// and the new route announced together (the control plane's DEL, PUBLISH,
// HSET, PUBLISH in one pipeline: the re-read the first message started
// found the new hash). Measured with three binaries on one Redis: the
// instance paused through answered the new sandbox 503 sandbox_pausing in
// 3 of 5 tries, until /admin/state running was sent to it, while the two
// others served it. As for a kill, a route created after the pause (its
// CreatedAt against the proxy's clock) is a new sandbox; a route of the
// paused sandbox itself (the same CreatedAt, or none) keeps the pause.
func TestRedisPauseEndsWithSandboxCreatedAgain(t *testing.T) {
	r, store := redisStore(t)
	h := newHarness(t, func(o *harnessOpts) { o.store = store })
	port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") }))
	rdb := r.Client()
	ctx := context.Background()
	write := func(id, createdAt string) {
		t.Helper()
		key := redisstore.DefaultKeyPrefix + id
		fields := []any{"HostIP", "127.0.0.1", "SandboxIP", "127.0.0.1", itoa(port), itoa(port)}
		if createdAt != "" {
			fields = append(fields, "CreatedAt", createdAt)
		}
		// Replaced whole, with no announcement in between: this
		// instance never reads the route gone.
		if _, err := rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
			p.Del(ctx, key)
			p.HSet(ctx, key, fields...)
			return nil
		}); err != nil {
			t.Fatalf("write %s: %v", key, err)
		}
		h.proxy.Invalidate(id) // as the subscriber does for the control plane's PUBLISH
	}
	for _, tc := range []struct {
		name, state string
		first, then string // CreatedAt before the pause, and of the route written after it
		want        int
	}{
		{"paused, created again", "paused", "1", "later", 200},
		{"pausing, created again", "pausing", "1", "later", 200},
		{"paused, same sandbox's route rewritten", "paused", "1", "1", 503},
		{"paused, no CreatedAt", "paused", "", "", 503},
		{"paused, created before the pause", "paused", "1", "2", 503},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id := "recreated-" + strconv.Itoa(int(time.Now().UnixNano()%1e9))
			host := itoa(port) + "-" + id + ".cube.test"
			write(id, tc.first)
			if st, _, _ := h.get(host, "/"); st != 200 {
				t.Fatalf("GET before the pause: %d", st)
			}
			if st, body := h.adminDo("POST", "/admin/state", `{"sandbox_id":"`+id+`","state":"`+tc.state+`"}`, ""); st != 200 {
				t.Fatalf("state: %d %s", st, body)
			}
			if st, _, _ := h.get(host, "/"); st != 503 {
				t.Fatalf("GET while %s: %d, want 503", tc.state, st)
			}
			then := tc.then
			if then == "later" {
				then = strconv.FormatInt(time.Now().UnixNano(), 10)
			}
			write(id, then)
			st, body, _ := h.get(host, "/")
			if st != tc.want {
				t.Fatalf("GET after the route was written again (CreatedAt %q): %d %s, want %d", then, st, body, tc.want)
			}
			if tc.want == 200 {
				// The pause is over for good: the state says running.
				if s := h.proxy.sandboxes.peek(id); s != nil && s.state() != stateRunning {
					t.Fatalf("state after the new sandbox was served: %s, want running", stateNames[s.state()])
				}
			}
		})
	}
}
