package redisstore_test

import (
	"context"
	"net"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
	"github.com/cube-sandbox/cubeproxy/routing/redisstore"
)

// TestUnixSocketResetNamesNoTLSPort: a server on a unix:// socket that
// resets each connection before it answers (here: it closes with the
// client's command unread, which Linux reports to the client as a reset;
// a Redis that exits with connections in its backlog does the same) was
// named with the hint for a TCP port that speaks only TLS, "a TLS port?
// set redis.tls, or use a rediss:// URL", which no unix socket can be.
// The error names the socket and the reset, without the hint.
func TestUnixSocketResetNamesNoTLSPort(t *testing.T) {
	t.Parallel()
	sock := filepath.Join(t.TempDir(), "redis.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	testenv.Serve(t, l, func(c net.Conn) {
		_, _ = c.Read(make([]byte, 1)) // the command has come; the rest stays unread
		_ = c.Close()
	})
	s := openStoreCfg(t, redisstore.Config{URL: "unix://" + sock})
	_, err = s.Lookup(context.Background(), "x")
	if err == nil || !strings.Contains(err.Error(), sock) || !strings.Contains(err.Error(), "connection reset by peer") {
		t.Fatalf("lookup through a unix socket that resets: %v, want the socket and the reset named", err)
	}
	if strings.Contains(err.Error(), "TLS port") || strings.Contains(err.Error(), "redis.tls") {
		t.Errorf("lookup error %q suggests TLS for a unix socket", err)
	}
}
