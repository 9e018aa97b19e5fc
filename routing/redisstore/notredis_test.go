package redisstore_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
	"github.com/cube-sandbox/cubeproxy/routing/redisstore"
)

// TestLookupNamesWrongKindOfServer: a redis.addr that names something
// other than a plain-text Redis port is the first mistake of many a
// deployment, and the lookup's error (the log's, /readyz's detail) says
// which server it was and what it looks like, not go-redis's bare
// reading of the bytes. A TLS-only Redis (tls-port, port 0; a managed
// Redis with encryption in transit) dialed without redis.tls reset each
// connection, and the error said "read: connection reset by peer" alone;
// an HTTP service said "redis: can't parse map reply" or "invalid reply"
// and named no server either.
func TestLookupNamesWrongKindOfServer(t *testing.T) {
	testenv.ParallelRedis(t)
	for _, tc := range []struct {
		name  string
		start func(t *testing.T) (addr string)
		want  []string // besides the address
	}{
		{"TLS-only Redis dialed in plain text", func(t *testing.T) string {
			caFile, certFile, keyFile := writeTLSFiles(t)
			r := testenv.StartRedis(t, "--tls-port", testenv.AnotherPort, "--tls-cert-file", certFile,
				"--tls-key-file", keyFile, "--tls-ca-cert-file", caFile, "--tls-auth-clients", "no")
			return r.OtherAddr()
		}, []string{"before answering", "redis.tls", "rediss://"}},
		{"an HTTP service", func(t *testing.T) string {
			srv := httptest.NewServer(http.NotFoundHandler())
			t.Cleanup(srv.Close)
			return srv.Listener.Addr().String()
		}, []string{"not as Redis", `"HTTP/1.1 400 Bad Request"`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addr := tc.start(t)
			s := openStoreCfg(t, redisstore.Config{Addr: addr})
			_, err := s.Lookup(context.Background(), "x")
			if err == nil {
				t.Fatal("lookup succeeded against a server that is no plain-text Redis")
			}
			t.Logf("lookup err: %v", err)
			for _, want := range append([]string{addr}, tc.want...) {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("lookup err = %q, want it to hold %q", err, want)
				}
			}
		})
	}
}
