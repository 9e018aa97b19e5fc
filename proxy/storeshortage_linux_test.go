package proxy

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
	"github.com/cube-sandbox/cubeproxy/routing"
	"github.com/cube-sandbox/cubeproxy/routing/redisstore"
)

// A route lookup whose Redis connection the proxy cannot open for want of
// its own descriptors is the proxy's shortage, as a sandbox connection's
// is: a 503 proxy_out_of_resources. It was a 503 store_unavailable
// ("routing table unavailable"), which sent the operator to a Redis that
// was fine. The descriptor limit is the process's, so the test lowers it
// in a child process of its own.
func TestStoreDialShortageIsTheProxys(t *testing.T) {
	if os.Getenv("CUBE_TEST_FD_CHILD") != "1" {
		testenv.ParallelRedis(t) // the parent only waits for its redis-server and child process
		runFDChild(t, "CUBE_TEST_REDIS="+testenv.StartRedis(t).Addr())
		return
	}
	// Open dials nothing: the first lookup opens the pool's first
	// connection, under the limit below.
	store, err := redisstore.Open(redisstore.Config{Addr: os.Getenv("CUBE_TEST_REDIS")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close() })
	h := newHarness(t, func(o *harnessOpts) { o.store = store })
	// A client connection the proxy has accepted (it answered on it, with
	// no lookup: the host names no sandbox) while descriptors were left.
	c := dialRaw(t, h.addr)
	br := bufio.NewReader(c)
	io.WriteString(c, "GET / HTTP/1.1\r\nHost: cube.test\r\n\r\n")
	warm, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, warm.Body)
	if warm.Close || h.counts.n.Load() != 0 {
		t.Fatalf("warm-up: %d (close %v, %d lookups), want an answer on a kept connection without a lookup", warm.StatusCode, warm.Close, h.counts.n.Load())
	}

	resp := askAtFDLimit(t, c, br, "50005-fdshort.cube.test")
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 503 || !strings.Contains(string(b), CodeOutOfResources) || resp.Header.Get("Retry-After") != "1" {
		t.Fatalf("got %d %s (Retry-After %q), want 503 %s with Retry-After 1", resp.StatusCode, b, resp.Header.Get("Retry-After"), CodeOutOfResources)
	}
	if n := h.counts.n.Load(); n != 1 {
		t.Fatalf("%d lookups, want 1", n)
	}
}

// splitStore answers ids starting with "idle" from mem and every other
// one from redis.
type splitStore struct {
	mem   routing.Store
	redis routing.Store
}

func (s *splitStore) Lookup(ctx context.Context, id string) (*routing.Route, error) {
	if strings.HasPrefix(id, "idle") {
		return s.mem.Lookup(ctx, id)
	}
	return s.redis.Lookup(ctx, id)
}

// At the descriptor limit, a route lookup that needs a new Redis
// connection closes idle keep-alive sandbox connections first, as a
// sandbox connect does (TestBinaryShedsIdleSandboxConnsAtFDLimit): they
// are only a cache of a connect. The lookup failed with 503 while twenty
// of them held a descriptor each.
func TestStoreDialShedsIdleSandboxConns(t *testing.T) {
	if os.Getenv("CUBE_TEST_FD_CHILD") != "1" {
		testenv.ParallelRedis(t) // the parent only waits for its redis-server and child process
		runFDChild(t, "CUBE_TEST_REDIS="+testenv.StartRedis(t).Addr())
		return
	}
	split := &splitStore{}
	var h *harness
	store, err := redisstore.Open(redisstore.Config{Addr: os.Getenv("CUBE_TEST_REDIS"), OnShortage: func() int { return h.proxy.ShedIdle() }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close() })
	split.redis = store
	h = newHarness(t, func(o *harnessOpts) { o.store = split })
	split.mem = h.store
	port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
	writer := redis.NewClient(&redis.Options{Addr: os.Getenv("CUBE_TEST_REDIS")})
	if err := writer.HSet(context.Background(), redisstore.DefaultKeyPrefix+"fresh", "HostIP", "127.0.0.1", "SandboxIP", "127.0.0.1",
		"CreatedAt", "1", itoa(port), itoa(port)).Err(); err != nil {
		t.Fatal(err)
	}
	writer.Close()

	c := dialRaw(t, h.addr)
	br := bufio.NewReader(c)
	get := func(host string) (int, string) {
		t.Helper()
		io.WriteString(c, "GET / HTTP/1.1\r\nHost: "+host+"\r\n\r\n")
		_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("%s: %v\n%s", host, err, strings.Join(testenv.Stacks(), "\n\n"))
		}
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	// Twenty sandboxes served once each: twenty idle keep-alive
	// connections, one per sandbox's pool.
	for i := range 20 {
		if code, body := get(h.route("idle"+strconv.Itoa(i), port)); code != 200 {
			t.Fatalf("idle%d: %d %s", i, code, body)
		}
	}
	if h.counts.n.Load() != 20 {
		t.Fatalf("%d lookups, want 20 (none from Redis yet)", h.counts.n.Load())
	}

	var code int
	var body string
	atFDLimit(t, func() {
		code, body = get(itoa(port) + "-fresh.cube.test")
	})
	if code != 200 {
		t.Fatalf("a sandbox whose route is in Redis, at the limit with idle sandbox connections: %d %s, want 200", code, body)
	}
}
