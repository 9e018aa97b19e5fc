package testenv

import (
	"path/filepath"
	"strconv"
	"testing"
)

// A redis-server started on a port that another one already serves exits
// ("Address already in use"), but the other answers PING: the start must
// not take that answer as its own server's, or the test would run against
// another test's Redis (and lose it when that one stops).
func TestStartOnATakenPortFails(t *testing.T) {
	for _, tc := range []struct {
		name     string
		password string
	}{
		{"no password", ""},
		{"requirepass", "s3cret"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var args []string
			if tc.password != "" {
				args = []string{"--requirepass", tc.password}
			}
			other := StartRedis(t, args...)
			dir := t.TempDir()
			r := &Redis{t: t, bin: redisServerPath(t), port: other.Port(), dir: dir, password: tc.password,
				args: append([]string{"--port", strconv.Itoa(other.Port()), "--bind", "127.0.0.1",
					"--dir", dir, "--logfile", filepath.Join(dir, "redis.log"), "--save", "", "--appendonly", "no"}, args...)}
			t.Cleanup(r.Stop)
			if err := r.start(); err == nil {
				t.Fatalf("start on %s, served by another redis-server, succeeded", r.Addr())
			}
		})
	}
}
