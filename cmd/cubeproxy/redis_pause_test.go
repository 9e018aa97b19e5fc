package main

import (
	"context"
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
	r := testenv.StartRedis(t)
	p := startRedisProxy(t, r.Addr())
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
	pause, err := http.NewRequest("POST", "http://"+p.admin+"/admin/state", strings.NewReader(`{"sandbox_id":"`+id+`","state":"paused"}`))
	if err != nil {
		t.Fatal(err)
	}
	if got := p.do(t, pause); got.status != 200 {
		t.Fatalf("pause: %d %s", got.status, got.body)
	}

	// The re-read races the route written again below only when the
	// machine stalls the proxy's goroutine between the two: then the
	// removal is played again.
	testenv.Eventually(t, 10*time.Second, func() error {
		r.ResetStats(t)
		if err := r.Client().Del(ctx, key).Err(); err != nil {
			return err
		}
		if err := r.Client().Publish(ctx, redisstore.DefaultInvalidateChannel, id).Err(); err != nil {
			return err
		}
		deadline := time.Now().Add(2 * time.Second)
		for r.CommandCount(t, "hgetall") == 0 {
			if time.Now().After(deadline) {
				// What the proxy got of it, for a failure whose cause is
				// not known yet (seen once under a loaded make test: no
				// read in five tries).
				return fmt.Errorf("the proxy did not read the route of paused %s again after its PUBLISH (invalidations applied %d, subscriptions %d)",
					id, p.a.sub.Applied(), p.a.sub.Subscriptions())
			}
			time.Sleep(5 * time.Millisecond)
		}
		// Created again: a new sandbox, served (not 503 for the old pause)
		// once the PUBLISH dropped the 404 the re-read cached.
		hsetRoute(t, r, key, route(time.Now().UnixNano())...)
		if err := r.Client().Publish(ctx, redisstore.DefaultInvalidateChannel, id).Err(); err != nil {
			return err
		}
		var got redisReply
		for deadline = time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
			if got = p.get(t, id); got.status != 404 {
				break
			}
		}
		if got.status != 200 || got.body != "new" {
			return fmt.Errorf("sandbox created again: %d %s, want 200 new", got.status, strings.TrimSpace(got.body))
		}
		return nil
	})
}
