package proxy

import (
	"context"
	"log/slog"
	"net/http"
	"strings"
	"testing"

	"github.com/cube-sandbox/cubeproxy/auth"
	"github.com/cube-sandbox/cubeproxy/internal/testenv"
	"github.com/cube-sandbox/cubeproxy/routing/redisstore"
)

// A restricted route the control plane wrote without its token is logged
// as a data error once per store read of it, not once per request: every
// request to it is refused, and anyone on the internet can send those, a
// line each filling the disk and crowding other lines out of the process
// log (the access log and cubeproxy_auth_rejections_total count them all).
// Nor may one flooded route hide another: the line was limited to one a
// second across all sandboxes, so a second broken route whose requests
// came in the same seconds as a flooded one's was never named.
func TestTokenlessRouteLogIsRateLimited(t *testing.T) {
	h, r, logs := redisLogHarness(t)
	port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		t.Error("a request to a restricted route without a token reached the sandbox")
	}))
	for _, id := range []string{"flooded", "quiet"} {
		if err := r.Client().HSet(context.Background(), redisstore.DefaultKeyPrefix+id, "HostIP", "127.0.0.1",
			"SandboxIP", "127.0.0.1", "CreatedAt", "1", "AllowPublicTraffic", "false", itoa(port), itoa(port)).Err(); err != nil {
			t.Fatal(err)
		}
	}
	const n = 50
	for i := range n {
		// The quiet route's one request comes amid the flood.
		for _, id := range []string{"flooded", "quiet"} {
			if id == "quiet" && i != n/2 {
				continue
			}
			host := itoa(port) + "-" + id + ".cube.test"
			if st, body, _ := h.get(host, "/"); st != 403 || !strings.Contains(body, auth.CodeTrafficTokenNotConfigured) {
				t.Fatalf("request %d to tokenless restricted route %s: %d %s", i, id, st, body)
			}
		}
	}
	for _, id := range []string{"flooded", "quiet"} {
		var lines int
		for l := range strings.Lines(logs.String()) {
			if strings.Contains(l, "restricted route has no traffic token") && strings.Contains(l, `"sandbox_id":"`+id+`"`) {
				lines++
			}
		}
		if lines != 1 {
			t.Errorf("requests to tokenless restricted route %s (read once) logged %d data error lines naming it, want 1:\n%s", id, lines, logs.String())
		}
	}
}

// A restricted route written without its token is a data error as an
// invalid route is: the same level (warn: one sandbox's data, not the
// proxy failing), the field and reason, and the Redis key that holds it,
// which the operator has to fix (a legacy key, say). It was an error line
// naming only the sandbox.
func TestTokenlessRouteLogNamesKey(t *testing.T) {
	h, r, logs := redisLogHarness(t)
	port := backend(t, "127.0.0.1", http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
		t.Error("a request to a restricted route without a token reached the sandbox")
	}))
	for _, tc := range []struct{ id, key string }{
		{"tokenless", redisstore.DefaultKeyPrefix + "tokenless"},
		{"oldtokenless", redisstore.DefaultLegacyKeyPrefix + "oldtokenless"},
	} {
		if err := r.Client().HSet(context.Background(), tc.key, "HostIP", "127.0.0.1", "SandboxIP", "127.0.0.1",
			"CreatedAt", "1", "AllowPublicTraffic", "false", itoa(port), itoa(port)).Err(); err != nil {
			t.Fatal(err)
		}
		if st, body, _ := h.get(itoa(port)+"-"+tc.id+".cube.test", "/"); st != 403 {
			t.Fatalf("%s: %d %s, want 403", tc.id, st, body)
		}
		var line map[string]any
		for _, l := range logLines(t, logs.String(), "restricted route has no traffic token; refusing it (fix the route data)") {
			if l["sandbox_id"] == tc.id {
				line = l
			}
		}
		if line == nil {
			t.Fatalf("%s: no data error line:\n%s", tc.id, logs.String())
		}
		if line["level"] != "WARN" || line["field"] != "TrafficAccessToken" || line["reason"] == nil || line["key"] != tc.key {
			t.Errorf("%s: logged %v, want level WARN, field TrafficAccessToken, a reason and key %s", tc.id, line, tc.key)
		}
	}
}

// redisLogHarness is a harness on a fresh redis-server's store (no admin
// routes: what the test writes to Redis is what the proxy reads) whose
// process log, as JSON lines, is logs.
func redisLogHarness(t *testing.T) (h *harness, r *testenv.Redis, logs *obsLogBuf) {
	t.Helper()
	r = testenv.StartRedis(t)
	store, err := redisstore.Open(redisstore.Config{Addr: r.Addr()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close() })
	logs = new(obsLogBuf)
	h = newHarness(t, func(o *harnessOpts) {
		o.store = store
		o.noAdminRoutes = true
		o.cfg.Logger = slog.New(slog.NewJSONHandler(logs, nil))
	})
	return h, r, logs
}
