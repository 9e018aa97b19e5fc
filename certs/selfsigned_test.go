package certs_test

import (
	"context"
	"crypto/tls"
	"log/slog"
	"slices"
	"strings"
	"testing"

	"github.com/cube-sandbox/cubeproxy/certs"
	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

func TestSelfSignedIsDefaultAndCoversDomain(t *testing.T) {
	var logs testenv.LogBuffer
	m, err := certs.New(context.Background(), certs.Config{
		Domain: "cube.test", // Source "" means self_signed
		Logger: slog.New(slog.NewTextHandler(&logs, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })
	if !strings.Contains(logs.String(), "self-signed certificate for development only") {
		t.Fatalf("missing development warning in logs:\n%s", logs.String())
	}
	srv := serveTLS(t, m)

	for _, sni := range []string{"50005-abc.cube.test", ""} {
		cfg := &tls.Config{InsecureSkipVerify: true, ServerName: sni, NextProtos: []string{"http/1.1"}}
		leaf, err := fetch(t, srv.addr, cfg, "50005-abc.cube.test")
		if err != nil {
			t.Fatalf("sni %q: %v", sni, err)
		}
		if want := []string{"cube.test", "*.cube.test", "localhost"}; !slices.Equal(leaf.DNSNames, want) {
			t.Fatalf("DNS names %v, want %v", leaf.DNSNames, want)
		}
		for _, name := range []string{"50005-abc.cube.test", "cube.test", "localhost", "127.0.0.1", "::1"} {
			if err := leaf.VerifyHostname(name); err != nil {
				t.Errorf("leaf does not cover %s: %v", name, err)
			}
		}
	}
}
