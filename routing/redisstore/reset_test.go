package redisstore_test

import (
	"context"
	"io"
	"net"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
	"github.com/cube-sandbox/cubeproxy/routing/redisstore"
)

// resetProxy forwards connections to target, but resets the first
// resets of them once their first command arrived, before any reply: what a
// Redis restarting (or a load balancer in front of it) does to a fresh
// connection.
func resetProxy(t *testing.T, target string, resets int) (addr string, accepted *atomic.Int64) {
	t.Helper()
	accepted = new(atomic.Int64)
	l := testenv.ServeTCP(t, func(c net.Conn) {
		if accepted.Add(1) <= int64(resets) {
			buf := make([]byte, 1024)
			_, _ = c.Read(buf)
			c.(*net.TCPConn).SetLinger(0)
			c.Close()
			return
		}
		up, err := net.Dial("tcp", target)
		if err != nil {
			c.Close()
			return
		}
		go func() { _, _ = io.Copy(up, c); up.Close() }()
		_, _ = io.Copy(c, up)
		c.Close()
	})
	return l.Addr().String(), accepted
}

// TestLookupRetriesResetBeforeReply: a fresh plain-text connection reset
// before the server's first reply is retried like a dropped one.
func TestLookupRetriesResetBeforeReply(t *testing.T) {
	testenv.ParallelRedis(t)
	r := testenv.StartRedis(t)
	hset(t, r, redisstore.DefaultKeyPrefix+"x", "HostIP", "10.0.0.1")
	for _, resets := range []int{1, 2} {
		t.Run(strconv.Itoa(resets), func(t *testing.T) {
			addr, _ := resetProxy(t, r.Addr(), resets)
			s := openStoreCfg(t, redisstore.Config{Addr: addr})
			if _, err := s.Lookup(context.Background(), "x"); err != nil {
				t.Fatalf("lookup after %d reset connections: %v", resets, err)
			}
		})
	}
}
