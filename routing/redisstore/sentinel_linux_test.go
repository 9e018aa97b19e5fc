package redisstore_test

import (
	"net"
	"strconv"
	"testing"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// TestSentinelsDownErrorNamesFrozen: a sentinel whose SYNs are dropped (a
// frozen host, a full backlog) outlasts the dial's budget, and go-redis,
// which dials in the background, failed every lookup with a bare
// "redis hgetall KEY: context deadline exceeded" before the sentinels'
// error was known: /readyz and the log named no sentinel. Linux only, as
// testenv.FrozenListener.
func TestSentinelsDownErrorNamesFrozen(t *testing.T) {
	testenv.ParallelRedis(t)
	frozen := net.JoinHostPort("127.0.0.1", strconv.Itoa(int(testenv.FrozenListener(t))))
	checkSentinelsDownError(t, []string{testenv.RefusingAddr(t), frozen, testenv.StartSilentServer(t).Addr}, 0, 4)
}
