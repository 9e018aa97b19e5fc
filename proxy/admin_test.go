package proxy

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"reflect"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
	"github.com/cube-sandbox/cubeproxy/routing"
)

// adminJSON calls the admin API and decodes its JSON answer.
func (h *harness) adminJSON(method, path, body string) (int, map[string]any) {
	h.t.Helper()
	st, raw := h.adminDo(method, path, body, "")
	var out map[string]any
	if err := json.Unmarshal([]byte(raw), &out); err != nil {
		h.t.Fatalf("%s %s: %d, body %q is not a JSON object", method, path, st, raw)
	}
	return st, out
}

// Every admin endpoint's answer shape, and a 400 with {"error"} for every
// bad input (DESIGN.md, "Admin API").
func TestAdminAPI(t *testing.T) {
	h := newHarness(t)
	port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
	p := itoa(port)

	for _, tc := range []struct {
		name, method, path, body string
		status                   int
		want                     map[string]any // fields the answer must carry (JSON numbers are float64)
	}{
		{"healthz", "GET", "/admin/healthz", "", 200, map[string]any{"ok": true, "draining": false}},
		{"healthz: method", "DELETE", "/admin/healthz", "", 405, nil},
		{"readyz: method", "POST", "/readyz", "", 405, nil},
		{"upsert", "POST", "/admin/meta/upsert",
			`{"sandbox_id":"adm","HostIP":"127.0.0.1","SandboxIP":"127.0.0.1","CreatedAt":"7","` + p + `":"` + p + `"}`,
			200, map[string]any{"ok": true, "sandbox_id": "adm"}},
		{"upsert with numbers and booleans", "POST", "/admin/meta/upsert",
			`{"sandbox_id":"num","HostIP":"127.0.0.1","CreatedAt":1700000000123456789,"AllowPublicTraffic":true,"` + p + `":` + p + `}`,
			200, map[string]any{"ok": true, "sandbox_id": "num"}},
		{"upsert: invalid JSON", "POST", "/admin/meta/upsert", `{"sandbox_id":`, 400, nil},
		{"upsert: trailing data", "POST", "/admin/meta/upsert", `{"sandbox_id":"x","HostIP":"127.0.0.1"} {}`, 400, nil},
		{"upsert: no id", "POST", "/admin/meta/upsert", `{"HostIP":"127.0.0.1"}`, 400, nil},
		{"upsert: bad id", "POST", "/admin/meta/upsert", `{"sandbox_id":"Bad/Id","HostIP":"127.0.0.1"}`, 400, nil},
		{"upsert: array field", "POST", "/admin/meta/upsert", `{"sandbox_id":"x","HostIP":["127.0.0.1"]}`, 400, nil},
		{"upsert: bad HostIP", "POST", "/admin/meta/upsert", `{"sandbox_id":"x","HostIP":"nope"}`, 400, nil},
		{"upsert: bad port field", "POST", "/admin/meta/upsert", `{"sandbox_id":"x","HostIP":"127.0.0.1","80":"99999"}`, 400, nil},
		{"cache delete", "POST", "/admin/backend_cache/delete", `{"sandbox_id":"adm"}`, 200, map[string]any{"ok": true}},
		{"cache delete: bad body", "POST", "/admin/backend_cache/delete", `[]`, 400, nil},
		{"state paused", "POST", "/admin/state", `{"sandbox_id":"adm","state":"paused"}`, 200, map[string]any{"ok": true, "state": "paused"}},
		{"state running", "POST", "/admin/state", `{"sandbox_id":"adm","state":"running"}`, 200, map[string]any{"ok": true, "state": "running"}},
		{"state: unknown", "POST", "/admin/state", `{"sandbox_id":"adm","state":"killed"}`, 400, nil},
		{"last_active", "GET", "/admin/last_active?since=0", "", 200, map[string]any{"since": float64(0)}},
		{"last_active: bad since", "GET", "/admin/last_active?since=yesterday", "", 400, nil},
		{"routes: bad id", "GET", "/admin/routes/Bad.Id", "", 400, nil},
		{"routes: unknown", "GET", "/admin/routes/nosuch", "", 404, nil},
		// A retried delete, or one of a sandbox never routed here, is no
		// error; "deleted" tells the control plane whether there was a route.
		{"routes: delete unknown", "DELETE", "/admin/routes/nosuch", "", 200, map[string]any{"ok": true, "deleted": false}},
		{"routes: bad body", "PUT", "/admin/routes/x", `{"HostIP":1}`, 400, nil},
		{"routes: a field twice", "PUT", "/admin/routes/x", `{"HostIP":"127.0.0.1","AllowPublicTraffic":"false","AllowPublicTraffic":"true"}`, 400, nil},
		{"upsert: a field twice", "POST", "/admin/meta/upsert", `{"sandbox_id":"x","HostIP":"127.0.0.1","HostIP":"127.0.0.2"}`, 400, nil},
		{"routes: method", "PATCH", "/admin/routes/x", `{}`, 405, nil},
		{"unknown endpoint", "GET", "/admin/nope", "", 404, nil},
	} {
		st, out := h.adminJSON(tc.method, tc.path, tc.body)
		if st != tc.status {
			t.Errorf("%s: status %d %v, want %d", tc.name, st, out, tc.status)
			continue
		}
		if st >= 400 {
			if msg, _ := out["error"].(string); msg == "" {
				t.Errorf("%s: %d without an error message: %v", tc.name, st, out)
			}
			continue
		}
		for k, v := range tc.want {
			if out[k] != v {
				t.Errorf("%s: %s = %v, want %v (answer %v)", tc.name, k, out[k], v, out)
			}
		}
	}

	// What upsert stored is served, and numbers kept every digit.
	if code, body, _ := h.get(p+"-adm.cube.test", "/"); code != 200 || body != "ok" {
		t.Errorf("upserted route: %d %q", code, body)
	}
	if st, out := h.adminJSON("GET", "/admin/routes/num", ""); st != 200 || out["CreatedAt"] != "1700000000123456789" || out[p] != p {
		t.Errorf("numeric upsert stored %d %v", st, out)
	}
	// The list has both; the entries are their fields.
	if st, out := h.adminJSON("GET", "/admin/routes", ""); st != 200 || out["count"] != float64(2) {
		t.Errorf("route list: %d %v", st, out)
	}

	// last_active: {"now","since","count","entries":{"<id>":<ms>}}, the
	// sandbox served above among the entries, dated at or after since.
	since := time.Now().Add(-time.Minute).UnixMilli()
	st, out := h.adminJSON("GET", fmt.Sprintf("/admin/last_active?since=%d", since), "")
	entries, _ := out["entries"].(map[string]any)
	now, _ := out["now"].(float64)
	ts, _ := entries["adm"].(float64)
	if st != 200 || out["since"] != float64(since) || out["count"] != float64(len(entries)) ||
		int64(now) < since || int64(ts) < since || int64(ts) > int64(now) {
		t.Errorf("last_active since %d: %d %v", since, st, out)
	}
	// backend_cache/delete counts what it dropped: the route cached by the
	// request above.
	if st, out := h.adminJSON("POST", "/admin/backend_cache/delete", `{"sandbox_id":"adm"}`); st != 200 || out["deleted"] != float64(1) {
		t.Errorf("backend_cache/delete of a cached route: %d %v, want deleted 1", st, out)
	}
}

// A known admin endpoint called with the wrong method answers 405 with
// Allow (RFC 9110), not 404 "no such endpoint": a control plane that
// sends GET to /admin/meta/delete must hear that the endpoint exists and
// which method it takes. HEAD is served wherever GET is.
func TestAdminWrongMethod(t *testing.T) {
	h := newHarness(t)
	for _, tc := range []struct {
		method, path string
		status       int
		allow        string
	}{
		{"GET", "/admin/meta/upsert", 405, "POST"},
		{"GET", "/admin/meta/delete", 405, "POST"},
		{"PUT", "/admin/backend_cache/delete", 405, "POST"},
		{"GET", "/admin/state", 405, "POST"},
		// A change sent with another method than the one documented is
		// refused as such, not applied: PUT is no synonym of POST here.
		{"PUT", "/admin/state", 405, "POST"},
		{"GET", "/admin/tokens", 405, "POST"},
		{"POST", "/admin/routes", 405, "GET, HEAD"},
		{"DELETE", "/admin/last_active", 405, "GET, HEAD"},
		{"POST", "/admin/routes/x", 405, "GET, HEAD, PUT, DELETE"},
		// The method is wrong whatever the id: a 400 for the id sent the
		// caller to fix what was never the problem.
		{"POST", "/admin/routes/Not_An_Id", 405, "GET, HEAD, PUT, DELETE"},
		{"PATCH", "/admin/routes/", 405, "GET, HEAD, PUT, DELETE"},
		{"GET", "/admin/routes/Not_An_Id", 400, ""},
		{"DELETE", "/admin/healthz", 405, "GET, HEAD"},
		// Load balancers probe with HEAD as often as with GET.
		{"HEAD", "/admin/healthz", 200, ""},
		{"HEAD", "/readyz", 200, ""},
		{"HEAD", "/admin/routes", 200, ""},
		{"HEAD", "/admin/last_active", 200, ""},
		{"HEAD", "/admin/routes/nosuch", 404, ""},
		{"GET", "/admin/nope", 404, ""},
	} {
		status, allow, b := callMethod(t, tc.method, "http://"+h.admin+tc.path)
		if status != tc.status || allow != tc.allow {
			t.Errorf("%s %s: %d Allow %q %s, want %d Allow %q", tc.method, tc.path, status, allow, b, tc.status, tc.allow)
		}
		if tc.method != "HEAD" && status >= 400 && !strings.Contains(string(b), `"error"`) {
			t.Errorf("%s %s: %d without a JSON error: %q", tc.method, tc.path, status, b)
		}
		// Every 405 says the same thing the same way: which path takes what.
		if want := tc.path + " takes " + tc.allow; status == 405 && !strings.Contains(string(b), want) {
			t.Errorf("%s %s: 405 body %q does not say %q", tc.method, tc.path, b, want)
		}
	}
}

// callMethod sends an empty request with method to url and returns the
// answer's status, Allow header and body.
func callMethod(t *testing.T, method, url string) (status int, allow string, body []byte) {
	t.Helper()
	r, _ := http.NewRequest(method, url, strings.NewReader(""))
	resp, err := http.DefaultClient.Do(r)
	if err != nil {
		t.Fatal(err)
	}
	body, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp.StatusCode, resp.Header.Get("Allow"), body
}

// Every change made through the admin API is logged: the routing table
// and the sandbox states change nowhere else, and an operator asking why
// a sandbox answers 410 or 503, or goes elsewhere, must find when that was
// decided and from where. Reads and refused calls change nothing.
func TestAdminChangesAreLogged(t *testing.T) {
	logs := new(obsLogBuf)
	h := newHarness(t, func(o *harnessOpts) { o.cfg.Logger = slog.New(slog.NewTextHandler(logs, nil)) })
	for _, tc := range []struct {
		method, path, body, want string
	}{
		{"PUT", "/admin/routes/aud1", `{"HostIP":"127.0.0.1","80":"8080"}`, `msg="admin: route stored" sandbox_id=aud1`},
		{"POST", "/admin/meta/upsert", `{"sandbox_id":"aud2","HostIP":"127.0.0.1"}`, `msg="admin: route stored" sandbox_id=aud2`},
		{"POST", "/admin/backend_cache/delete", `{"sandbox_id":"aud3"}`, `msg="admin: cached route dropped" sandbox_id=aud3`},
		{"POST", "/admin/state", `{"sandbox_id":"aud4","state":"paused"}`, `msg="admin: sandbox state set" sandbox_id=aud4`},
		{"POST", "/admin/meta/delete", `{"sandbox_id":"aud5"}`, `msg="admin: sandbox killed" sandbox_id=aud5`},
		{"DELETE", "/admin/routes/aud1", "", `msg="admin: route deleted" sandbox_id=aud1`},
	} {
		if st, body := h.adminDo(tc.method, tc.path, tc.body, ""); st != 200 {
			t.Fatalf("%s %s: %d %s", tc.method, tc.path, st, body)
		}
		got := logs.String()
		if !strings.Contains(got, tc.want) || !strings.Contains(got, "remote_addr=127.0.0.1") {
			t.Errorf("%s %s: log lacks %s with the caller's address:\n%s", tc.method, tc.path, tc.want, got)
		}
	}
	before := len(logs.String())
	h.adminDo("GET", "/admin/routes", "", "")
	h.adminDo("POST", "/admin/state", `{"sandbox_id":"aud4","state":"nope"}`, "")
	if len(logs.String()) != before {
		t.Errorf("a read or a refused change was logged as a change:\n%s", logs.String()[before:])
	}
}

// meta/delete answers 410 for the sandbox afterwards, on this instance,
// until a sandbox with the same id but a later CreatedAt appears: that
// one is a new sandbox and is served.
func TestKilledSandboxAndItsSuccessor(t *testing.T) {
	h := newHarness(t)
	port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
	p := itoa(port)
	host := p + "-phoenix.cube.test"
	put := func(createdAt int64) {
		t.Helper()
		h.put("phoenix", map[string]string{"HostIP": "127.0.0.1", "SandboxIP": "127.0.0.1", "CreatedAt": fmt.Sprint(createdAt), p: p})
	}
	before := time.Now().Add(-time.Minute).UnixNano()
	put(before)
	if code, _, _ := h.get(host, "/"); code != 200 {
		t.Fatalf("before the kill: %d", code)
	}
	st, out := h.adminJSON("POST", "/admin/meta/delete", `{"sandbox_id":"phoenix"}`)
	if st != 200 || out["ok"] != true || out["backend_cache_deleted"] == nil {
		t.Fatalf("meta/delete: %d %v", st, out)
	}
	// With the memory store the kill deletes the route too, as the
	// README's admin table says: a later restart does not bring it back.
	if st, out := h.adminJSON("GET", "/admin/routes/phoenix", ""); st != 404 {
		t.Fatalf("route after meta/delete: %d %v, want 404", st, out)
	}
	// The control plane has not removed the route yet (or it is Redis's,
	// which meta/delete does not touch): still 410.
	put(before)
	for range 2 {
		if code, body, _ := h.get(host, "/"); code != 410 || !strings.Contains(body, `"sandbox_killed"`) {
			t.Fatalf("killed sandbox: %d %s", code, body)
		}
	}
	// Recreated under the same id after the kill: served.
	put(time.Now().Add(time.Second).UnixNano())
	for range 2 {
		if code, body, _ := h.get(host, "/"); code != 200 || body != "ok" {
			t.Fatalf("sandbox recreated after the kill: %d %s", code, body)
		}
	}
}

// A state set after a kill replaces it: the control plane's latest word,
// which the instances that never saw the kill follow from the store.
func TestStateAfterKillReplacesIt(t *testing.T) {
	h := newHarness(t)
	port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
	for _, tc := range []struct {
		state  string
		status int
	}{
		{"running", 200},
		{"paused", 503},
		{"pausing", 503},
	} {
		t.Run(tc.state, func(t *testing.T) {
			id := "stk" + tc.state
			host := h.route(id, port)
			if st, out := h.adminJSON("POST", "/admin/meta/delete", `{"sandbox_id":"`+id+`"}`); st != 200 {
				t.Fatalf("meta/delete: %d %v", st, out)
			}
			h.route(id, port) // the route outlives the kill (Redis's, or not yet removed)
			if code, body, _ := h.get(host, "/"); code != 410 {
				t.Fatalf("killed: %d %s", code, body)
			}
			if st, out := h.adminJSON("POST", "/admin/state", `{"sandbox_id":"`+id+`","state":"`+tc.state+`"}`); st != 200 {
				t.Fatalf("state: %d %v", st, out)
			}
			if code, body, _ := h.get(host, "/"); code != tc.status {
				t.Fatalf("after state %s: %d %s, want %d", tc.state, code, body, tc.status)
			}
		})
	}
}

// Requests the admin listener's HTTP layer refuses get JSON too.
func TestAdminMalformedRequests(t *testing.T) {
	h := newHarness(t)
	for _, tc := range []struct {
		name, raw string
		status    int
	}{
		{"garbage", "HELLO\r\n\r\n", 400},
		{"bad chunk", "POST /admin/state HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", 400},
		{"huge header", "GET /admin/healthz HTTP/1.1\r\nHost: a\r\nX: " + strings.Repeat("x", 40<<10) + "\r\n\r\n", 431},
		{"huge body", "POST /admin/state HTTP/1.1\r\nHost: a\r\nContent-Length: 2000000\r\n\r\n", 413},
	} {
		c, err := net.Dial("tcp", h.admin)
		if err != nil {
			t.Fatal(err)
		}
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		io.WriteString(c, tc.raw)
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		var out struct{ Error string }
		b, _ := io.ReadAll(resp.Body)
		c.Close()
		if resp.StatusCode != tc.status || json.Unmarshal(b, &out) != nil || out.Error == "" {
			t.Errorf("%s: %d %s %q, want %d with a JSON error", tc.name, resp.StatusCode, resp.Header.Get("Content-Type"), b, tc.status)
		}
	}
}

// The admin listener takes request heads as large as the traffic listener
// does (client.max_header_size), as the platform's nginx did for its admin
// server: a control plane whose tracing adds a few KiB of baggage, or an
// operator's curl behind an SSO proxy with its cookies, was answered 431
// by fasthttp's default 4 KiB buffer.
func TestAdminTakesHeadsUpToTheHeaderLimit(t *testing.T) {
	for _, tc := range []struct {
		name   string
		limit  int // client.max_header_size; 0 = the default, 32 KiB
		header int // bytes of one extra header value
		status int
	}{
		{"default limit, 6 KiB head", 0, 6 << 10, 200},
		{"default limit, 30 KiB head", 0, 30 << 10, 200},
		{"default limit, 40 KiB head", 0, 40 << 10, 431},
		{"raised limit, 40 KiB head", 64 << 10, 40 << 10, 200},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, func(o *harnessOpts) { o.srv.MaxRequestHeaderSize = tc.limit })
			r, _ := http.NewRequest("GET", "http://"+h.admin+"/admin/routes", nil)
			r.Header.Set("Baggage", "k="+strings.Repeat("v", tc.header))
			// The 431 lingers: the client reads it, not a reset.
			resp, err := http.DefaultClient.Do(r)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tc.status {
				t.Errorf("%d %s, want %d", resp.StatusCode, b, tc.status)
			}
		})
	}
}

// The admin and metrics listeners' refusals of a head or body over their
// limits reach a client still sending, as the traffic listener's do: 8 MiB
// is more than the socket buffers hold, so the write completes only if the
// proxy reads on after its answer. With fasthttp's plain close the
// client's write failed on the reset before it could read the 413 or 431;
// on the metrics listener, whose connections were once wrapped in a type
// that hid the TCP connection's CloseWrite, the lingering close was
// skipped the same way.
func TestAdminRefusalsLinger(t *testing.T) {
	h, metrics := metricsHarness(t, "")
	big := strings.Repeat("b", 8<<20)
	for _, tc := range []struct {
		name, addr, req string
		status          int
		code            string
	}{
		{"admin/body over 1 MiB", h.admin, "POST /admin/state HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 8388608\r\n\r\n" + big, 413, CodeBodyTooLarge},
		{"admin/head over the limit", h.admin, "GET /admin/routes HTTP/1.1\r\nHost: 127.0.0.1\r\nBaggage: k=" + big + "\r\n\r\n", 431, "request_header_too_large"},
		{"metrics/body over the limit", metrics, "POST /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 8388608\r\n\r\n" + big, 413, CodeBodyTooLarge},
		{"metrics/head over the limit", metrics, "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nBaggage: k=" + big + "\r\n\r\n", 431, "request_header_too_large"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := dialRaw(t, tc.addr)
			_ = c.SetDeadline(time.Now().Add(20 * time.Second))
			if _, err := io.WriteString(c, tc.req); err != nil {
				t.Fatalf("write: %v (the answer was not lingered)", err)
			}
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			checkProxyError(t, resp, string(b), tc.status, tc.code)
		})
	}
}

// An invalidation that could not be published to the other instances is a
// 503, so that the control plane retries, while this instance's drop
// stands; published ones are 200.
func TestAdminInvalidationNotPublished(t *testing.T) {
	var fail atomic.Bool
	var published atomic.Int64
	h := newHarness(t, func(o *harnessOpts) {
		o.publish = func(string) error {
			if fail.Load() {
				return errors.New("redis: connection pool timeout")
			}
			published.Add(1)
			return nil
		}
	})
	host := h.route("pub", backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })))
	get := func() {
		t.Helper()
		resp := h.do(h.req("GET", host, "/", nil))
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("GET: %d", resp.StatusCode)
		}
	}
	for _, path := range []string{"/admin/backend_cache/delete", "/admin/meta/delete"} {
		get() // cached
		fail.Store(true)
		lookups := h.counts.n.Load()
		st, out := h.adminJSON("POST", path, `{"sandbox_id":"pub"}`)
		if msg, _ := out["error"].(string); st != 503 || out["code"] != CodeNotPublished || !strings.Contains(msg, "publish failed") {
			t.Fatalf("%s with publishing down: %d %v, want 503 %s naming the failed publish", path, st, out, CodeNotPublished)
		}
		if path == "/admin/meta/delete" {
			break // the sandbox is gone now
		}
		get()
		if h.counts.n.Load() == lookups {
			t.Fatalf("%s: the local cache entry survived a failed publish", path)
		}
		fail.Store(false)
		if st, _ := h.adminJSON("POST", path, `{"sandbox_id":"pub"}`); st != 200 || published.Load() == 0 {
			t.Fatalf("%s with publishing up: %d, published %d", path, st, published.Load())
		}
	}
}

// A route change whose routes file cannot be written is answered 500, but
// the change is live in memory (MemoryStore.Put keeps it): the cached copy
// of the old route must go too, or the proxy serves a route that neither
// the store nor the admin API shows any more, for up to the cache TTL.
func TestAdminRouteChangeNotPersistedStillInvalidates(t *testing.T) {
	h := newHarness(t)
	ok := func(body string) uint16 {
		return backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, body) }))
	}
	oldPort, newPort, thirdPort := ok("old"), ok("new"), ok("third")
	h.put("moved", map[string]string{"HostIP": "127.0.0.1", "80": itoa(oldPort)})
	if code, body, _ := h.get("80-moved.cube.test", "/"); code != 200 || body != "old" {
		t.Fatalf("before the change: %d %q", code, body)
	}
	// A routes file in a directory that does not exist: every write fails.
	h.store.SetPersistPath(filepath.Join(t.TempDir(), "missing", "routes.yaml"))

	for _, tc := range []struct{ name, method, path, body, want string }{
		{"PUT", "PUT", "/admin/routes/moved", `{"HostIP":"127.0.0.1","80":"` + itoa(newPort) + `"}`, "new"},
		{"upsert", "POST", "/admin/meta/upsert", `{"sandbox_id":"moved","HostIP":"127.0.0.1","80":"` + itoa(thirdPort) + `"}`, "third"},
	} {
		if code, body, _ := h.get("80-moved.cube.test", "/"); code != 200 {
			t.Fatalf("%s: before: %d %q", tc.name, code, body) // cached now
		}
		st, out := h.adminJSON(tc.method, tc.path, tc.body)
		if msg, _ := out["error"].(string); st != 500 || !strings.Contains(msg, "persist") {
			t.Fatalf("%s: %d %v, want 500 naming the failed write", tc.name, st, out)
		}
		if code, body, _ := h.get("80-moved.cube.test", "/"); code != 200 || body != tc.want {
			t.Errorf("%s: after the change the proxy answers %d %q, want %q (the stored route)", tc.name, code, body, tc.want)
		}
	}
}

// meta/delete on the memory store removes the route; when the routes file
// cannot be written, the caller must hear so (as from DELETE
// /admin/routes/<id>): the route would come back at the next restart.
func TestAdminMetaDeleteNotPersisted(t *testing.T) {
	h := newHarness(t)
	host := h.route("gone", backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })))
	h.store.SetPersistPath(filepath.Join(t.TempDir(), "missing", "routes.yaml"))
	st, out := h.adminJSON("POST", "/admin/meta/delete", `{"sandbox_id":"gone"}`)
	if msg, _ := out["error"].(string); st != 500 || !strings.Contains(msg, "persist") {
		t.Errorf("meta/delete with an unwritable routes file: %d %v, want 500 naming the failed write", st, out)
	}
	// The deletion and the kill stand on this instance.
	if code, body, _ := h.get(host, "/"); code != 410 {
		t.Errorf("after meta/delete: %d %s, want 410", code, body)
	}
}

// Without an admin token, being a loopback client is the credential. A web
// page in a browser on the same host is a loopback client too: it can POST
// to the admin API without a preflight (CSRF, "Content-Type: text/plain")
// and, through DNS rebinding, read its answers. Browsers name such a page
// in Origin and its host name in Host; admin tools send no Origin and
// address the listener by IP or localhost.
func TestAdminWithoutTokenRefusesBrowserPages(t *testing.T) {
	h := newHarness(t)
	_, port, _ := net.SplitHostPort(h.admin)
	upsert := `{"sandbox_id":"csrf","HostIP":"203.0.113.9","80":"80"}`
	for _, tc := range []struct {
		name, method, path, body, host, origin string
		status                                 int
	}{
		{"by IP", "GET", "/admin/routes", "", "127.0.0.1:" + port, "", 200},
		{"by localhost", "GET", "/admin/routes", "", "LocalHost.:" + port, "", 200},
		{"by IPv6 literal", "GET", "/admin/routes", "", "[::1]:" + port, "", 200},
		{"cross-site POST", "POST", "/admin/meta/upsert", upsert, "127.0.0.1:" + port, "http://evil.example", 403},
		{"opaque-origin POST", "POST", "/admin/meta/upsert", upsert, "127.0.0.1:" + port, "null", 403},
		{"DNS rebinding read", "GET", "/admin/routes", "", "rebind.evil.example:" + port, "", 403},
		{"DNS rebinding write", "POST", "/admin/meta/upsert", upsert, "rebind.evil.example:" + port, "", 403},
	} {
		r, _ := http.NewRequest(tc.method, "http://"+h.admin+tc.path, strings.NewReader(tc.body))
		r.Host = tc.host
		if tc.origin != "" {
			r.Header.Set("Origin", tc.origin)
		}
		r.Header.Set("Content-Type", "text/plain")
		resp, err := http.DefaultClient.Do(r)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tc.status || (tc.status == 403 && !strings.Contains(string(b), `"error"`)) {
			t.Errorf("%s: %d %s, want %d", tc.name, resp.StatusCode, b, tc.status)
		}
	}
	if _, ok := h.store.Get("csrf"); ok {
		t.Error("a browser page re-routed a sandbox through the admin API")
	}
	// The Host line is what a browser fills with the page's host name, so
	// it is what counts even when the request line names another host
	// (absolute form, which fasthttp copies over Host).
	for _, tc := range []struct {
		name, target, host string
		status             int
	}{
		{"absolute-form local target, rebinding Host", "http://127.0.0.1:" + port + "/admin/routes", "rebind.evil.example:" + port, 403},
		{"absolute-form foreign target, local Host", "http://rebind.evil.example/admin/routes", "127.0.0.1:" + port, 200},
	} {
		resp, body := rawRequest(t, h.admin, "GET "+tc.target+" HTTP/1.1\r\nHost: "+tc.host+"\r\nConnection: close\r\n\r\n")
		if resp.StatusCode != tc.status {
			t.Errorf("%s: %d %s, want %d", tc.name, resp.StatusCode, body, tc.status)
		}
	}
	if st, _ := h.adminDo("GET", "/admin/healthz", "", ""); st != 200 {
		t.Errorf("healthz: %d", st)
	}

	// With a token configured, the token is the credential, wherever the
	// request comes from (a page cannot send the header cross-origin).
	tok := newHarness(t, func(o *harnessOpts) { o.token = "admin-secret" })
	r, _ := http.NewRequest("GET", "http://"+tok.admin+"/admin/routes", nil)
	r.Host = "admin.internal.example"
	r.Header.Set("Origin", "https://console.internal.example")
	r.Header.Set("X-Cube-Admin-Token", "admin-secret")
	resp, err := http.DefaultClient.Do(r)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("token, any Host and Origin: %d, want 200", resp.StatusCode)
	}
}

// A request that takes long to answer (a tool call, an upload) dates the
// sandbox's activity by its end, as a stream does: an idle reaper polling
// last_active just after it must not find the sandbox idle since the
// request began, and pause it under the agent that just got its answer.
// So too when it ends without an answer: the sandbox cut it (502), or the
// agent gave up on a long call (499). Earlier builds dated those by their
// start, and a reaper saw a sandbox that had worked for minutes idle for
// as long, the moment the call ended.
func TestLastActiveDatesLongRequestsByTheirEnd(t *testing.T) {
	for _, tc := range []struct {
		name   string
		status int // the client's; 0: it left
		end    func(w http.ResponseWriter, r *http.Request, leave context.CancelFunc)
	}{
		{"answered", 200, func(w http.ResponseWriter, _ *http.Request, _ context.CancelFunc) {
			io.WriteString(w, `{"result":"done"}`)
		}},
		{"cut by the sandbox", 502, func(w http.ResponseWriter, _ *http.Request, _ context.CancelFunc) {
			c, _, err := http.NewResponseController(w).Hijack()
			if err == nil {
				c.Close()
			}
		}},
		{"client left", 0, func(_ http.ResponseWriter, r *http.Request, leave context.CancelFunc) {
			leave()
			<-r.Context().Done() // the proxy closed the sandbox connection
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			arrived, release := make(chan struct{}), make(chan struct{})
			reqCtx, leave := context.WithCancel(context.Background())
			defer leave()
			host := h.route("slowcall", backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				close(arrived)
				<-release
				tc.end(w, r, leave)
			})))
			done := h.goStatus(h.req("POST", host, "/mcp", strings.NewReader("{}")).WithContext(reqCtx))
			testenv.Recv(t, arrived, 10*time.Second, "the slow request at the sandbox")
			// The request started at or before mark; it ends after it.
			mark := passedMilli()
			close(release)
			if st := testenv.Recv(t, done, 10*time.Second, "the client's end"); st != tc.status {
				t.Fatalf("slow request: %d, want %d", st, tc.status)
			}
			h.wantActiveAfter(t, "slowcall", mark, "a request that ended")
		})
	}
}

// passedMilli returns the unix millisecond it was called in, once that
// millisecond has passed: what starts before the call and ends after it
// is dated after the mark.
func passedMilli() int64 {
	mark := time.Now().UnixMilli()
	for time.Now().UnixMilli() <= mark {
		runtime.Gosched()
	}
	return mark
}

// wantActiveAfter fails t unless sandbox id, once its requests have ended
// on the proxy's side too (the client may know first, and while one is in
// flight the sandbox is active now whatever its date), is listed by
// last_active as active after mark: dated by the end of what, not its
// start.
func (h *harness) wantActiveAfter(t *testing.T, id string, mark int64, what string) {
	t.Helper()
	sb := h.proxy.sandboxes.peek(id)
	testenv.Eventually(t, 10*time.Second, func() error {
		if n := sb.inFlight(); n != 0 {
			return fmt.Errorf("%d requests in flight", n)
		}
		return nil
	})
	st, out := h.adminJSON("GET", fmt.Sprintf("/admin/last_active?since=%d", mark+1), "")
	entries, _ := out["entries"].(map[string]any)
	if ts, ok := entries[id].(float64); st != 200 || !ok || int64(ts) <= mark {
		t.Fatalf("last_active after %s after %d: %d %v; want the sandbox dated by its end", what, mark, st, out)
	}
}

// GET /metrics is listed among the admin endpoints whose wrong method is a
// 405 with Allow: a POST or DELETE there (a misconfigured scraper, a
// control plane calling the wrong path) must not read as a scrape, with
// the token or through metrics_loopback_open alike.
func TestAdminMetricsWrongMethod(t *testing.T) {
	h := newHarness(t)
	metrics := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "up 1\n") })
	for _, loopbackOpen := range []bool{false, true} {
		admin := NewAdmin(AdminConfig{Metrics: metrics, MetricsLoopback: loopbackOpen}, h.proxy)
		srv := &fasthttp.Server{Handler: admin.Handler}
		ln := listen(t, "127.0.0.1:0")
		go srv.Serve(ln)
		t.Cleanup(func() { _ = srv.Shutdown() })
		for _, tc := range []struct {
			method string
			status int
			allow  string
		}{
			{"GET", 200, ""},
			{"HEAD", 200, ""},
			{"POST", 405, "GET, HEAD"},
			{"PUT", 405, "GET, HEAD"},
			{"DELETE", 405, "GET, HEAD"},
		} {
			status, allow, b := callMethod(t, tc.method, "http://"+ln.Addr().String()+"/metrics")
			if status != tc.status || allow != tc.allow {
				t.Errorf("loopback open %v: %s /metrics: %d Allow %q %q, want %d Allow %q",
					loopbackOpen, tc.method, status, allow, b, tc.status, tc.allow)
			}
		}
	}
}

// FuzzAdminHandler sends any method, target and body to the admin API (as
// a local client, so past the auth check) and checks every answer is one
// of the documented statuses with a JSON object body, an "error" string
// on a failure, and Allow on a 405; and that the route table it changes
// holds only routes as the route decoder builds them.
func FuzzAdminHandler(f *testing.F) {
	for _, s := range [][3]string{
		{"GET", "/admin/healthz", ""},
		{"POST", "/admin/meta/upsert", `{"sandbox_id":"adm","HostIP":"127.0.0.1","CreatedAt":1700000000123456789,"AllowPublicTraffic":true,"80":8080}`},
		{"POST", "/admin/meta/upsert", `{"sandbox_id":"x","HostIP":"127.0.0.1"} {}`},
		{"PUT", "/admin/routes/box", `{"HostIP":"127.0.0.1","SandboxIP":"127.0.0.1","CreatedAt":"1","80":"80"}`},
		{"PUT", "/admin/routes/box", `null`},
		{"DELETE", "/admin/routes/box", ""},
		{"GET", "/admin/routes/Bad%2Fid", ""},
		{"POST", "/admin/backend_cache/delete", `{"sandbox_id":"box"}`},
		{"POST", "/admin/meta/delete", `{"sandbox_id":"box"}`},
		{"POST", "/admin/state", `{"sandbox_id":"box","state":"paused"}`},
		{"GET", "/admin/last_active?since=-1", ""},
		{"GET", "/admin/last_active?since=99999999999999999999", ""},
		{"POST", "/admin/tokens", `{"sandbox_id":"box","port":1e3,"ttl":"1h"}`},
		{"PATCH", "/admin/state", ""},
		{"GET", "/admin/../metrics", ""},
	} {
		f.Add(s[0], s[1], []byte(s[2]))
	}
	signer := testSigner(f)
	p, store := bareProxy(f)
	a := NewAdmin(AdminConfig{Routes: store, Signer: signer}, p)
	statuses := map[int]bool{200: true, 400: true, 404: true, 405: true, 500: true, 503: true}
	addr := &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 40000}
	f.Fuzz(func(t *testing.T, method, target string, body []byte) {
		raw := fmt.Sprintf("%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: %d\r\n\r\n%s", method, target, len(body), body)
		var ctx fasthttp.RequestCtx
		ctx.Init(&fasthttp.Request{}, addr, nil)
		if err := ctx.Request.Read(bufio.NewReader(strings.NewReader(raw))); err != nil {
			return // fasthttp's 400, before the handler
		}
		a.Handler(&ctx)
		st, out := ctx.Response.StatusCode(), ctx.Response.Body()
		if !statuses[st] {
			t.Fatalf("%s %s: status %d: %s", method, target, st, out)
		}
		if ctx.IsHead() {
			return
		}
		var obj map[string]any
		if err := json.Unmarshal(out, &obj); err != nil {
			t.Fatalf("%s %s: %d, body %q is not a JSON object", method, target, st, out)
		}
		if msg, _ := obj["error"].(string); st >= 400 && msg == "" {
			t.Fatalf("%s %s: %d without an error: %s", method, target, st, out)
		}
		if st == 405 && len(ctx.Response.Header.Peek("Allow")) == 0 {
			t.Fatalf("%s %s: 405 without Allow", method, target)
		}
		// Whatever the body said, the table holds only routes the proxy
		// may dial: each one is what its own fields decode to (a valid id,
		// a HostIP that is neither unspecified nor zoned, ports 1..65535).
		for _, r := range store.List() {
			again, err := routing.ParseRoute(r.ID, r.Fields())
			if err != nil || !reflect.DeepEqual(r, again) || !r.HostIP.IsValid() || r.HostIP.IsUnspecified() || r.HostIP.Zone() != "" {
				t.Fatalf("%s %s stored route %+v; its fields decode to %+v, %v", method, target, r, again, err)
			}
		}
	})
}

// POST /admin/tokens refuses a field it does not know: a caller that
// spells the lifetime its own way ("ttl_seconds", "expires_in") would
// otherwise get a 200 and a token of the default 10 minutes, found out only
// when its users are refused. A field given twice or in another case is
// refused too, rather than the last copy deciding the token's sandbox or
// lifetime.
func TestAdminTokensRefuseUnknownFields(t *testing.T) {
	h := newHarness(t)
	signer := testSigner(t)
	ln := listen(t, "127.0.0.1:0")
	srv := &fasthttp.Server{Handler: NewAdmin(AdminConfig{Signer: signer}, h.proxy).Handler}
	go srv.Serve(ln)
	t.Cleanup(func() { _ = srv.Shutdown() })
	for _, tc := range []struct {
		body   string
		status int
		want   string // in the error
	}{
		{`{"sandbox_id":"box","port":8080,"ttl":"1h"}`, 200, ""},
		{`{"sandbox_id":"box","port":8080,"ttl_seconds":3600}`, 400, "ttl_seconds"},
		{`{"sandbox_id":"box","port":8080,"expires_in":"1h"}`, 400, "expires_in"},
		// Ambiguous bodies: the struct decoding took the last copy, and
		// a name in any case.
		{`{"sandbox_id":"box","port":8080,"ttl":"1m","ttl":"24h"}`, 400, `"ttl" given twice`},
		{`{"sandbox_id":"box","port":8080,"TTL":"24h"}`, 400, `unknown field "TTL"`},
		{`{"sandbox_id":"box","Sandbox_ID":"other","port":8080}`, 400, `unknown field "Sandbox_ID"`},
		{`{"sandbox_id":"box","port":8080} {}`, 400, "trailing data"},
		// What is wrong, said as such: "required" for a value given puzzled.
		{`{"port":8080}`, 400, "sandbox_id (a sandbox id) is required"},
		{`{"sandbox_id":"box"}`, 400, "port (1-65535) is required"},
		{`{"sandbox_id":"Box!","port":8080}`, 400, `sandbox_id "Box!" is not a sandbox id`},
		{`{"sandbox_id":"box","port":0}`, 400, "port 0 is not a port (1-65535)"},
		{`{"sandbox_id":"box","port":65536}`, 400, "port 65536 is not a port (1-65535)"},
		// A number that is no whole one is a bad port too, said so
		// rather than as Go's strconv error.
		{`{"sandbox_id":"box","port":80.5}`, 400, "port 80.5 is not a port (1-65535)"},
		{`{"sandbox_id":"box","port":1e2}`, 400, "port 1e2 is not a port (1-65535)"},
		{`{"sandbox_id":"box","port":99999999999999999999}`, 400, "port 99999999999999999999 is not a port (1-65535)"},
	} {
		resp, err := http.Post("http://"+ln.Addr().String()+"/admin/tokens", "application/json", strings.NewReader(tc.body))
		if err != nil {
			t.Fatal(err)
		}
		var out struct {
			Error string `json:"error"`
			Token string `json:"token"`
		}
		err = json.NewDecoder(resp.Body).Decode(&out)
		resp.Body.Close()
		if err != nil || resp.StatusCode != tc.status || !strings.Contains(out.Error, tc.want) || (tc.status == 200) != (out.Token != "") {
			t.Errorf("%s: %d %+v (%v), want %d naming %q", tc.body, resp.StatusCode, out, err, tc.status, tc.want)
		}
	}
}

// meta/delete ends what the killed sandbox still has open on this
// instance: an event stream, a WebSocket and a request waiting for its
// answer. A killed VM's connections often never reset (its address just
// stops answering), so without this an agent's SSE stream kept getting
// the proxy's heartbeats for upstream.idle_timeout (2 h) instead of
// reconnecting to learn of the 410, and the stuck exchanges held the
// id's max_streams_per_sandbox slots: the sandbox recreated under that id
// got 429.
func TestKillEndsTheSandboxsOpenExchanges(t *testing.T) {
	h, logs := logHarness(t, "json", func(o *harnessOpts) { o.cfg.MaxStreamsPerSandbox = 3 })
	wsEnded := make(chan error, 1)
	wsPort := wsBackend(t, wsEnded)
	arrived := make(chan struct{}, 1)
	httpPort := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/sse":
			w.Header().Set("Content-Type", "text/event-stream")
			io.WriteString(w, "data: hi\n\n")
			w.(http.Flusher).Flush()
		case "/slow":
			arrived <- struct{}{}
		default:
			io.WriteString(w, "ok")
			return
		}
		<-r.Context().Done() // the sandbox never ends these itself
	}))
	wp, hp := itoa(wsPort), itoa(httpPort)
	put := func(createdAt time.Time) {
		h.put("doomed", map[string]string{"HostIP": "127.0.0.1", "SandboxIP": "127.0.0.1",
			"CreatedAt": fmt.Sprint(createdAt.UnixNano()), wp: wp, hp: hp})
	}
	put(time.Now().Add(-time.Minute))
	httpHost := hp + "-doomed.cube.test"

	sse := h.do(h.req("GET", httpHost, "/sse", nil))
	defer sse.Body.Close()
	br := bufio.NewReader(sse.Body)
	if line, err := br.ReadString('\n'); err != nil || line != "data: hi\n" {
		t.Fatalf("first event: %q %v", line, err)
	}
	ws := dialWS(t, h, wp+"-doomed.cube.test")
	defer ws.CloseNow()
	slow := make(chan *http.Response, 1)
	go func() {
		resp, err := h.client.Do(h.req("POST", httpHost, "/slow", strings.NewReader("work")))
		if err != nil {
			t.Error(err)
			resp = nil
		}
		slow <- resp
	}()
	testenv.Recv(t, arrived, 10*time.Second, "the slow request at the sandbox")

	if st, out := h.adminJSON("POST", "/admin/meta/delete", `{"sandbox_id":"doomed"}`); st != 200 {
		t.Fatalf("meta/delete: %d %v", st, out)
	}

	sseEnded := make(chan error, 1)
	go func() {
		_, err := io.Copy(io.Discard, br)
		sseEnded <- err
	}()
	wsRead := make(chan error, 1)
	go func() {
		_, _, err := ws.Read(context.Background())
		wsRead <- err
	}()
	limit := time.After(5 * time.Second)
	for pending := 4; pending > 0; pending-- {
		select {
		case <-sseEnded:
		case <-wsRead:
		case <-wsEnded:
		case resp := <-slow:
			if resp == nil {
				t.FailNow()
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 410 || !strings.Contains(string(b), `"sandbox_killed"`) {
				t.Errorf("request waiting for the killed sandbox's answer: %d %s, want 410 sandbox_killed", resp.StatusCode, b)
			}
			// The proxy's own answer, though the sandbox had been asked:
			// 330 is for the sandbox's answer or its exchange's failure.
			if got := resp.Header.Get(HeaderRetcode); got != "310410" {
				t.Errorf("request waiting for the killed sandbox's answer: %s %q, want 310410", HeaderRetcode, got)
			}
		case <-limit:
			t.Fatalf("%d of the killed sandbox's exchanges (SSE stream, WebSocket both ways, waiting request) still open", pending)
		}
	}

	// Recreated under the same id: its requests have every slot.
	put(time.Now().Add(time.Second))
	testenv.WaitFor(t, 5*time.Second, "the killed sandbox's exchanges released", func() bool {
		s, w := h.proxy.streams.open()
		return s == 0 && w == 0 && h.proxy.sandboxes.peek("doomed").inFlight() == 0
	})
	if code, body, _ := h.get(httpHost, "/"); code != 200 || body != "ok" {
		t.Fatalf("recreated sandbox: %d %s", code, body)
	}
	// The cut stream and WebSocket say why in the access log: neither the
	// sandbox nor a drain ended them.
	testenv.WaitFor(t, 5*time.Second, "access log lines with error_code sandbox_killed", func() bool {
		return strings.Count(logs.String(), `"error_code":"sandbox_killed"`) >= 3 // with the waiting request's 410
	})
}

// The client's address is part of the admin credential: without a token
// only loopback clients are served, and with one /metrics skips the token
// (metrics_loopback_open) for loopback clients only. The Host and Origin rules
// alone would let any host on the network that addresses the listener by
// IP re-route every sandbox, should the listener ever be reachable.
func TestAdminLoopbackRuleChecksTheClientAddress(t *testing.T) {
	p, store := bareProxy(t)
	metrics := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "# metrics\n") })
	open := NewAdmin(AdminConfig{Routes: store}, p)
	withToken := NewAdmin(AdminConfig{Token: "admin-secret", Routes: store, Metrics: metrics, MetricsLoopback: true}, p)
	for _, tc := range []struct {
		name   string
		admin  *Admin
		path   string
		from   string
		status int
	}{
		{"no token, IPv4 loopback", open, "/admin/routes", "127.0.0.1", 200},
		{"no token, IPv6 loopback", open, "/admin/routes", "::1", 200},
		{"no token, mapped loopback", open, "/admin/routes", "::ffff:127.0.0.1", 200},
		{"no token, other host", open, "/admin/routes", "192.0.2.7", 403},
		{"no token, other IPv6 host", open, "/admin/routes", "2001:db8::7", 403},
		{"metrics without token, loopback", withToken, "/metrics", "127.0.0.1", 200},
		{"metrics without token, other host", withToken, "/metrics", "192.0.2.7", 403},
		{"routes without token, loopback", withToken, "/admin/routes", "127.0.0.1", 403},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var ctx fasthttp.RequestCtx
			ctx.Init(&fasthttp.Request{}, &net.TCPAddr{IP: net.ParseIP(tc.from), Port: 40000}, nil)
			ctx.Request.SetRequestURI(tc.path)
			ctx.Request.Header.SetHost("127.0.0.1:8082")
			tc.admin.Handler(&ctx)
			if st := ctx.Response.StatusCode(); st != tc.status {
				t.Fatalf("GET %s from %s: %d %s, want %d", tc.path, tc.from, st, ctx.Response.Body(), tc.status)
			}
		})
	}
}

// GET /admin/last_active at the scale of a busy node (the operator polls
// it every few seconds, with 50k-100k sandboxes active) went through a map
// and encoding/json: sorted keys and two allocations per sandbox, ≈ 570 ms
// of CPU a poll at 100k. The answer is written directly now (≈ 150 ms, the
// walk): the buffer's growth is all it allocates, and the JSON is the same.
func TestLastActiveAtScale(t *testing.T) {
	h := newHarness(t)
	a := NewAdmin(AdminConfig{}, h.proxy)
	const n = 10000
	now := time.Now().UnixMilli()
	for i := range n {
		e := h.proxy.sandboxes.get([]byte("sbx-" + strconv.Itoa(i)))
		e.lastActive.Store(now - int64(i))
	}
	h.proxy.sandboxes.get([]byte("open")).enter() // a stream open: active now
	h.proxy.sandboxes.get([]byte("never"))        // no request yet: not listed
	since := now - n/2 + 1                        // half the sandboxes, and the open one
	var ctx fasthttp.RequestCtx
	ctx.Request.SetRequestURI("/admin/last_active?since=" + strconv.FormatInt(since, 10))
	allocs := testing.AllocsPerRun(5, func() {
		ctx.Response.Reset()
		a.lastActive(&ctx)
	})
	if allocs > 100 { // the buffer grows by doubling: O(log n), not one per sandbox
		t.Errorf("last_active over %d sandboxes: %.0f allocations, want no more than the buffer's growth", n, allocs)
	}
	var out struct {
		Now, Since, Count int64
		Entries           map[string]int64
	}
	if err := json.Unmarshal(ctx.Response.Body(), &out); err != nil {
		t.Fatalf("last_active answer is not JSON: %v", err)
	}
	if ct := string(ctx.Response.Header.ContentType()); ctx.Response.StatusCode() != 200 || ct != "application/json" {
		t.Errorf("last_active: %d %s", ctx.Response.StatusCode(), ct)
	}
	if out.Since != since || out.Now < now || out.Count != n/2+1 || len(out.Entries) != n/2+1 {
		t.Fatalf("last_active since %d: now %d since %d count %d, %d entries; want %d", since, out.Now, out.Since, out.Count, len(out.Entries), n/2+1)
	}
	for i := range n / 2 {
		if id := "sbx-" + strconv.Itoa(i); out.Entries[id] != now-int64(i) {
			t.Fatalf("entry %s: %d, want %d", id, out.Entries[id], now-int64(i))
		}
	}
	if out.Entries["open"] != out.Now {
		t.Errorf("sandbox with a stream open: %d, want now (%d)", out.Entries["open"], out.Now)
	}
}

// GET /admin/routes pages through the table in id order: a page of limit
// routes after the id given, with next set while more remain, so a table
// of 100k routes need not come as one 25 MB answer.
func TestAdminRoutesPaged(t *testing.T) {
	h := newHarness(t)
	ids := []string{"pg-a", "pg-b", "pg-c", "pg-d", "pg-e"}
	for _, id := range ids {
		h.put(id, map[string]string{"HostIP": "127.0.0.1", "8080": "8080"})
	}
	page := func(out map[string]any) (got []string) {
		routes, _ := out["routes"].(map[string]any) // nil in an error's answer
		for id := range routes {
			got = append(got, id)
		}
		slices.Sort(got)
		return got
	}
	for _, tc := range []struct {
		query string
		want  []string
		next  any // nil: no more pages
	}{
		{"", ids, nil},
		{"?limit=2", ids[:2], "pg-b"},
		{"?limit=2&after=pg-b", ids[2:4], "pg-d"},
		{"?limit=2&after=pg-d", ids[4:], nil},
		{"?limit=5", ids, nil},
		{"?after=pg-c", ids[3:], nil},
		{"?after=pg-bb&limit=1", ids[2:3], "pg-c"}, // an id no route has
		{"?after=pg-e", nil, nil},
		// A positive number too large for an int is still one: every route.
		{"?limit=99999999999999999999", ids, nil},
	} {
		st, out := h.adminJSON("GET", "/admin/routes"+tc.query, "")
		if got := page(out); st != 200 || !slices.Equal(got, tc.want) || out["count"] != float64(len(tc.want)) || out["next"] != tc.next {
			t.Errorf("%s: %d %v, want routes %v next %v", tc.query, st, out, tc.want, tc.next)
		}
	}
	for _, q := range []string{"?limit=0", "?limit=-1", "?limit=x", "?limit=", "?after=Not%20an%20id"} {
		if st, out := h.adminJSON("GET", "/admin/routes"+q, ""); st != 400 || out["error"] == nil {
			t.Errorf("%s: %d %v, want 400 with an error", q, st, out)
		}
	}
}

// A delete answered 500 (routes file not written) is retried by its
// caller. The route is gone from memory by then, but not from the file:
// the retry must not be a 200 while the file still holds the route, which
// the next restart would serve again.
func TestAdminRetriedDeleteNotPersisted(t *testing.T) {
	for _, tc := range []struct{ name, method, path, body string }{
		{"DELETE", "DELETE", "/admin/routes/gone", ""},
		{"meta/delete", "POST", "/admin/meta/delete", `{"sandbox_id":"gone"}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			h.route("gone", 8080)
			h.store.SetPersistPath(filepath.Join(t.TempDir(), "missing", "routes.yaml"))
			for _, try := range []string{"first", "retry"} {
				st, out := h.adminJSON(tc.method, tc.path, tc.body)
				if msg, _ := out["error"].(string); st != 500 || !strings.Contains(msg, "routes file") {
					t.Errorf("%s with an unwritable routes file: %d %v, want 500 naming the routes file", try, st, out)
				}
			}
		})
	}
}

// metrics_loopback_open lets a local scraping agent read /metrics without
// the admin token. A web page in a browser on the node is a loopback
// client too, and through DNS rebinding (its own name resolved to
// 127.0.0.1) could read what the scrape says; the tokenless admin API
// refuses such a caller by its Origin and its Host, and the open /metrics
// must refuse it alike. A scraper sends neither and gets the metrics.
func TestAdminMetricsLoopbackOpenRefusesBrowsers(t *testing.T) {
	h := newHarness(t)
	metrics := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "up 1\n") })
	admin := NewAdmin(AdminConfig{Token: "admin-secret", Metrics: metrics, MetricsLoopback: true}, h.proxy)
	srv := &fasthttp.Server{Handler: admin.Handler}
	ln := listen(t, "127.0.0.1:0")
	go srv.Serve(ln)
	t.Cleanup(func() { _ = srv.Shutdown() })
	for _, tc := range []struct {
		name, host, origin string
		status             int
	}{
		{"scraper by IP", "", "", 200},
		{"scraper by localhost", "localhost", "", 200},
		{"page of a rebound name", "rebind.example", "", 403},
		{"page sending its Origin", "", "http://rebind.example", 403},
	} {
		r, err := http.NewRequest("GET", "http://"+ln.Addr().String()+"/metrics", nil)
		if err != nil {
			t.Fatal(err)
		}
		if tc.host != "" {
			r.Host = tc.host
		}
		if tc.origin != "" {
			r.Header.Set("Origin", tc.origin)
		}
		resp, err := http.DefaultClient.Do(r)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tc.status {
			t.Errorf("%s: GET /metrics %d %q, want %d", tc.name, resp.StatusCode, body, tc.status)
		}
	}
}

// last_active's since is a whole number of unix milliseconds or absent:
// an empty one ("?since=", a control plane's unset variable) is neither,
// and answering it as 0 sent every sandbox this instance holds to a
// caller that asked for the recent ones, where limit= and after= say 400.
func TestLastActiveRefusesAnEmptySince(t *testing.T) {
	h := newHarness(t)
	for _, q := range []string{"?since=", "?since", "?since=&x=1"} {
		if st, out := h.adminJSON("GET", "/admin/last_active"+q, ""); st != 400 || out["error"] == nil {
			t.Errorf("GET /admin/last_active%s: %d %v, want 400 with an error", q, st, out)
		}
	}
	if st, out := h.adminJSON("GET", "/admin/last_active", ""); st != 200 || out["since"] != float64(0) {
		t.Errorf("GET /admin/last_active without since: %d %v, want 200 since 0", st, out)
	}
	// A whole number ≥ 0 is taken, however large (README): one past int64
	// is the far future, no sandbox active since, not a 400 saying it is
	// no unix milliseconds.
	if st, out := h.adminJSON("GET", "/admin/last_active?since=99999999999999999999", ""); st != 200 || out["count"] != float64(0) {
		t.Errorf("GET /admin/last_active?since=99999999999999999999: %d %v, want 200 with no entries", st, out)
	}
}

// A query parameter given twice is refused, as a body member given twice
// is: readers disagree on which copy counts (this one took the first, so
// ?limit=1&limit=0 answered a page of 1 and ?limit=0&limit=1 a 400, and a
// proxy or client library in between may take the last).
func TestAdminQueryParameterTwice(t *testing.T) {
	h := newHarness(t)
	for _, q := range []string{
		"/admin/routes?limit=1&limit=0",
		"/admin/routes?limit=1&limit=1",
		"/admin/routes?after=a&after=Bad.Id",
		"/admin/routes?limit=2&after=a&after=b",
		"/admin/last_active?since=0&since=bad",
		"/admin/last_active?since=5&since=5",
	} {
		st, out := h.adminJSON("GET", q, "")
		if msg, _ := out["error"].(string); st != 400 || !strings.Contains(msg, "given twice") {
			t.Errorf("GET %s: %d %v, want 400 saying a parameter was given twice", q, st, out)
		}
	}
	for _, q := range []string{"/admin/routes?limit=1&after=a", "/admin/last_active?since=5&x=1&x=2"} {
		if st, out := h.adminJSON("GET", q, ""); st != 200 {
			t.Errorf("GET %s: %d %v, want 200", q, st, out)
		}
	}
}

// POST /admin/tokens issues tokens that live 1s to 24h, 10 minutes when
// ttl is left out, and says until when in expires_at: a bound let slip
// would hand a browser a token that outlives the session it was meant for.
func TestAdminTokenLifetimeBounds(t *testing.T) {
	h := newHarness(t)
	ln := listen(t, "127.0.0.1:0")
	srv := &fasthttp.Server{Handler: NewAdmin(AdminConfig{Signer: testSigner(t)}, h.proxy).Handler}
	go srv.Serve(ln)
	t.Cleanup(func() { _ = srv.Shutdown() })
	for _, tc := range []struct {
		ttl    string // the member, "" = left out
		status int
		life   time.Duration // of a 200's token
	}{
		{"", 200, 10 * time.Minute},
		{`"1s"`, 200, time.Second},
		{`"24h"`, 200, 24 * time.Hour},
		{`"24h0m1s"`, 400, 0},
		{`"25h"`, 400, 0},
		{`"999ms"`, 400, 0},
		{`"0s"`, 400, 0},
		{`"-1h"`, 400, 0},
		{`"10"`, 400, 0},
	} {
		body := `{"sandbox_id":"box","port":8080}`
		if tc.ttl != "" {
			body = `{"sandbox_id":"box","port":8080,"ttl":` + tc.ttl + `}`
		}
		before := time.Now()
		resp, err := http.Post("http://"+ln.Addr().String()+"/admin/tokens", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		var out struct {
			Error      string `json:"error"`
			Token      string `json:"token"`
			ExpiresAt  string `json:"expires_at"`
			QueryParam string `json:"query_param"`
		}
		err = json.NewDecoder(resp.Body).Decode(&out)
		resp.Body.Close()
		if err != nil || resp.StatusCode != tc.status {
			t.Errorf("ttl %s: %d %+v (%v), want %d", tc.ttl, resp.StatusCode, out, err, tc.status)
			continue
		}
		if tc.status != 200 {
			if out.Error == "" {
				t.Errorf("ttl %s: %d without an error message", tc.ttl, resp.StatusCode)
			}
			continue
		}
		exp, err := time.Parse(time.RFC3339, out.ExpiresAt)
		// expires_at is whole seconds, rounded up: the token lives at
		// least ttl, and less than a second more. Rounded down, a 1s
		// token issued at x.999 lived a millisecond.
		if lo, hi := before.Add(tc.life), time.Now().Add(tc.life+time.Second); err != nil || out.Token == "" ||
			out.QueryParam == "" || exp.Before(lo) || exp.After(hi) {
			t.Errorf("ttl %s: %+v (%v), want a token expiring between %v and %v", tc.ttl, out, err, lo, hi)
		}
		if _, err := testSigner(t).Verify(out.Token, "box", 8080, before.Add(tc.life-time.Millisecond)); err != nil {
			t.Errorf("ttl %s: token refused a millisecond before its ttl ran out: %v", tc.ttl, err)
		}
	}
}

// A /admin/state with a state that is none of the three quotes what it
// got, escaped and cut as route errors quote client input: the 400 said
// only what is allowed, and a control plane that sent "resumed" or
// "Paused" had to find in its own logs what it sent.
func TestAdminStateQuotesTheRejectedValue(t *testing.T) {
	h := newHarness(t)
	long := strings.Repeat("p", 100)
	for _, tc := range []struct{ name, state, want string }{
		{"unknown word", `"resumed"`, `state must be running, pausing or paused, not "resumed"`},
		{"other case", `"Paused"`, `state must be running, pausing or paused, not "Paused"`},
		{"empty", `""`, `state must be running, pausing or paused, not ""`},
		{"escaped", `"run\"ning\n"`, `state must be running, pausing or paused, not "run\"ning\n"`},
		{"long", `"` + long + `"`, `state must be running, pausing or paused, not "` + long[:64] + `"...`},
		// Cut before a character the limit would split, not inside it.
		{"long, cut at a character", `"` + long[:63] + `é"`, `state must be running, pausing or paused, not "` + long[:63] + `"...`},
	} {
		st, out := h.adminJSON("POST", "/admin/state", `{"sandbox_id":"qstate","state":`+tc.state+`}`)
		if msg, _ := out["error"].(string); st != 400 || msg != tc.want {
			t.Errorf("%s: %d %q, want 400 %q", tc.name, st, msg, tc.want)
		}
	}
}
