//go:build unix

package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// Every file the configuration names is refused by check as by serve when
// it is a FIFO (both hung forever on the open) or a directory, with an
// error naming it. The config file itself may be a pipe (ReadOnce; config
// TestLoadConfigFromAPipe).
func TestNamedFileIsNoFIFOForCheckAndServe(t *testing.T) {
	dir := t.TempDir()
	fifo := testenv.Mkfifo(t, dir, "named.fifo")
	const base = "http_addr: 127.0.0.1:0\nadmin_addr: 127.0.0.1:0\n"
	for _, tc := range []struct {
		name string
		yaml string // "" runs with --config naming dir itself
		want string
	}{
		{"config file is a directory", "", dir + " is a directory, not a regular file"},
		{"routes file", "routes: " + fifo + "\n", fifo + " is a named pipe (FIFO), not a regular file"},
		{"routes file is a directory", "routes: " + dir + "\n", dir + " is a directory, not a regular file"},
		{"redis ca_file", "store: redis\nredis:\n  addr: 127.0.0.1:1\n  tls: true\n  ca_file: " + fifo + "\n", fifo + " is a named pipe (FIFO), not a regular file"},
		{"tls cert_file", "https_addr: 127.0.0.1:0\ntls:\n  cert_file: " + fifo + "\n  key_file: " + fifo + "\n", fifo + " is a named pipe (FIFO), not a regular file"},
		{"acme trusted_roots_file", "https_addr: 127.0.0.1:0\ntls:\n  source: acme\n  domain: cube.test\n  acme:\n    email: ops@cube.test\n    storage_dir: " + dir + "/acme\n    trusted_roots_file: " + fifo +
			"\n    dns:\n      provider: rfc2136\n      options: {server: 127.0.0.1:53, key_name: k., key_secret: c2VjcmV0}\n", fifo + " is a named pipe (FIFO), not a regular file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := dir
			if tc.yaml != "" {
				cfg = writeTemp(t, t.TempDir(), "cubeproxy.yaml", base+tc.yaml)
			}
			args := []string{"--config", cfg}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			for _, cmd := range []string{"check", "serve"} {
				var out, errb bytes.Buffer
				done := make(chan int, 1)
				go func() {
					done <- run(ctx, append([]string{cmd}, args...), noEnv, &out, &errb)
				}()
				select {
				case code := <-done:
					if code != 1 || !strings.Contains(errb.String(), tc.want) {
						t.Errorf("%s: exit %d (want 1), stderr %q (want %q in it)", cmd, code, errb.String(), tc.want)
					}
				case <-time.After(10 * time.Second):
					t.Fatalf("%s has not returned after 10s", cmd)
				}
			}
		})
	}
}
