//go:build unix

package certs_test

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/certs"
	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// Every file the tls section names (certificate, key, ACME trusted
// roots, the DNS provider's key_secret_file) must be a regular file of at
// most 4 MiB: a FIFO hung serve and check forever, /dev/zero was read
// until the process ran out of memory. serve (New) and check (CheckACME
// for acme) refuse alike, naming the file.
func TestNamedFilesMustBeRegularAndSmall(t *testing.T) {
	dir := t.TempDir()
	fifo := testenv.Mkfifo(t, dir, "fifo.pem")
	huge := testenv.SparseFile(t, dir, "huge.pem", 4<<20+1)
	ca := testenv.NewCA(t, "test CA")
	pair := certs.FilePair{CertFile: filepath.Join(dir, "ok.crt"), KeyFile: filepath.Join(dir, "ok.key")}
	ca.WritePair(t, pair.CertFile, pair.KeyFile, "cube.test")

	files := func(cert, key string) certs.Config {
		return certs.Config{Source: certs.SourceFiles, Files: []certs.FilePair{{CertFile: cert, KeyFile: key}}}
	}
	acme := func(edit func(a *certs.ACMEConfig)) certs.Config {
		c := certs.Config{
			Source: certs.SourceACME, Domain: "cube.test",
			ACME: certs.ACMEConfig{
				Email: "ops@cube.test", StorageDir: filepath.Join(dir, "acme"),
				DNS: certs.DNSConfig{Provider: "rfc2136", Options: map[string]string{"server": "127.0.0.1:53", "key_name": "k."}},
			},
		}
		edit(&c.ACME)
		return c
	}
	for _, tc := range []struct {
		name string
		cfg  certs.Config
		path string
		want string
	}{
		{"certificate is a FIFO", files(fifo, pair.KeyFile), fifo, "is a named pipe (FIFO), not a regular file"},
		{"key is a FIFO", files(pair.CertFile, fifo), fifo, "is a named pipe (FIFO), not a regular file"},
		{"certificate is a directory", files(dir, pair.KeyFile), dir, "is a directory, not a regular file"},
		{"key is /dev/zero", files(pair.CertFile, "/dev/zero"), "/dev/zero", "is a character device, not a regular file"},
		{"certificate above 4 MiB", files(huge, pair.KeyFile), huge, "above the 4 MiB"},
		{"trusted roots are a FIFO", acme(func(a *certs.ACMEConfig) { a.TrustedRootsFile = fifo; a.DNS.Options["key_secret"] = "c2VjcmV0" }), fifo, "is a named pipe (FIFO), not a regular file"},
		{"trusted roots above 4 MiB", acme(func(a *certs.ACMEConfig) { a.TrustedRootsFile = huge; a.DNS.Options["key_secret"] = "c2VjcmV0" }), huge, "above the 4 MiB"},
		{"key_secret_file is a FIFO", acme(func(a *certs.ACMEConfig) { a.DNS.Options["key_secret_file"] = fifo }), fifo, "is a named pipe (FIFO), not a regular file"},
		{"key_secret_file is /dev/zero", acme(func(a *certs.ACMEConfig) { a.DNS.Options["key_secret_file"] = "/dev/zero" }), "/dev/zero", "is a character device, not a regular file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			steps := []struct {
				name string
				run  func() error
			}{{"New", func() error {
				m, err := certs.New(context.Background(), tc.cfg)
				if err == nil {
					_ = m.Close()
				}
				return err
			}}}
			if tc.cfg.Source == certs.SourceACME {
				steps = append(steps, struct {
					name string
					run  func() error
				}{"CheckACME", func() error { return certs.CheckACME(tc.cfg) }})
			}
			for _, step := range steps {
				done := make(chan error, 1)
				go func() { done <- step.run() }()
				var err error
				select {
				case err = <-done:
				case <-time.After(10 * time.Second):
					t.Fatalf("%s has not returned after 10s", step.name)
				}
				if err == nil || !strings.Contains(err.Error(), tc.path) || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("%s = %v; want an error naming %s: %q", step.name, err, tc.path, tc.want)
				}
			}
		})
	}
}
