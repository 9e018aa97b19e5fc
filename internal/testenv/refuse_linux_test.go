//go:build linux

package testenv

import (
	"context"
	"net"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// A refusing port refuses dials and no other socket can take it while the
// test runs, not even one that sets SO_REUSEADDR and SO_REUSEPORT (as
// redis-server and a proxy started with reuse_port do).
func TestRefusingPortStaysRefusing(t *testing.T) {
	addr := RefusingAddr(t)
	if c, err := net.DialTimeout("tcp", addr, 2*time.Second); err == nil {
		c.Close()
		t.Fatalf("dial %s connected, want refused", addr)
	}
	for _, tc := range []struct {
		name string
		opts []int
	}{
		{"plain listen", nil},
		{"SO_REUSEADDR and SO_REUSEPORT", []int{syscall.SO_REUSEADDR, unix.SO_REUSEPORT}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
				var serr error
				err := c.Control(func(fd uintptr) {
					for _, o := range tc.opts {
						if serr == nil {
							serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, o, 1)
						}
					}
				})
				if err != nil {
					return err
				}
				return serr
			}}
			ln, err := lc.Listen(context.Background(), "tcp", addr)
			if err == nil {
				ln.Close()
				t.Fatalf("another listener bound %s while it was held", addr)
			}
		})
	}
}
