package proxy

import (
	"context"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
	"github.com/cube-sandbox/cubeproxy/routing/redisstore"
)

// A port exposed after the sandbox's creation: the control plane adds the
// port's field to the sandbox's hash in Redis and publishes nothing, and
// the platform's proxy reads the store again for a port its cached route
// lacks. The route cached before answered 404 port_not_mapped for its
// 500–700 s TTL. A port that is never exposed reads the store at most
// once per negative TTL, however many requests name it.
func TestPortExposedLaterInRedis(t *testing.T) {
	const id, negTTL = "portlater", 300 * time.Millisecond
	r, store := redisStore(t)
	h := newHarness(t, func(o *harnessOpts) {
		o.store = store
		o.noAdminRoutes = true
		o.cache.NegativeTTL = negTTL
	})
	answer := func(name string) *scriptBackend {
		return newScriptBackend(t, func(c net.Conn, _ *http.Request, _ int) bool { return rawWrite(c, okResponse(name)) })
	}
	envd, app := answer("envd"), answer("app")
	hsetRoute(t, r, id, envd) // container port 8080 only
	pc := h.dialProxy(t)
	if resp, body := pc.do("GET", "8080-"+id+".cube.test", "/", ""); resp.StatusCode != 200 || body != "envd" {
		t.Fatalf("8080 before: %d %q", resp.StatusCode, body)
	}
	resp, body := pc.do("GET", "3000-"+id+".cube.test", "/", "")
	checkProxyError(t, resp, body, 404, CodePortNotMapped)

	if err := r.Client().HSet(context.Background(), redisstore.DefaultKeyPrefix+id, "3000", itoa(app.port)).Err(); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 10*time.Second, "the port exposed in Redis to be served", func() bool {
		resp, body := pc.do("GET", "3000-"+id+".cube.test", "/", "")
		if resp.StatusCode == 404 && strings.Contains(body, `"code":"`+CodePortNotMapped+`"`) {
			return false // within the negative TTL of the last read
		}
		if resp.StatusCode != 200 || body != "app" {
			t.Fatalf("3000 after: %d %q", resp.StatusCode, body)
		}
		return true
	})
	if resp, body := pc.do("GET", "8080-"+id+".cube.test", "/", ""); resp.StatusCode != 200 || body != "envd" {
		t.Fatalf("8080 after: %d %q", resp.StatusCode, body)
	}

	before, start := h.counts.n.Load(), time.Now()
	for range 100 {
		resp, body := pc.do("GET", "4000-"+id+".cube.test", "/", "")
		checkProxyError(t, resp, body, 404, CodePortNotMapped)
	}
	reads, most := h.counts.n.Load()-before, 1+int64(time.Since(start)/negTTL)
	if reads > most {
		t.Fatalf("100 requests for a port never exposed read the store %d times in %v, want at most %d (one per %v)",
			reads, time.Since(start).Round(time.Millisecond), most, negTTL)
	}
}
