package proxy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"strconv"
	"testing"
	"time"
)

// lifecycleClient calls the admin API as the platform's lifecycle manager
// (CubeProxy-sidecar, cube-lifecycle-manager) does: JSON bodies marshalled
// from its structs, Content-Type application/json, the token in
// X-Cube-Admin-Token, any 2xx a success, every other status a failure,
// answers read up to 1 MiB and decoded with encoding/json into its types.
type lifecycleClient struct {
	t     *testing.T
	base  string
	token string
	httpc *http.Client
}

// lifecycleMeta has the shape of the lifecycle manager's meta, the body of
// its POST /admin/meta/upsert (pointer timeout, unix ms times).
type lifecycleMeta struct {
	SandboxID      string `json:"sandbox_id"`
	TemplateID     string `json:"template_id,omitempty"`
	HostID         string `json:"host_id,omitempty"`
	HostIP         string `json:"host_ip,omitempty"`
	InstanceType   string `json:"instance_type,omitempty"`
	TimeoutSeconds *int   `json:"timeout_seconds,omitempty"`
	AutoPause      bool   `json:"auto_pause,omitempty"`
	AutoResume     bool   `json:"auto_resume,omitempty"`
	CreatedAt      int64  `json:"created_at,omitempty"`
	EndAt          int64  `json:"end_at,omitempty"`
}

// lifecycleLastActive has the shape the lifecycle manager decodes GET
// /admin/last_active into: a field of another JSON type fails its whole
// poll, and its next since is the answer's now.
type lifecycleLastActive struct {
	Now     int64            `json:"now"`
	Since   int64            `json:"since"`
	Count   int              `json:"count"`
	Entries map[string]int64 `json:"entries"`
}

// call makes one request and returns the body, or an error for anything
// the lifecycle manager counts as a failure.
func (c *lifecycleClient) call(method, path string, body any) ([]byte, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, c.base+path, rd)
	if err != nil {
		return nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.token != "" {
		req.Header.Set("X-Cube-Admin-Token", c.token)
	}
	resp, err := c.httpc.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode/100 != 2 {
		return nil, fmt.Errorf("status=%d body=%q", resp.StatusCode, raw)
	}
	return raw, nil
}

func (c *lifecycleClient) push(path string, body any) {
	c.t.Helper()
	if _, err := c.call(http.MethodPost, path, body); err != nil {
		c.t.Fatalf("POST %s %+v: the lifecycle manager counts this a failure: %v", path, body, err)
	}
}

func (c *lifecycleClient) setState(id, state string) {
	c.t.Helper()
	c.push("/admin/state", map[string]string{"sandbox_id": id, "state": state})
}

func (c *lifecycleClient) pull(since int64) lifecycleLastActive {
	c.t.Helper()
	raw, err := c.call(http.MethodGet, "/admin/last_active?since="+strconv.FormatInt(since, 10), nil)
	if err != nil {
		c.t.Fatalf("last_active: %v", err)
	}
	var out lifecycleLastActive
	if err := json.Unmarshal(raw, &out); err != nil {
		c.t.Fatalf("last_active %s: the lifecycle manager cannot decode it: %v", raw, err)
	}
	return out
}

// The lifecycle manager's whole conversation with one proxy (routes in
// Redis, as in production), its requests and its decoding played exactly:
// every call it makes succeeds by its rule, and each answer decodes into
// its types and means what it reads it as.
func TestLifecycleManagerContract(t *testing.T) {
	h := newHarness(t, func(o *harnessOpts) { o.token = "s3cret"; o.noAdminRoutes = true })
	c := &lifecycleClient{t: t, base: "http://" + h.admin, token: "s3cret", httpc: &http.Client{Timeout: 10 * time.Second}}
	host := h.route("sbx1", backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })))
	status := func() int {
		t.Helper()
		st, _, _ := h.get(host, "/")
		return st
	}

	timeout := 300
	now := time.Now().UnixMilli()
	c.push("/admin/meta/upsert", lifecycleMeta{
		SandboxID: "sbx1", TemplateID: "tpl-1", HostID: "host-1", HostIP: "10.0.0.2", InstanceType: "cubebox",
		TimeoutSeconds: &timeout, AutoPause: true, AutoResume: true, CreatedAt: now, EndAt: now + 300_000,
	})
	if st := status(); st != 200 {
		t.Fatalf("after meta/upsert: %d, want 200", st)
	}

	// The sweeper's pause: pausing, then paused; the resumer's running.
	c.setState("sbx1", "pausing")
	if st := status(); st != 503 {
		t.Fatalf("pausing: %d, want 503", st)
	}
	c.setState("sbx1", "paused")
	c.setState("sbx1", "running")
	if st := status(); st != 200 {
		t.Fatalf("running again: %d, want 200", st)
	}

	// The poller: since=0 first, then the last answer's now.
	first := c.pull(0)
	if first.Now < now || first.Entries["sbx1"] < now {
		t.Fatalf("last_active?since=0: %+v; want now and sbx1 at or after %d", first, now)
	}
	// The next request lands in a later millisecond than the answer's now.
	for time.Now().UnixMilli() <= first.Now {
		runtime.Gosched()
	}
	if st := status(); st != 200 {
		t.Fatalf("request after the poll: %d", st)
	}
	next := c.pull(first.Now)
	if ts, ok := next.Entries["sbx1"]; !ok || ts < first.Now || next.Since != first.Now || next.Now < ts {
		t.Fatalf("last_active?since=%d after a request: %+v; want sbx1 dated in [since, now]", first.Now, next)
	}

	// The kill: meta/delete, after which the sandbox is gone here.
	c.push("/admin/meta/delete", map[string]string{"sandbox_id": "sbx1"})
	if st := status(); st != 410 {
		t.Fatalf("after meta/delete: %d, want 410", st)
	}

	raw, err := c.call(http.MethodGet, "/admin/healthz", nil)
	var health struct {
		OK bool `json:"ok"`
	}
	if err != nil || json.Unmarshal(raw, &health) != nil || !health.OK {
		t.Fatalf("healthz: %s %v", raw, err)
	}

	// A wrong token is the failure it should be, not a success.
	bad := *c
	bad.token = "wrong"
	if _, err := bad.call(http.MethodPost, "/admin/state", map[string]string{"sandbox_id": "sbx1", "state": "running"}); err == nil {
		t.Fatal("a wrong token was answered 2xx")
	}
}
