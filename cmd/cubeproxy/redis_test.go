package main

// End-to-end tests of the Redis route store through the whole program:
// real redis-server (internal/testenv), serve() in-process or the built
// binary, real HTTP backends on loopback.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
	"github.com/cube-sandbox/cubeproxy/routing/redisstore"
)

// redisContainerPort is the sandbox port every test route exposes.
const redisContainerPort = 50005

// redisCreatedAt is a CreatedAt as the control plane writes it (unix ns).
const redisCreatedAt = "1764460000000000000"

// redisProxy is one in-process proxy started through serve().
type redisProxy struct {
	a      *app
	http   string // sandbox traffic address
	admin  string // admin API address
	domain string
	logs   *syncBuffer
	client *http.Client
	stop   func() // cancel serve and wait for it (also run at cleanup)
}

// startRedisProxy runs serve() on the Redis store at redisAddr with
// loopback listeners; extra flags are appended (and win).
func startRedisProxy(t *testing.T, redisAddr string, extra ...string) *redisProxy {
	t.Helper()
	args := append([]string{
		"--store", "redis", "--redis-addr", redisAddr,
		"--http-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0",
		"--domains", "cube.test", "--access-log-format", "off", "--drain-timeout", "1s",
	}, extra...)
	return startServe(t, args, noEnv, "cube.test")
}

// startServe runs serve(args) until the test ends.
func startServe(t *testing.T, args []string, getenv func(string) string, domain string) *redisProxy {
	t.Helper()
	r := runServe(t, args, getenv)
	a := r.a
	return &redisProxy{
		a: a, http: a.httpLn.Addr().String(), admin: a.adminLn.Addr().String(), domain: domain, logs: r.logs,
		client: &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 5 * time.Second},
		stop:   r.stop,
	}
}

// redisReply is one answer of the proxy.
type redisReply struct {
	status int
	body   string
	header http.Header
	took   time.Duration
}

// code is the "code" of a JSON error body.
func (r redisReply) code() string {
	var e struct{ Code string }
	_ = json.Unmarshal([]byte(r.body), &e)
	return e.Code
}

// get requests port redisContainerPort of sandbox id through the proxy.
func (p *redisProxy) get(t *testing.T, id string) redisReply {
	t.Helper()
	return p.getPort(t, id, redisContainerPort)
}

func (p *redisProxy) getPort(t *testing.T, id string, port int) redisReply {
	t.Helper()
	req, err := http.NewRequest("GET", "http://"+p.http+"/", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Host = fmt.Sprintf("%d-%s.%s", port, id, p.domain)
	return p.do(t, req)
}

func (p *redisProxy) do(t *testing.T, req *http.Request) redisReply {
	t.Helper()
	start := time.Now()
	resp, err := p.client.Do(req)
	if err != nil {
		t.Fatalf("%s %s (Host %s): %v", req.Method, req.URL, req.Host, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("read body of %s: %v", req.Host, err)
	}
	return redisReply{status: resp.StatusCode, body: string(body), header: resp.Header, took: time.Since(start)}
}

// adminPost posts {"sandbox_id": id} to an admin endpoint.
func (p *redisProxy) adminPost(t *testing.T, path, id, token string) redisReply {
	t.Helper()
	req, err := http.NewRequest("POST", "http://"+p.admin+path, strings.NewReader(`{"sandbox_id":"`+id+`"}`))
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("X-Cube-Admin-Token", token)
	}
	return p.do(t, req)
}

func (p *redisProxy) adminGet(t *testing.T, path string) redisReply {
	t.Helper()
	req, err := http.NewRequest("GET", "http://"+p.admin+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	return p.do(t, req)
}

// redisBackend is a sandbox stand-in that answers its name; it returns its port.
func redisBackend(t *testing.T, name string) int {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, name)
	}))
	t.Cleanup(srv.Close)
	return srv.Listener.Addr().(*net.TCPAddr).Port
}

// cpFields is a route as the control plane writes it: every field a
// string, one field per container port, plus a field CubeProxy does not know.
func cpFields(hostIP, sandboxIP string, hostPort int) []any {
	return []any{
		"HostIP", hostIP,
		"SandboxIP", sandboxIP,
		"CreatedAt", redisCreatedAt,
		"AllowPublicTraffic", "true",
		strconv.Itoa(redisContainerPort), strconv.Itoa(hostPort),
		"ControlPlaneExtra", "ignored",
	}
}

// hsetRoute writes one hash with a single HSET, like the control plane.
func hsetRoute(t *testing.T, r *testenv.Redis, key string, fields ...any) {
	t.Helper()
	if err := r.Client().HSet(context.Background(), key, fields...).Err(); err != nil {
		t.Fatalf("hset %s: %v", key, err)
	}
}

// subscribed waits until the proxy has applied its first invalidation
// subscription. Applying it expires every cached route and drops every
// cached 404 (invalidations may have been published before it), and a
// lookup in flight meanwhile is answered but not cached: a test that
// counts store reads, or needs an answer cached, starts after it.
// waitSubscribers is not enough: Redis counts the subscriber before the
// proxy has read the confirmation.
func (p *redisProxy) subscribed(t *testing.T) {
	t.Helper()
	waitSubscribed(t, p.a, p.logs)
}

// waitSubscribed waits until a's invalidation subscription is applied;
// logs, when not nil, is printed with the failure.
func waitSubscribed(t *testing.T, a *app, logs fmt.Stringer) {
	t.Helper()
	select {
	case <-a.sub.Ready():
	case <-time.After(10 * time.Second):
		if logs == nil {
			t.Fatal("invalidation subscription not applied after 10s")
		}
		t.Fatalf("invalidation subscription not applied after 10s\n%s", logs)
	}
}

// waitSubscribers waits until n clients listen on the invalidation channel
// (asked of Redis itself, so it holds after a restart too).
func waitSubscribers(t *testing.T, r *testenv.Redis, n int64) {
	t.Helper()
	ch := redisstore.DefaultInvalidateChannel
	testenv.WaitFor(t, 10*time.Second, fmt.Sprintf("%d subscribers on %s", n, ch), func() bool {
		m, err := r.Client().PubSubNumSub(context.Background(), ch).Result()
		return err == nil && m[ch] == n
	})
}

// Routes exactly as the control plane writes them (new key, legacy key,
// both) route traffic; broken route data answers a clear 404/502 without
// leaking the data, and the proxy keeps serving other sandboxes.
func TestRedisControlPlaneRoutes(t *testing.T) {
	// Parallel: its redis-servers and proxies are its own, and it asserts
	// no latency; what it reads of the log is its own proxies' lines.
	testenv.ParallelRedis(t)
	r := testenv.StartRedis(t)
	// node_ip is an address no route dials for remote sandboxes; a route on
	// "this node" dials SandboxIP:<container port> instead.
	p := startRedisProxy(t, r.Addr(), "--node-ip", "127.0.0.9")
	newB, legacyB := redisBackend(t, "new-key"), redisBackend(t, "legacy-key")
	newKey := func(id string) string { return redisstore.DefaultKeyPrefix + id }
	oldKey := func(id string) string { return redisstore.DefaultLegacyKeyPrefix + id }

	t.Run("routes", func(t *testing.T) {
		for _, tc := range []struct {
			name, id string
			write    func(id string)
			want     string
		}{
			{"new key", "cp-new", func(id string) { hsetRoute(t, r, newKey(id), cpFields("127.0.0.1", "192.168.0.2", newB)...) }, "new-key"},
			{"legacy key", "cp-legacy", func(id string) { hsetRoute(t, r, oldKey(id), cpFields("127.0.0.1", "192.168.0.2", legacyB)...) }, "legacy-key"},
			{"new key wins over legacy", "cp-both", func(id string) {
				hsetRoute(t, r, oldKey(id), cpFields("127.0.0.1", "192.168.0.2", legacyB)...)
				hsetRoute(t, r, newKey(id), cpFields("127.0.0.1", "192.168.0.2", newB)...)
			}, "new-key"},
			{"sandbox on this node dials SandboxIP", "cp-local", func(id string) {
				// HostIP is node_ip: the proxy must dial SandboxIP:<container
				// port>, so the container port is the backend's port here.
				hsetRoute(t, r, newKey(id), "HostIP", "127.0.0.9", "SandboxIP", "127.0.0.1", "CreatedAt", redisCreatedAt,
					"AllowPublicTraffic", "true", strconv.Itoa(newB), "31999")
			}, "new-key"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				tc.write(tc.id)
				port := redisContainerPort
				if tc.id == "cp-local" {
					port = newB
				}
				got := p.getPort(t, tc.id, port)
				if got.status != 200 || got.body != tc.want {
					t.Fatalf("got %d %q, want 200 %q", got.status, got.body, tc.want)
				}
			})
		}
	})

	t.Run("broken routes", func(t *testing.T) {
		const secretToken = "s3cr3t-not-hex-token-value-that-must-never-be-echoed-to-clients!!"
		for _, tc := range []struct {
			name, id string
			fields   []any // nil: write a string key instead of a hash
			port     int
			status   int
			code     string
			field    string // named in the error message
		}{
			{"missing HostIP", "bad-nohost", []any{"SandboxIP", "192.168.0.2", "CreatedAt", redisCreatedAt,
				"AllowPublicTraffic", "true", "50005", "30001"}, redisContainerPort, 404, "route_invalid", "HostIP"},
			{"non-numeric port value", "bad-port", []any{"HostIP", "127.0.0.1", "AllowPublicTraffic", "true",
				"50005", "http-port"}, redisContainerPort, 404, "route_invalid", "50005"},
			{"garbage HostIP", "bad-ip", []any{"HostIP", "10.0.0.300", "50005", "30001"}, redisContainerPort, 404, "route_invalid", "HostIP"},
			{"garbage AllowPublicTraffic", "bad-public", []any{"HostIP", "127.0.0.1", "AllowPublicTraffic", "yes",
				"50005", "30001"}, redisContainerPort, 404, "route_invalid", "AllowPublicTraffic"},
			{"garbage traffic token", "bad-token", []any{"HostIP", "127.0.0.1", "AllowPublicTraffic", "false",
				"TrafficAccessToken", secretToken, "50005", "30001"}, redisContainerPort, 404, "route_invalid", "TrafficAccessToken"},
			{"garbage CreatedAt", "bad-created", []any{"HostIP", "127.0.0.1", "CreatedAt", "yesterday",
				"50005", "30001"}, redisContainerPort, 404, "route_invalid", "CreatedAt"},
			{"key is not a hash", "bad-type", nil, redisContainerPort, 404, "route_invalid", ""},
			{"port not exposed", "cp-new", nil, 8080, 404, "port_not_mapped", ""},
			{"on this node without SandboxIP", "bad-local", []any{"HostIP", "127.0.0.9", "50005", "30001"},
				redisContainerPort, 404, "route_invalid", "SandboxIP"},
			{"no key at all", "nobody", nil, redisContainerPort, 404, "sandbox_not_found", ""},
		} {
			t.Run(tc.name, func(t *testing.T) {
				switch {
				case tc.fields != nil:
					hsetRoute(t, r, newKey(tc.id), tc.fields...)
				case tc.name == "key is not a hash":
					if err := r.Client().Set(context.Background(), newKey(tc.id), "HostIP=127.0.0.1", 0).Err(); err != nil {
						t.Fatal(err)
					}
				}
				got := p.getPort(t, tc.id, tc.port)
				if got.status != tc.status || got.code() != tc.code {
					t.Fatalf("got %d %s, want %d %s", got.status, got.body, tc.status, tc.code)
				}
				if tc.field != "" && !strings.Contains(got.body, tc.field) {
					t.Errorf("error does not name field %s: %s", tc.field, got.body)
				}
				// The answer names the field, never its value.
				leaks := []string{secretToken, "http-port", "10.0.0.300", "yesterday", "30001", "127.0.0.1", "cube:v1"}
				for _, leak := range leaks {
					if strings.Contains(got.body, leak) {
						t.Errorf("error body leaks %q: %s", leak, got.body)
					}
				}
				if strings.Contains(p.logs.String(), secretToken) {
					t.Errorf("process log contains the traffic token")
				}
				// The proxy is unharmed and keeps serving the others.
				if ok := p.get(t, "cp-new"); ok.status != 200 || ok.body != "new-key" {
					t.Fatalf("good route after a broken one: %d %q", ok.status, ok.body)
				}
			})
		}
		// The process log is written behind the caller (proclog): stopping
		// serve writes all of it, lines of the last requests included.
		p.stop()
		if !strings.Contains(p.logs.String(), `"msg":"invalid route data"`) {
			t.Errorf("invalid route data was not logged")
		}
		if strings.Contains(p.logs.String(), secretToken) {
			t.Errorf("process log contains the traffic token")
		}
	})
}

// A Redis outage: cached routes keep working (expired ones served stale),
// uncached ids get a fast 503 + Retry-After: 1; after Redis restarts on the
// same port, new routes resolve and pub/sub invalidation works again, all
// without restarting the proxies.
func TestRedisOutageAndRecovery(t *testing.T) {
	r := testenv.StartRedis(t)
	// a: routes expire after 150 ms, so its cached route is stale during the
	// outage; b: default TTL, so only invalidation can change its routes.
	a := startRedisProxy(t, r.Addr(), "--instance-id", "outage-a", "--cache-ttl-min", "150ms", "--cache-ttl-max", "150ms")
	b := startRedisProxy(t, r.Addr(), "--instance-id", "outage-b")
	// A lookup in flight when the subscription comes up is answered but
	// not cached (ExpireAll): b would have nothing to serve in the outage.
	a.subscribed(t)
	b.subscribed(t)
	one, two := redisBackend(t, "one"), redisBackend(t, "two")
	key := redisstore.DefaultKeyPrefix + "cached"

	hsetRoute(t, r, key, cpFields("127.0.0.1", "192.168.0.2", one)...)
	for _, p := range []*redisProxy{a, b} {
		if got := p.get(t, "cached"); got.status != 200 || got.body != "one" {
			t.Fatalf("before the outage: %d %q", got.status, got.body)
		}
	}

	r.Stop()

	if got := b.get(t, "cached"); got.status != 200 || got.body != "one" {
		t.Fatalf("cached route with Redis down: %d %q", got.status, got.body)
	}
	// On a, the entry has expired (150 ms): the refresh fails and the old
	// route is served. Poll until the proxy reports a stale answer.
	testenv.WaitFor(t, 5*time.Second, "a stale cache answer on instance a", func() bool {
		if got := a.get(t, "cached"); got.status != 200 || got.body != "one" {
			t.Fatalf("expired cached route with Redis down: %d %q", got.status, got.body)
		}
		return strings.Contains(a.adminGet(t, "/metrics").body, `result="stale"`)
	})

	for _, id := range []string{"uncached-1", "uncached-2"} {
		got := b.get(t, id)
		if got.status != 503 || got.code() != "store_unavailable" || got.header.Get("Retry-After") != "1" {
			t.Fatalf("uncached id with Redis down: %d %v %s", got.status, got.header, got.body)
		}
		if got.took > 1500*time.Millisecond {
			t.Fatalf("503 took %v, want < 1.5s", got.took)
		}
	}

	r.Restart() // same port, empty data

	hsetRoute(t, r, redisstore.DefaultKeyPrefix+"fresh", cpFields("127.0.0.1", "192.168.0.2", two)...)
	// go-redis may hold back dials for up to a second after many failures.
	testenv.WaitFor(t, 5*time.Second, "a new route after the restart", func() bool {
		got := b.get(t, "fresh")
		return got.status == 200 && got.body == "two"
	})

	// Both proxies resubscribe by themselves, and drop their caches as they
	// do: invalidations published while they were away were lost.
	waitSubscribers(t, r, 2)
	hsetRoute(t, r, key, cpFields("127.0.0.1", "192.168.0.2", two)...)
	testenv.WaitFor(t, 5*time.Second, "b to read Redis again after resubscribing", func() bool {
		return b.get(t, "cached").body == "two"
	})
	// From then on b keeps its cache until an invalidation, which reaches
	// it again.
	hsetRoute(t, r, key, cpFields("127.0.0.1", "192.168.0.2", one)...)
	if got := b.get(t, "cached"); got.body != "two" {
		t.Fatalf("b re-read Redis without an invalidation: %d %q", got.status, got.body)
	}
	if got := a.adminPost(t, "/admin/backend_cache/delete", "cached", ""); got.status != 200 {
		t.Fatalf("invalidate on a: %d %s", got.status, got.body)
	}
	testenv.WaitFor(t, 5*time.Second, "b to follow a's invalidation after the restart", func() bool {
		return b.get(t, "cached").body == "one"
	})
}

// Invalidating through instance A's admin API makes instance B (same
// Redis) read the route again on its next request.
func TestRedisInvalidationAcrossInstances(t *testing.T) {
	// Parallel: its redis-servers and proxies are its own, and it asserts
	// no latency; what it reads of the log is its own proxies' lines.
	testenv.ParallelRedis(t)
	r := testenv.StartRedis(t)
	a := startRedisProxy(t, r.Addr(), "--instance-id", "inv-a")
	b := startRedisProxy(t, r.Addr(), "--instance-id", "inv-b")
	a.subscribed(t)
	b.subscribed(t)
	one, two := redisBackend(t, "one"), redisBackend(t, "two")

	for _, tc := range []struct{ path, id string }{
		{"/admin/backend_cache/delete", "inv-cache"},
		{"/admin/meta/delete", "inv-meta"},
	} {
		t.Run(tc.path, func(t *testing.T) {
			key := redisstore.DefaultKeyPrefix + tc.id
			hsetRoute(t, r, key, cpFields("127.0.0.1", "192.168.0.2", one)...)
			for _, p := range []*redisProxy{a, b} {
				if got := p.get(t, tc.id); got.status != 200 || got.body != "one" {
					t.Fatalf("first request: %d %q", got.status, got.body)
				}
			}
			hsetRoute(t, r, key, cpFields("127.0.0.1", "192.168.0.2", two)...)
			if got := b.get(t, tc.id); got.body != "one" {
				t.Fatalf("b is not caching: %d %q", got.status, got.body)
			}
			r.ResetStats(t)
			// b's request waits for the invalidation to be applied: one
			// in flight as it arrives has its route read again for what
			// it has open (Proxy.Invalidate), a second lookup.
			const applied = "cubeproxy_route_invalidation_messages_total{}"
			before := series(scrapeFamilies(t, b.admin))[applied]
			if got := a.adminPost(t, tc.path, tc.id, ""); got.status != 200 || !strings.Contains(got.body, `"ok":true`) {
				t.Fatalf("POST %s on a: %d %s", tc.path, got.status, got.body)
			}
			testenv.WaitFor(t, 5*time.Second, "b to apply a's invalidation", func() bool {
				return series(scrapeFamilies(t, b.admin))[applied] > before
			})
			if got := b.get(t, tc.id); got.status != 200 || got.body != "two" {
				t.Fatalf("b after the invalidation: %d %q", got.status, got.body)
			}
			// One lookup: the new and the legacy key, in one pipeline.
			if n := r.CommandCount(t, "hgetall"); n != 2 {
				t.Errorf("b re-read the route with %d HGETALLs, want 2 (one lookup)", n)
			}
		})
	}
}

// The control plane writes a route to Redis and then calls
// /admin/meta/upsert, as it does with the platform's proxy: with the Redis
// store the call is accepted (the fields are Redis's, not stored here),
// every instance reads the new route, and a meta/delete 410 is lifted.
func TestRedisMetaUpsert(t *testing.T) {
	// Parallel: its redis-servers and proxies are its own, and it asserts
	// no latency; what it reads of the log is its own proxies' lines.
	testenv.ParallelRedis(t)
	r := testenv.StartRedis(t)
	a := startRedisProxy(t, r.Addr(), "--instance-id", "up-a")
	b := startRedisProxy(t, r.Addr(), "--instance-id", "up-b")
	a.subscribed(t)
	b.subscribed(t)
	one, two := redisBackend(t, "one"), redisBackend(t, "two")
	const id = "upserted"
	key := redisstore.DefaultKeyPrefix + id
	upsert := func(hostPort int) redisReply {
		t.Helper()
		body := fmt.Sprintf(`{"sandbox_id":%q,"HostIP":"127.0.0.1","SandboxIP":"192.168.0.2","CreatedAt":%s,"AllowPublicTraffic":"true","%d":"%d","ControlPlaneExtra":"x"}`,
			id, redisCreatedAt, redisContainerPort, hostPort)
		req, err := http.NewRequest("POST", "http://"+a.admin+"/admin/meta/upsert", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		return a.do(t, req)
	}

	hsetRoute(t, r, key, cpFields("127.0.0.1", "192.168.0.2", one)...)
	for _, p := range []*redisProxy{a, b} {
		if got := p.get(t, id); got.status != 200 || got.body != "one" {
			t.Fatalf("first request: %d %q", got.status, got.body)
		}
	}
	hsetRoute(t, r, key, cpFields("127.0.0.1", "192.168.0.2", two)...)
	if got := upsert(two); got.status != 200 || !strings.Contains(got.body, `"ok":true`) || !strings.Contains(got.body, `"sandbox_id":"upserted"`) {
		t.Fatalf("meta/upsert with the Redis store: %d %s", got.status, got.body)
	}
	for name, p := range map[string]*redisProxy{"a": a, "b": b} {
		testenv.WaitFor(t, 5*time.Second, name+" to route to the new backend", func() bool {
			got := p.get(t, id)
			return got.status == 200 && got.body == "two"
		})
	}

	// Killed, then stored again under the same CreatedAt: served again.
	if got := a.adminPost(t, "/admin/meta/delete", id, ""); got.status != 200 {
		t.Fatalf("meta/delete: %d %s", got.status, got.body)
	}
	if got := a.get(t, id); got.status != 410 {
		t.Fatalf("after meta/delete: %d %s, want 410", got.status, got.body)
	}
	if got := upsert(two); got.status != 200 {
		t.Fatalf("meta/upsert after the kill: %d %s", got.status, got.body)
	}
	if got := a.get(t, id); got.status != 200 || got.body != "two" {
		t.Fatalf("after meta/upsert lifted the kill: %d %q, want 200 two", got.status, got.body)
	}
	if got := a.adminPost(t, "/admin/meta/upsert", "Bad*Id", ""); got.status != 400 {
		t.Fatalf("meta/upsert with a bad id: %d %s, want 400", got.status, got.body)
	}
}

// /readyz is 503 while Redis has never answered and 200 once it has; it
// stays 200 when Redis goes away later (cached routes are still served,
// and failing every proxy's check at once would turn a Redis outage into
// an outage of the whole tier).
func TestRedisReadyz(t *testing.T) {
	r := testenv.StartRedis(t)
	r.Stop() // its port is now dead
	p := startRedisProxy(t, r.Addr())

	got := p.adminGet(t, "/readyz")
	if got.status != 503 || !strings.Contains(got.body, "no route read from the store has succeeded yet") {
		t.Fatalf("readyz with Redis never reachable: %d %s", got.status, got.body)
	}
	if got := p.get(t, "any"); got.status != 503 || got.header.Get("Retry-After") != "1" {
		t.Fatalf("request with Redis never reachable: %d %s", got.status, got.body)
	}
	// The line a takeover waits for comes with /readyz's 200, not with
	// "cubeproxy listening".
	if strings.Contains(p.logs.String(), `"cubeproxy ready"`) {
		t.Fatalf("ready logged with Redis never reachable:\n%s", p.logs.String())
	}

	r.Restart()
	testenv.WaitFor(t, 5*time.Second, "readyz 200 after Redis came up", func() bool {
		return p.adminGet(t, "/readyz").status == 200
	})
	testenv.WaitFor(t, 5*time.Second, `"cubeproxy ready" in the log`, func() bool {
		return strings.Contains(p.logs.String(), `"cubeproxy ready"`)
	})

	r.Stop()
	if got := p.get(t, "other"); got.status != 503 {
		t.Fatalf("request with Redis down again: %d %s, want 503", got.status, got.body)
	}
	if got := p.adminGet(t, "/readyz"); got.status != 200 {
		t.Fatalf("readyz with Redis down after it answered once: %d %s, want 200", got.status, got.body)
	}
	if n := strings.Count(p.logs.String(), `"cubeproxy ready"`); n != 1 {
		t.Fatalf("ready logged %d times, want once:\n%s", n, p.logs.String())
	}
}

// A Redis that answers but refuses the proxy (wrong password, an ACL user
// that may PING but not read routes) keeps /readyz 503, and says why in
// the log and in /readyz without any request arriving: an unready proxy
// gets no traffic whose errors would show it. Once Redis lets it read,
// it becomes ready without a restart.
func TestRedisRefusedAtStartIsExplained(t *testing.T) {
	// Parallel: its redis-servers and proxies are its own, and it asserts
	// no latency; what it reads of the log is its own proxies' lines.
	testenv.ParallelRedis(t)
	for _, tc := range []struct {
		name   string
		setup  func(t *testing.T, r *testenv.Redis) // before the proxy starts
		flags  []string
		reason string // in the log and /readyz
		fix    func(t *testing.T, r *testenv.Redis)
	}{
		{
			name:   "wrong password",
			setup:  func(t *testing.T, r *testenv.Redis) {},
			flags:  []string{"--redis-password", "s3cret-wrong"},
			reason: "WRONGPASS",
			fix: func(t *testing.T, r *testenv.Redis) {
				if err := r.Client().ConfigSet(context.Background(), "requirepass", "s3cret-wrong").Err(); err != nil {
					t.Fatal(err)
				}
			},
		},
		{
			name: "ACL user without HGETALL",
			setup: func(t *testing.T, r *testenv.Redis) {
				if err := r.Client().Do(context.Background(), "ACL", "SETUSER", "proxy", "on", ">pw", "+ping", "allchannels", "+subscribe").Err(); err != nil {
					t.Fatal(err)
				}
			},
			flags:  []string{"--redis-username", "proxy", "--redis-password", "pw"},
			reason: "NOPERM",
			fix: func(t *testing.T, r *testenv.Redis) {
				if err := r.Client().Do(context.Background(), "ACL", "SETUSER", "proxy", "allkeys", "+hgetall").Err(); err != nil {
					t.Fatal(err)
				}
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := testenv.StartRedis(t, "--requirepass", "s3cret-right")
			tc.setup(t, r)
			p := startRedisProxy(t, r.Addr(), tc.flags...)
			testenv.WaitFor(t, 5*time.Second, "a log line saying why Redis is not usable", func() bool {
				return strings.Contains(p.logs.String(), tc.reason)
			})
			// The subscriber may log the refusal before the first
			// lookup has recorded it for /readyz.
			var got redisReply
			testenv.WaitFor(t, 5*time.Second, "/readyz naming why Redis is not usable", func() bool {
				got = p.adminGet(t, "/readyz")
				return strings.Contains(got.body, tc.reason)
			})
			if got.status != 503 {
				t.Fatalf("readyz: %d %s, want 503 naming %s", got.status, got.body, tc.reason)
			}
			if strings.Contains(p.logs.String(), "s3cret") || strings.Contains(got.body, "s3cret") {
				t.Fatalf("a password reached the log or /readyz")
			}
			tc.fix(t, r)
			testenv.WaitFor(t, 5*time.Second, "readyz 200 once Redis lets the proxy read", func() bool {
				return p.adminGet(t, "/readyz").status == 200
			})
		})
	}
}

// A reason the readiness watch has logged is not logged again for naming
// another address: with every seed of a Cluster down, go-redis reads the
// slot map from a seed picked at random and reports its error, so the same
// outage named another seed on most probes, and an error line came about
// every second (7 in 10 s with three seeds) instead of once.
func TestRedisUnreadyReasonLoggedOnceAcrossAddresses(t *testing.T) {
	var seeds []string
	for range 6 {
		seeds = append(seeds, testenv.RefusingAddr(t))
	}
	// The watch asks once a second: four more probes.
	unreadyReasonLoggedOnce(t, []string{"--redis-cluster-addrs", strings.Join(seeds, ",")}, 4500*time.Millisecond, "connection refused")
}

// unreadyReasonLoggedOnce starts serve on a Redis store with the store
// flags given, whose Redis cannot be used, and checks that the reason is
// logged once in the time the probes take (the watch asks once a second),
// and that readyz answers 503 with it (want is part of the reason).
func unreadyReasonLoggedOnce(t *testing.T, store []string, probes time.Duration, want string) {
	t.Helper()
	args := append([]string{"--store", "redis"}, store...)
	p := startServe(t, append(args, "--http-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0", "--domains", "cube.test",
		"--access-log-format", "off", "--drain-timeout", "1s"), noEnv, "cube.test")
	const line = `"msg":"route store not usable`
	testenv.WaitFor(t, 5*time.Second, "the reason in the log", func() bool {
		return strings.Contains(p.logs.String(), line)
	})
	time.Sleep(probes)
	if n := strings.Count(p.logs.String(), line); n != 1 {
		t.Errorf("the same reason logged %d times in %v, want once:\n%s", n, probes, p.logs)
	}
	if got := p.adminGet(t, "/readyz"); got.status != 503 || !strings.Contains(got.body, want) {
		t.Errorf("readyz: %d %s, want 503 with the reason", got.status, got.body)
	}
}

// A Redis whose server certificate has expired keeps the proxy unready,
// and the reason is logged once, not at every probe: Go's error names the
// time of the check ("current time 2026-12-07T06:53:31Z is after ..."),
// and the readiness watch took each probe's, a second later, for a new
// reason, one error line a second for as long as the certificate stayed.
func TestRedisUnreadyReasonLoggedOnceAcrossTimes(t *testing.T) {
	testenv.ParallelRedis(t)
	ca := testenv.NewCA(t, "redis CA")
	dir := t.TempDir()
	certPEM, keyPEM := ca.IssueValid(t, time.Now().Add(-48*time.Hour), time.Now().Add(-24*time.Hour), "127.0.0.1")
	caFile, certFile, keyFile := filepath.Join(dir, "ca.pem"), filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	for name, b := range map[string][]byte{caFile: ca.CertPEM(), certFile: certPEM, keyFile: keyPEM} {
		if err := os.WriteFile(name, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	r := testenv.StartRedis(t, "--tls-port", testenv.AnotherPort, "--tls-cert-file", certFile, "--tls-key-file", keyFile,
		"--tls-ca-cert-file", caFile, "--tls-auth-clients", "no")
	// Three more probes, each in a new second.
	unreadyReasonLoggedOnce(t, []string{"--redis-addr", r.OtherAddr(), "--redis-tls", "--redis-ca-file", caFile},
		3500*time.Millisecond, "certificate has expired")
}

// Broken route data is logged so an operator can fix it: the line names
// the Redis key that holds it (the legacy key here, while the new key is
// empty: looking at the new key would show nothing), once per store read,
// not once per request answered from the negative cache.
func TestRedisInvalidRouteLogNamesKey(t *testing.T) {
	// Parallel: its redis-servers and proxies are its own, and it asserts
	// no latency; what it reads of the log is its own proxies' lines.
	testenv.ParallelRedis(t)
	r := testenv.StartRedis(t)
	p := startRedisProxy(t, r.Addr(), "--cache-negative-ttl", "1m")
	p.subscribed(t)
	hsetRoute(t, r, redisstore.DefaultLegacyKeyPrefix+"broken", "HostIP", "10.0.0.300", "50005", "30001")
	for range 20 {
		if got := p.get(t, "broken"); got.status != 404 || got.code() != "route_invalid" {
			t.Fatalf("got %d %s, want 404 route_invalid", got.status, got.body)
		}
	}
	// The process log is written behind the caller (proclog): stopping
	// serve writes all of it, and the count is then final.
	p.stop()
	var lines []string
	for _, l := range strings.Split(p.logs.String(), "\n") {
		if strings.Contains(l, `"msg":"invalid route data"`) {
			lines = append(lines, l)
		}
	}
	if len(lines) != 1 || !strings.Contains(lines[0], redisstore.DefaultLegacyKeyPrefix+"broken") || !strings.Contains(lines[0], `"field":"HostIP"`) {
		t.Fatalf("20 requests for one broken route logged %d lines, want one naming the key and field:\n%s", len(lines), strings.Join(lines, "\n"))
	}
}

// A sandbox asked for before it exists is remembered as unknown for
// cache.negative_ttl; when the control plane then creates it and announces
// the id (a PUBLISH on the invalidation channel, or meta/upsert on any one
// instance), every instance serves it at once rather than 404 until the
// negative entry expires.
func TestRedisCreatedAfter404(t *testing.T) {
	// Parallel: its redis-servers and proxies are its own, and it asserts
	// no latency; what it reads of the log is its own proxies' lines.
	testenv.ParallelRedis(t)
	r := testenv.StartRedis(t)
	a := startRedisProxy(t, r.Addr(), "--cache-negative-ttl", "1m")
	b := startRedisProxy(t, r.Addr(), "--cache-negative-ttl", "1m")
	a.subscribed(t)
	b.subscribed(t)
	backend := redisBackend(t, "born")
	for _, tc := range []struct {
		name     string
		announce func(id string)
	}{
		{"publish", func(id string) {
			if err := r.Client().Publish(context.Background(), redisstore.DefaultInvalidateChannel, id).Err(); err != nil {
				t.Fatal(err)
			}
		}},
		{"meta/upsert on one instance", func(id string) {
			if got := a.adminPost(t, "/admin/meta/upsert", id, ""); got.status != 200 {
				t.Fatalf("meta/upsert: %d %s", got.status, got.body)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id := "late-" + strings.ReplaceAll(strings.ToLower(tc.name[:4]), "/", "")
			for _, p := range []*redisProxy{a, b} {
				if got := p.get(t, id); got.status != 404 || got.code() != "sandbox_not_found" {
					t.Fatalf("before creation: %d %s", got.status, got.body)
				}
			}
			hsetRoute(t, r, redisstore.DefaultKeyPrefix+id, cpFields("127.0.0.1", "192.168.0.2", backend)...)
			if got := b.get(t, id); got.status != 404 {
				t.Fatalf("created, not announced: %d %s, want the cached 404", got.status, got.body)
			}
			tc.announce(id)
			for name, p := range map[string]*redisProxy{"a": a, "b": b} {
				testenv.WaitFor(t, 10*time.Second, name+" to serve the new sandbox", func() bool {
					got := p.get(t, id)
					return got.status == 200 && got.body == "born"
				})
			}
		})
	}
}

// The instance registry: entries appear (and the heartbeat advances) while
// a proxy runs and are removed when it stops — the real binary on SIGTERM,
// and serve() on cancel.
func TestRedisRegistry(t *testing.T) {
	// Parallel: its redis-servers are its own, it waits on them and on
	// timers, and it asserts no latency a busy machine could exceed.
	testenv.ParallelRedis(t)
	r := testenv.StartRedis(t)
	ctx := context.Background()
	hash, zset := redisstore.DefaultRegistryHash, redisstore.DefaultRegistryZSet
	flags := []string{"--store", "redis", "--redis-addr", r.Addr(), "--registry-enabled", "--registry-interval", "200ms",
		"--node-ip", "127.0.0.9", "--http-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0", "--access-log-format", "off"}

	for _, tc := range []struct {
		name  string
		start func(t *testing.T, id string) (stop func())
	}{
		{"binary SIGTERM", func(t *testing.T, id string) func() {
			bin := buildBinary(t)
			cmd := exec.Command(bin, append([]string{"serve", "--instance-id", id}, flags...)...)
			var logs syncBuffer
			cmd.Stdout, cmd.Stderr = &logs, &logs
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				_ = cmd.Process.Kill()
				if t.Failed() {
					t.Logf("cubeproxy log:\n%s", logs.String())
				}
			})
			waitErr := make(chan error, 1)
			go func() { waitErr <- cmd.Wait() }()
			return func() {
				if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
					t.Fatal(err)
				}
				select {
				case err := <-waitErr:
					if err != nil {
						t.Fatalf("exit after SIGTERM: %v\n%s", err, logs.String())
					}
				case <-time.After(10 * time.Second):
					t.Fatalf("still running 10s after SIGTERM\n%s", logs.String())
				}
			}
		}},
		{"in-process cancel", func(t *testing.T, id string) func() {
			return startServe(t, append([]string{"--instance-id", id}, flags...), noEnv, "cube.test").stop
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id := "reg-" + strings.ToLower(strings.ReplaceAll(tc.name, " ", "-"))
			stop := tc.start(t, id)

			var inst struct {
				ProxyID   string `json:"proxy_id"`
				AdminURL  string `json:"admin_url"`
				NodeIP    string `json:"node_ip"`
				StartedAt int64  `json:"started_at"` // unix ms, as the lifecycle manager reads it
				Version   string `json:"version"`
			}
			testenv.WaitFor(t, 15*time.Second, "the registry entry", func() bool {
				v, err := r.Client().HGet(ctx, hash, id).Result()
				return err == nil && json.Unmarshal([]byte(v), &inst) == nil
			})
			if inst.ProxyID != id || inst.NodeIP != "127.0.0.9" || inst.Version == "" || time.Since(time.UnixMilli(inst.StartedAt)) > time.Minute {
				t.Errorf("registry entry %+v", inst)
			}
			// admin_url is where this instance's admin API really listens:
			// it answers there, ready once its first store read came back
			// (the entry is written right after the listeners open, which
			// can be before that read).
			testenv.WaitFor(t, 10*time.Second, "GET "+inst.AdminURL+"/readyz 200", func() bool {
				resp, err := http.Get(inst.AdminURL + "/readyz")
				if err != nil {
					t.Fatalf("admin_url %q: %v", inst.AdminURL, err)
				}
				resp.Body.Close()
				return resp.StatusCode == 200
			})
			first, err := r.Client().ZScore(ctx, zset, id).Result()
			if err != nil {
				t.Fatalf("zscore %s %s: %v", zset, id, err)
			}
			if d := time.Since(time.UnixMilli(int64(first))); d < 0 || d > time.Minute {
				t.Errorf("heartbeat score %v is not now", first)
			}
			testenv.WaitFor(t, 5*time.Second, "the heartbeat to advance", func() bool {
				s, err := r.Client().ZScore(ctx, zset, id).Result()
				return err == nil && s > first
			})
			// /admin/healthz names the last heartbeat written, as the
			// platform's proxy does: its docs and its SDK end-to-end
			// preflight read heartbeat_last_pushed_ms there.
			resp, err := http.Get(inst.AdminURL + "/admin/healthz")
			if err != nil {
				t.Fatal(err)
			}
			var health struct {
				HeartbeatMs int64 `json:"heartbeat_last_pushed_ms"`
			}
			err = json.NewDecoder(resp.Body).Decode(&health)
			resp.Body.Close()
			if d := time.Since(time.UnixMilli(health.HeartbeatMs)); err != nil || health.HeartbeatMs < int64(first) || d > time.Minute {
				t.Errorf("healthz heartbeat_last_pushed_ms %d (%v), want the last heartbeat's score (>= %.0f)", health.HeartbeatMs, err, first)
			}

			stop()

			if ok, err := r.Client().HExists(ctx, hash, id).Result(); err != nil || ok {
				t.Errorf("registry entry still present after stop: %v %v", ok, err)
			}
			if _, err := r.Client().ZScore(ctx, zset, id).Result(); err == nil {
				t.Errorf("heartbeat still present after stop")
			}
		})
	}
}

// The production example config runs as shipped (only addresses and the
// access log path overridden): password-protected Redis, secrets from the
// environment, registry on, cube access log in a file.
func TestRedisExampleConfigServes(t *testing.T) {
	// Parallel: its redis-servers and proxies are its own, and it asserts
	// no latency; what it reads of the log is its own proxies' lines.
	testenv.ParallelRedis(t)
	const password, adminToken = "redis-pw-for-test", "admin-token-for-test"
	// As shipped, without CUBEPROXY_ADMIN_TOKEN, it refuses to open its
	// non-loopback admin API.
	err := serve(context.Background(), []string{"--config", "../../configs/cubeproxy.redis.yaml"}, noEnv, io.Discard, io.Discard, nil)
	if err == nil || !strings.Contains(err.Error(), "no admin token") {
		t.Fatalf("example config without CUBEPROXY_ADMIN_TOKEN: %v", err)
	}

	r := testenv.StartRedis(t, "--requirepass", password)
	accessLog := filepath.Join(t.TempDir(), "access.log")
	env := map[string]string{"CUBEPROXY_REDIS_PASSWORD": password, "CUBEPROXY_ADMIN_TOKEN": adminToken}
	p := startServe(t, []string{"--config", "../../configs/cubeproxy.redis.yaml",
		"--http-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0", "--redis-addr", r.Addr(),
		"--access-log-path", accessLog, "--instance-id", "example-prod"}, func(k string) string { return env[k] }, "cube.example.com")

	hsetRoute(t, r, redisstore.DefaultKeyPrefix+"ex-box", cpFields("127.0.0.1", "192.168.0.2", redisBackend(t, "example"))...)
	if got := p.get(t, "ex-box"); got.status != 200 || got.body != "example" {
		t.Fatalf("through the example config: %d %q", got.status, got.body)
	}
	// The registry writes from its own goroutine, right after start.
	testenv.WaitFor(t, 5*time.Second, "the example config's registry entry", func() bool {
		ok, err := r.Client().HExists(context.Background(), redisstore.DefaultRegistryHash, "example-prod").Result()
		return err == nil && ok
	})
	if got := p.adminPost(t, "/admin/backend_cache/delete", "ex-box", ""); got.status != 403 {
		t.Errorf("admin without the token from the environment: %d", got.status)
	}
	if got := p.adminPost(t, "/admin/backend_cache/delete", "ex-box", adminToken); got.status != 200 {
		t.Errorf("admin with the token: %d %s", got.status, got.body)
	}
	testenv.WaitFor(t, 5*time.Second, "a cube access log line", func() bool {
		b, _ := os.ReadFile(accessLog)
		return strings.Contains(string(b), "50005-ex-box.cube.example.com||")
	})
}

// Through the Sentinel example config: routes resolve, and keep resolving
// (old and new) after the master fails over to the replica.
func TestRedisSentinelExampleFailover(t *testing.T) {
	// Parallel: its redis-servers are its own, it waits on them and on
	// timers, and it asserts no latency a busy machine could exceed.
	testenv.ParallelRedis(t)
	const master = "cube-routes" // the example's master_name
	ctx := context.Background()
	primary := testenv.StartRedis(t)
	replica := testenv.StartReplica(t, primary)
	sentinel := testenv.StartSentinel(t, master, primary.Addr())
	env := map[string]string{"CUBEPROXY_ADMIN_TOKEN": "tok"}
	p := startServe(t, []string{"--config", "../../configs/cubeproxy.sentinel.yaml",
		"--http-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0", "--redis-sentinel-addrs", sentinel.Addr(),
		"--registry-enabled=false", "--access-log-format", "off", "--drain-timeout", "1s"},
		func(k string) string { return env[k] }, "cube.example.com")
	backend := redisBackend(t, "sentinel")

	hsetRoute(t, primary, redisstore.DefaultKeyPrefix+"before", cpFields("127.0.0.1", "192.168.0.2", backend)...)
	testenv.WaitReplicated(t, primary)
	if got := p.get(t, "before"); got.status != 200 || got.body != "sentinel" {
		t.Fatalf("before failover: %d %q", got.status, got.body)
	}

	sc := sentinel.Client()
	testenv.WaitFor(t, 15*time.Second, "the sentinel to see the replica", func() bool {
		reps, err := sc.Do(ctx, "SENTINEL", "REPLICAS", master).Slice()
		return err == nil && len(reps) == 1 && strings.Contains(fmt.Sprint(reps[0]), "master-link-status ok")
	})
	if err := sc.Do(ctx, "SENTINEL", "FAILOVER", master).Err(); err != nil {
		t.Fatalf("sentinel failover: %v", err)
	}
	testenv.WaitFor(t, 15*time.Second, "the replica to become master", func() bool {
		role, err := replica.Client().Do(ctx, "ROLE").Slice()
		return err == nil && role[0] == "master"
	})

	// Written by the control plane on the new master only after the failover.
	hsetRoute(t, replica, redisstore.DefaultKeyPrefix+"after", cpFields("127.0.0.1", "192.168.0.2", backend)...)
	testenv.WaitFor(t, 15*time.Second, "a route written after the failover", func() bool {
		return p.get(t, "after").status == 200
	})
	// And the old route, read again from the new master.
	if got := p.adminPost(t, "/admin/backend_cache/delete", "before", "tok"); got.status != 200 {
		t.Fatalf("invalidate: %d %s", got.status, got.body)
	}
	if got := p.get(t, "before"); got.status != 200 || got.body != "sentinel" {
		t.Fatalf("old route after failover: %d %q", got.status, got.body)
	}
}

// freezer relays TCP to a real Redis until frozen; from then on it reads
// and drops what clients send and answers nothing: a Redis that hangs
// (paused, partitioned) rather than one that refuses connections.
type freezer struct {
	ln     net.Listener
	frozen chan struct{}
}

func startFreezer(t *testing.T, target string) *freezer {
	t.Helper()
	f := &freezer{frozen: make(chan struct{})}
	relay := func(dst, src net.Conn) {
		defer dst.Close()
		defer src.Close()
		buf := make([]byte, 32<<10)
		for {
			n, err := src.Read(buf)
			if err != nil {
				return
			}
			select {
			case <-f.frozen:
				continue // dropped: the client waits for an answer that never comes
			default:
			}
			if _, err := dst.Write(buf[:n]); err != nil {
				return
			}
		}
	}
	f.ln = testenv.ServeTCP(t, func(c net.Conn) {
		r, err := net.Dial("tcp", target)
		if err != nil {
			c.Close()
			return
		}
		go relay(r, c)
		relay(c, r) // either ends both, as does the close of c at the end
	})
	return f
}

func (f *freezer) addr() string { return f.ln.Addr().String() }
func (f *freezer) freeze()      { close(f.frozen) }

// A Redis that hangs at shutdown delays the exit by no more than its
// command timeout (the registry's cleanup is given that much), and leaves
// the access log and telemetry their own time to flush: the cleanup must
// not use up the budget they share, which lost the drain's last lines.
func TestRedisHungAtShutdown(t *testing.T) {
	r := testenv.StartRedis(t)
	f := startFreezer(t, r.Addr())
	p := startRedisProxy(t, f.addr(), "--registry-enabled",
		"--access-log-format", "json", "--access-log-path", filepath.Join(t.TempDir(), "access.log"))
	testenv.WaitFor(t, 5*time.Second, "registry entry", func() bool {
		n, err := r.Client().HLen(context.Background(), redisstore.DefaultRegistryHash).Result()
		return err == nil && n == 1
	})
	f.freeze()
	start := time.Now()
	p.stop()
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("stopping took %v with a hung Redis (drain 1s, command timeout 1s)", d)
	}
	if strings.Contains(p.logs.String(), "access log sink stalled") {
		t.Errorf("the access log was given no time to flush:\n%s", p.logs)
	}
}

// The access log's time at shutdown does not shrink by the registry
// cleanup's: with a command timeout as long as the budget they used to
// share (a Sentinel deployment riding out failovers), a hung Redis left
// the access log none.
func TestRedisHungAtShutdownLongCommandTimeout(t *testing.T) {
	// Parallel: its redis-servers are its own, it waits on them and on
	// timers, and it asserts no latency a busy machine could exceed.
	testenv.ParallelRedis(t)
	r := testenv.StartRedis(t)
	f := startFreezer(t, r.Addr())
	p := startRedisProxy(t, f.addr(), "--registry-enabled", "--redis-command-timeout", "5s",
		"--access-log-format", "json", "--access-log-path", filepath.Join(t.TempDir(), "access.log"))
	testenv.WaitFor(t, 5*time.Second, "registry entry", func() bool {
		n, err := r.Client().HLen(context.Background(), redisstore.DefaultRegistryHash).Result()
		return err == nil && n == 1
	})
	f.freeze()
	p.stop()
	if strings.Contains(p.logs.String(), "access log sink stalled") {
		t.Errorf("the access log was given no time to flush:\n%s", p.logs)
	}
}

// redis.command_timeout is the lookup budget: a longer one (a Sentinel
// deployment riding out failovers) lets a route lookup wait for a Redis
// that answers after more than a second, rather than the cache giving up
// at its default second with a 503.
func TestRedisLongCommandTimeoutIsTheLookupBudget(t *testing.T) {
	// Parallel: its redis-servers are its own, it waits on them and on
	// timers, and it asserts no latency a busy machine could exceed.
	testenv.ParallelRedis(t)
	r := testenv.StartRedis(t)
	p := startRedisProxy(t, r.Addr(), "--redis-command-timeout", "5s")
	hsetRoute(t, r, redisstore.DefaultKeyPrefix+"patient", cpFields("127.0.0.1", "192.168.0.2", redisBackend(t, "patient"))...)
	// Every command of every client waits 2 s from now.
	if err := r.Client().Do(context.Background(), "CLIENT", "PAUSE", "2000", "ALL").Err(); err != nil {
		t.Fatalf("client pause: %v", err)
	}
	got := p.get(t, "patient")
	if got.status != 200 || got.body != "patient" {
		t.Fatalf("lookup within a 5s command timeout, Redis paused 2s: %d %s after %v", got.status, got.body, got.took)
	}
	if got.took < time.Second {
		t.Fatalf("answered in %v: Redis was not paused for this lookup", got.took)
	}
}

// redis.command_timeout is an admin call's PUBLISH budget too: serve gave
// the publish a second of its own, so with a longer command timeout a Redis
// that answered after more than a second served lookups while every admin
// change answered 503 invalidation_not_published, and a Cluster publish,
// which tries the next master after a third of the command timeout, never
// got to its second try.
func TestRedisLongCommandTimeoutIsThePublishBudget(t *testing.T) {
	testenv.ParallelRedis(t)
	r := testenv.StartRedis(t)
	p := startRedisProxy(t, r.Addr(), "--redis-command-timeout", "5s")
	r.ResetStats(t)
	// Every command of every client waits 2 s from now.
	if err := r.Client().Do(context.Background(), "CLIENT", "PAUSE", "2000", "ALL").Err(); err != nil {
		t.Fatalf("client pause: %v", err)
	}
	got := p.adminPost(t, "/admin/backend_cache/delete", "patient", "")
	if got.status != 200 {
		t.Fatalf("backend_cache/delete within a 5s command timeout, Redis paused 2s: %d %s after %v", got.status, got.body, got.took)
	}
	if got.took < time.Second {
		t.Fatalf("answered in %v: Redis was not paused for this publish", got.took)
	}
	if n := r.CommandCount(t, "publish"); n != 1 {
		t.Fatalf("%d PUBLISHes, want 1", n)
	}
}

// The registry's announcement of a loopback admin API is warned of: a
// lifecycle manager on another host cannot reach it there.
func TestWarnLoopbackAdmin(t *testing.T) {
	for _, tc := range []struct {
		addr string
		warn bool
	}{
		{"127.0.0.1:8082", true},
		{"127.0.0.5:8082", true},
		{"[::1]:8082", true},
		{"0.0.0.0:8082", false},
		{"[::]:8082", false},
		{"10.0.0.5:8082", false},
	} {
		addr, err := net.ResolveTCPAddr("tcp", tc.addr)
		if err != nil {
			t.Fatal(err)
		}
		var buf bytes.Buffer
		warnLoopbackAdmin(slog.New(slog.NewTextHandler(&buf, nil)), addr)
		if got := strings.Contains(buf.String(), "level=WARN") && strings.Contains(buf.String(), "loopback"); got != tc.warn {
			t.Errorf("admin on %s: warned %v, want %v: %q", tc.addr, got, tc.warn, buf.String())
		}
	}
}

// A registry.interval the platform's lifecycle manager would expire
// between beats is warned of; the default and shorter ones are not.
func TestWarnSlowHeartbeat(t *testing.T) {
	for _, tc := range []struct {
		interval time.Duration
		warn     bool
	}{
		{0, false}, // unset: the 5 s default
		{5 * time.Second, false},
		{14 * time.Second, false},
		{15 * time.Second, true},
		{time.Minute, true},
	} {
		var buf bytes.Buffer
		warnSlowHeartbeat(slog.New(slog.NewTextHandler(&buf, nil)), tc.interval)
		if got := strings.Contains(buf.String(), "level=WARN"); got != tc.warn {
			t.Errorf("registry.interval %v: warned %v, want %v: %q", tc.interval, got, tc.warn, buf.String())
		}
	}
}

// registry.admin_url (the platform proxy's CUBE_PROXY_ADMIN_URL) is what
// the entry announces, for a lifecycle manager that reaches the admin API
// through a port mapping or a name. The warning of a loopback admin API
// is for an announcement of one: earlier builds warned every Redis-store
// proxy on the default loopback admin_addr, its registry off.
func TestRedisRegistryAdminURL(t *testing.T) {
	testenv.ParallelRedis(t)
	r := testenv.StartRedis(t)
	const given = "http://cubeproxy-7.nodes.internal:18082"
	flags := []string{"--store", "redis", "--redis-addr", r.Addr(), "--registry-interval", "200ms",
		"--http-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0", "--access-log-format", "off"}
	for _, tc := range []struct {
		name  string
		args  []string
		entry string // the announced admin_url: "" none, "listener" the admin listener's
		warns bool
	}{
		{"registry off", nil, "", false},
		{"registry on, the listener's address", []string{"--registry-enabled"}, "listener", true},
		{"registry on, a URL given", []string{"--registry-enabled", "--registry-admin-url", given}, given, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id := "regurl-" + strings.ReplaceAll(tc.name, " ", "")
			id = strings.NewReplacer(",", "", "'", "").Replace(id)
			p := startServe(t, append(append([]string{"--instance-id", id}, flags...), tc.args...), noEnv, "cube.test")
			// The process log is written in order, after the fact: the
			// warning comes before this line or not at all.
			testenv.WaitFor(t, 10*time.Second, "the listening line", func() bool {
				return strings.Contains(p.logs.String(), `"msg":"cubeproxy listening"`)
			})
			if warned := strings.Contains(p.logs.String(), "announces an admin API on a loopback address"); warned != tc.warns {
				t.Errorf("loopback warning logged: %v, want %v\n%s", warned, tc.warns, p.logs)
			}
			if tc.entry == "" {
				if p.a.registry != nil {
					t.Fatal("registry off, yet one was started")
				}
				return
			}
			want := tc.entry
			if want == "listener" {
				want = "http://" + p.admin
			}
			var inst struct {
				AdminURL string `json:"admin_url"`
			}
			testenv.WaitFor(t, 15*time.Second, "the registry entry", func() bool {
				v, err := r.Client().HGet(context.Background(), redisstore.DefaultRegistryHash, id).Result()
				return err == nil && json.Unmarshal([]byte(v), &inst) == nil
			})
			if inst.AdminURL != want {
				t.Errorf("announced admin_url %q, want %q", inst.AdminURL, want)
			}
		})
	}
}
