package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
	"github.com/cube-sandbox/cubeproxy/routing/redisstore"
)

// A sandbox paused on an instance that never gets a request for it, then
// removed from Redis by the control plane (DEL and PUBLISH, no meta/delete),
// is forgotten there: the instance reads the route again on the PUBLISH
// and, finding it gone, drops the pause. It kept the pause for ever: one
// state entry per such sandbox, and a sandbox created again under the id
// answered 503 "paused".
func TestRedisRemovedPausedSandboxForgottenOnPublish(t *testing.T) {
	// Parallel: its redis-servers and proxies are its own, and it asserts
	// no latency; what it reads of the log is its own proxies' lines.
	testenv.ParallelRedis(t)
	r := testenv.StartRedis(t)
	// The janitor's first round, a quarter of this after the start (30 s),
	// would forget the entry too (recheckInvalidated): only the PUBLISH
	// may, within the test's 10 s.
	p := startRedisProxy(t, r.Addr(), "--upstream-idle-conn-timeout", "2m")
	p.subscribed(t)
	backendPort := redisBackend(t, "new")
	const id = "paused-then-removed"
	key := redisstore.DefaultKeyPrefix + id
	ctx := context.Background()
	route := func(createdAt int64) []any {
		return []any{"HostIP", "127.0.0.1", "SandboxIP", "192.168.0.2", "CreatedAt", strconv.FormatInt(createdAt, 10),
			strconv.Itoa(redisContainerPort), strconv.Itoa(backendPort)}
	}
	hsetRoute(t, r, key, route(1)...)
	// One request first, so that last_active lists the sandbox: its
	// listing is how the test sees the entry go without a request of its
	// own, which would read the route and forget the pause by itself.
	if got := p.get(t, id); got.status != 200 {
		t.Fatalf("before the pause: %d %s", got.status, got.body)
	}
	pause, err := http.NewRequest("POST", "http://"+p.admin+"/admin/state", strings.NewReader(`{"sandbox_id":"`+id+`","state":"paused"}`))
	if err != nil {
		t.Fatal(err)
	}
	if got := p.do(t, pause); got.status != 200 {
		t.Fatalf("pause: %d %s", got.status, got.body)
	}
	if !p.lastActiveLists(t, id) {
		t.Fatalf("last_active does not list paused %s", id)
	}

	// Removed by the control plane: the PUBLISH alone must make the
	// proxy forget the pause. Redis having answered its HGETALL is not
	// enough to go on: the proxy forgets the entry only once it has read
	// that answer, and a request sent before then met the pause (a 503,
	// seen under a loaded make test).
	if err := r.Client().Del(ctx, key).Err(); err != nil {
		t.Fatal(err)
	}
	if err := r.Client().Publish(ctx, redisstore.DefaultInvalidateChannel, id).Err(); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, func() error {
		if p.lastActiveLists(t, id) {
			return fmt.Errorf("the proxy still holds paused %s after its route was deleted and published (invalidations applied %d, subscriptions %d)",
				id, p.a.sub.Applied(), p.a.sub.Subscriptions())
		}
		return nil
	})

	// Created again: a new sandbox, served (not 503 for the old pause)
	// once the PUBLISH drops the 404 the re-read cached.
	hsetRoute(t, r, key, route(time.Now().UnixNano())...)
	if err := r.Client().Publish(ctx, redisstore.DefaultInvalidateChannel, id).Err(); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 5*time.Second, func() error {
		got := p.get(t, id)
		switch {
		case got.status == 404:
			return fmt.Errorf("still the cached 404")
		case got.status != 200 || got.body != "new":
			t.Fatalf("sandbox created again: %d %s, want 200 new", got.status, strings.TrimSpace(got.body))
		}
		return nil
	})
}

// lastActiveLists reports whether GET /admin/last_active lists id.
func (p *redisProxy) lastActiveLists(t *testing.T, id string) bool {
	t.Helper()
	got := p.adminGet(t, "/admin/last_active")
	var body struct{ Entries map[string]int64 }
	if got.status != 200 || json.Unmarshal([]byte(got.body), &body) != nil {
		t.Fatalf("last_active: %d %s", got.status, got.body)
	}
	_, ok := body.Entries[id]
	return ok
}
