package proxy

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
	"github.com/cube-sandbox/cubeproxy/routing/redisstore"
)

// The control plane removes a sandbox from Redis (DEL of its hash) and
// announces it through an instance's admin API (backend_cache/delete or
// meta/upsert). That instance applies the announcement itself, as it
// would the id arriving on the channel: a sandbox it holds paused has its
// route read again at once and is forgotten when Redis no longer has it,
// a running one in the janitor's next round. It relied on its own PUBLISH
// coming back to it, which never comes while its subscription is refused
// (an ACL without the channel) or being made again: the README says only
// "invalidations from other instances are not applied" then, yet the
// pause of the removed sandbox stayed (only the once-a-day read forgets
// it), and so did its last_active line. The harness has no subscriber, as
// such an instance.
func TestRedisAdminAnnouncementAppliedWithoutItsEcho(t *testing.T) {
	for _, tc := range []struct{ path, state string }{
		{"/admin/backend_cache/delete", "paused"},
		{"/admin/backend_cache/delete", "pausing"},
		{"/admin/meta/upsert", "paused"},
		{"/admin/backend_cache/delete", "running"},
		{"/admin/meta/upsert", "running"},
	} {
		t.Run(strings.TrimPrefix(tc.path, "/admin/")+"/"+tc.state, func(t *testing.T) {
			r, h, hosts := redisAdmin(t, redisstore.Config{})
			if st, raw := h.adminDo("POST", "/admin/state", `{"sandbox_id":"first","state":"`+tc.state+`"}`, ""); st != 200 {
				t.Fatalf("state %s: %d %s", tc.state, st, raw)
			}
			before := sandboxCount(h.proxy)
			if err := r.Client().Del(context.Background(), redisstore.DefaultKeyPrefix+"first").Err(); err != nil {
				t.Fatal(err)
			}
			if st, raw := h.adminDo("POST", tc.path, `{"sandbox_id":"first"}`, ""); st != 200 {
				t.Fatalf("POST %s: %d %s", tc.path, st, raw)
			}
			if tc.state == "running" {
				// Asked about in the janitor's round, not at once.
				h.proxy.recheckInvalidated(context.Background())
			}
			testenv.WaitFor(t, 10*time.Second, "the removed sandbox forgotten", func() bool {
				return sandboxCount(h.proxy) == before-1
			})
			if _, raw := h.adminDo("GET", "/admin/last_active", "", ""); strings.Contains(raw, `"first"`) {
				t.Errorf("last_active still lists the removed sandbox: %s", raw)
			}
			// The other sandbox, still in Redis, is untouched.
			if code, body, _ := h.get(hosts[1], "/"); code != 200 {
				t.Errorf("second: %d %s, want 200", code, body)
			}
		})
	}
}
