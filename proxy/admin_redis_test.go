package proxy

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
	"github.com/cube-sandbox/cubeproxy/routing/redisstore"
)

// redisAdmin is a proxy whose routes live in Redis, with the admin API
// publishing invalidations there as cmd wires it, and two sandboxes whose
// routes the test wrote as the control plane does.
func redisAdmin(t *testing.T, cfg redisstore.Config) (*testenv.Redis, *harness, [2]string) {
	t.Helper()
	r := testenv.StartRedis(t)
	cfg.Addr = r.Addr()
	store, err := redisstore.Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close() })
	h := newHarness(t, func(o *harnessOpts) {
		o.store = store
		o.noAdminRoutes = true
		o.publish = func(id string) error { return store.Publish(context.Background(), id) }
	})
	port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") }))
	var hosts [2]string
	for i, id := range []string{"first", "second"} {
		key := redisstore.DefaultKeyPrefix + id
		if err := r.Client().HSet(context.Background(), key, "HostIP", "127.0.0.1", "SandboxIP", "127.0.0.1",
			"CreatedAt", "1", itoa(port), itoa(port)).Err(); err != nil {
			t.Fatalf("hset %s: %v", key, err)
		}
		hosts[i] = itoa(port) + "-" + id + ".cube.test"
		if code, body, _ := h.get(hosts[i], "/"); code != 200 {
			t.Fatalf("%s before the admin calls: %d %s", id, code, body)
		}
	}
	return r, h, hosts
}

// A body that names a member twice, or spells sandbox_id or state another
// way, is refused with a 400 that says so, and nothing changes: nothing is
// published to Redis, neither sandbox is killed, paused or dropped.
// encoding/json took the last of two members (other readers of the same
// request, an audit log or a gateway, take the first) and matched names
// case-insensitively, so {"sandbox_id":"first","sandbox_id":"second"}
// killed second, and {"SANDBOX_ID":"first"} killed first on meta/delete
// while meta/upsert refused it.
func TestRedisAdminRefusesAmbiguousBodies(t *testing.T) {
	r, h, hosts := redisAdmin(t, redisstore.Config{})
	r.ResetStats(t)
	lookups := h.counts.n.Load()
	for _, tc := range []struct{ path, body, want string }{
		{"/admin/meta/delete", `{"sandbox_id":"first","sandbox_id":"second"}`, "given twice"},
		{"/admin/meta/delete", `{"sandbox_id":"first","sandbox\u005fid":"second"}`, "given twice"},
		{"/admin/meta/delete", `{"SANDBOX_ID":"first"}`, "sandbox_id missing"},
		{"/admin/meta/delete", `{"sandbox_id":["first"]}`, "must be a string"},
		{"/admin/meta/delete", `{"sandbox_id":"first"} {}`, "trailing data"},
		{"/admin/meta/delete", `"first"`, "JSON object"},
		{"/admin/backend_cache/delete", `{"Sandbox_Id":"first"}`, "sandbox_id missing"},
		{"/admin/backend_cache/delete", `{"sandbox_id":"first","sandbox_id":"first"}`, "given twice"},
		{"/admin/meta/upsert", `{"sandbox_id":"second","sandbox_id":"first"}`, "given twice"},
		{"/admin/meta/upsert", `null`, "JSON object"},
		{"/admin/state", `{"sandbox_id":"first","state":"paused","state":"running"}`, "given twice"},
		{"/admin/state", `{"sandbox_id":"first","State":"paused"}`, "state must be"},
		{"/admin/state", `{"sandbox_id":"first","state":1}`, "must be a string"},
		{"/admin/state", `{"sandbox_id":"first","state":null}`, "must be a string"},
	} {
		st, raw := h.adminDo("POST", tc.path, tc.body, "")
		var out map[string]any
		_ = json.Unmarshal([]byte(raw), &out)
		if msg, _ := out["error"].(string); st != 400 || !strings.Contains(msg, tc.want) {
			t.Errorf("POST %s %s: %d %s, want 400 naming %q", tc.path, tc.body, st, strings.TrimSpace(raw), tc.want)
		}
	}
	if n := r.CommandCount(t, "publish"); n != 0 {
		t.Errorf("refused calls published %d invalidations, want none", n)
	}
	for _, host := range hosts {
		if code, body, _ := h.get(host, "/"); code != 200 || body != "ok" {
			t.Errorf("%s after the refused calls: %d %s, want 200 ok", host, code, body)
		}
	}
	if n := h.counts.n.Load(); n != lookups {
		t.Errorf("refused calls dropped cached routes: %d lookups since, want 0", n-lookups)
	}
	// Members an endpoint does not read stay ignored, whatever their type.
	if st, raw := h.adminDo("POST", "/admin/backend_cache/delete", `{"sandbox_id":"second","state":null,"extra":[1]}`, ""); st != 200 {
		t.Errorf("backend_cache/delete with members it does not read: %d %s, want 200", st, raw)
	}
}

// A change whose invalidation cannot be published (Redis stopped between
// the control plane's write and its admin call: SIGSTOP, as a fork or a
// frozen host does) answers 503 with the code invalidation_not_published
// and Retry-After within the command timeout, the change made on this
// instance all the same (the killed sandbox answers 410, though its route
// cannot be read); sent again once Redis answers, each is a 200 whose
// invalidation is published.
func TestRedisAdminPublishStalled(t *testing.T) {
	t.Parallel()
	// The one timeout bounds every command, not only those Redis cannot
	// answer: the lookups before the pause and the publishes after it
	// must fit in it too. 300 ms did not on loaded cores under -race (the
	// setup's first lookup, a dial and two HGETALLs, answered 503
	// store_unavailable), and the 503 with Redis stopped still comes
	// within it.
	const timeout = 2 * time.Second
	r, h, hosts := redisAdmin(t, redisstore.Config{CommandTimeout: timeout})
	calls := []string{"/admin/meta/upsert", "/admin/backend_cache/delete", "/admin/meta/delete"}
	body := `{"sandbox_id":"first"}`

	r.Pause()
	resumed := false
	t.Cleanup(func() {
		if !resumed {
			r.Resume()
		}
	})
	for _, path := range calls {
		start := time.Now()
		resp := h.adminResp("POST", path, body)
		took := time.Since(start)
		var out map[string]string
		_ = json.Unmarshal(resp.body, &out)
		if resp.status != 503 || out["code"] != CodeNotPublished || out["error"] == "" || resp.header.Get("Retry-After") != "1" {
			t.Errorf("POST %s with Redis stopped: %d %s Retry-After %q, want 503 code %s, an error and Retry-After 1",
				path, resp.status, resp.body, resp.header.Get("Retry-After"), CodeNotPublished)
		}
		if took > timeout+time.Second {
			t.Errorf("POST %s with Redis stopped took %v, want about the command timeout %v", path, took, timeout)
		}
	}
	// The kill stands here, and says so while Redis cannot be read: not
	// a 503 store_unavailable that the clients it cut off retry.
	if code, body, _ := h.get(hosts[0], "/"); code != 410 {
		t.Errorf("first after its meta/delete, Redis still stopped: %d %s, want 410 sandbox_killed", code, strings.TrimSpace(body))
	}
	r.Resume()
	resumed = true

	testenv.WaitFor(t, 5*time.Second, "Redis to answer again", func() bool {
		return r.Client().Ping(context.Background()).Err() == nil
	})
	r.ResetStats(t)
	for _, path := range calls {
		if st, raw := h.adminDo("POST", path, body, ""); st != 200 {
			t.Errorf("POST %s again with Redis back: %d %s, want 200", path, st, raw)
		}
	}
	if n := r.CommandCount(t, "publish"); n != len(calls) {
		t.Errorf("the retries published %d invalidations, want %d", n, len(calls))
	}
}

// adminReply is a whole admin answer.
type adminReply struct {
	status int
	header http.Header
	body   []byte
}

// adminResp calls the admin API and returns its whole answer.
func (h *harness) adminResp(method, path, body string) adminReply {
	h.t.Helper()
	req, err := http.NewRequest(method, "http://"+h.admin+path, strings.NewReader(body))
	if err != nil {
		h.t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		h.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return adminReply{status: resp.StatusCode, header: resp.Header, body: b}
}
