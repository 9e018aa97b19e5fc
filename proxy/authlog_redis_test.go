package proxy

import (
	"context"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/auth"
	"github.com/cube-sandbox/cubeproxy/internal/testenv"
	"github.com/cube-sandbox/cubeproxy/routing/redisstore"
)

// A restricted route the control plane wrote without its token is logged
// as a data error at most once a second, not once per request: every
// request to it is refused, and anyone on the internet can send those, a
// line each filling the disk and crowding other lines out of the process
// log (the access log and cubeproxy_auth_rejections_total count them all).
func TestTokenlessRouteLogIsRateLimited(t *testing.T) {
	r := testenv.StartRedis(t)
	store, err := redisstore.Open(redisstore.Config{Addr: r.Addr()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close() })
	logs := new(obsLogBuf)
	h := newHarness(t, func(o *harnessOpts) {
		o.store = store
		o.noAdminRoutes = true
		o.cfg.Logger = slog.New(slog.NewJSONHandler(logs, nil))
	})
	port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		t.Error("a request to a restricted route without a token reached the sandbox")
	}))
	if err := r.Client().HSet(context.Background(), redisstore.DefaultKeyPrefix+"tokenless", "HostIP", "127.0.0.1",
		"SandboxIP", "127.0.0.1", "CreatedAt", "1", "AllowPublicTraffic", "false", itoa(port), itoa(port)).Err(); err != nil {
		t.Fatal(err)
	}
	host := itoa(port) + "-tokenless.cube.test"
	start := time.Now()
	const n = 50
	for i := range n {
		if st, body, _ := h.get(host, "/"); st != 403 || !strings.Contains(body, auth.CodeTrafficTokenNotConfigured) {
			t.Fatalf("request %d to a tokenless restricted route: %d %s", i, st, body)
		}
	}
	// A loaded machine may take longer than a second for the batch; the
	// limit then allows a line for each second begun, still far below n.
	elapsed := time.Since(start)
	most := 1 + int(elapsed/time.Second)
	lines := strings.Count(logs.String(), "restricted route has no traffic token")
	if lines < 1 || lines > most {
		t.Errorf("%d requests to a tokenless restricted route (%v) logged %d error lines, want 1 to %d", n, elapsed, lines, most)
	}
	if !strings.Contains(logs.String(), `"sandbox_id":"tokenless"`) {
		t.Errorf("the data error does not name the sandbox:\n%s", logs.String())
	}
}
