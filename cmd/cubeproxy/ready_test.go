package main

import (
	"strings"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// On the memory store the proxy is ready as it listens: "cubeproxy ready"
// follows "cubeproxy listening" at once, and only once (TestRedisReadyz
// has a store that answers late).
func TestReadyLoggedAfterListening(t *testing.T) {
	t.Parallel()
	r := runServe(t, []string{"--http-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0",
		"--routes", boxRoutes(t, t.TempDir(), 1), "--access-log-format", "off"}, noEnv)
	testenv.WaitFor(t, 5*time.Second, `"cubeproxy ready" in the log`, func() bool {
		return strings.Contains(r.logs.String(), `"cubeproxy ready"`)
	})
	log := r.logs.String()
	if strings.Index(log, `"cubeproxy listening"`) > strings.Index(log, `"cubeproxy ready"`) {
		t.Fatalf("ready logged before listening:\n%s", log)
	}
	r.stop()
	if n := strings.Count(r.logs.String(), `"cubeproxy ready"`); n != 1 {
		t.Fatalf("ready logged %d times, want once:\n%s", n, r.logs.String())
	}
}
