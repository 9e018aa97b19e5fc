package main

import (
	"crypto/tls"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// The scrape says when the certificate that expires first does, for an
// alert on a renewal that stopped working (the files source keeps serving
// an expiring pair when its renewal cannot load, and only a warning line
// said so once it had expired). Without an HTTPS listener there is no
// series.
func TestCertificateExpiryMetric(t *testing.T) {
	t.Parallel()
	const expiry = "cubeproxy_tls_certificate_expiry_timestamp_seconds{}"
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "c.pem"), filepath.Join(dir, "k.pem")
	notAfter := time.Now().Add(10 * 24 * time.Hour).Truncate(time.Second)
	certPEM, keyPEM := testenv.NewCA(t, "test CA").IssueValid(t, time.Now().Add(-time.Hour), notAfter, "*.cube.test")
	if err := os.WriteFile(certFile, certPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, keyPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	base := []string{"--http-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0", "--routes=", "--access-log-format", "off"}
	for _, tc := range []struct {
		name string
		args []string
		want func(r *running) (float64, bool) // the value, and whether there is one
	}{
		{"files", []string{"--https-addr", "127.0.0.1:0", "--tls-source", "files", "--tls-cert-file", certFile, "--tls-key-file", keyFile},
			func(*running) (float64, bool) { return float64(notAfter.Unix()), true }},
		{"self_signed", []string{"--https-addr", "127.0.0.1:0"}, func(r *running) (float64, bool) {
			c, err := tls.Dial("tcp", r.a.httpsLn.Addr().String(), &tls.Config{InsecureSkipVerify: true})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			return float64(c.ConnectionState().PeerCertificates[0].NotAfter.Unix()), true
		}},
		{"no https listener", nil, func(*running) (float64, bool) { return 0, false }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := runServe(t, append(append([]string(nil), base...), tc.args...), noEnv)
			want, present := tc.want(r)
			got, ok := series(scrapeFamilies(t, r.a.adminLn.Addr().String()))[expiry]
			if ok != present || got != want {
				t.Fatalf("%s = %v (present %v), want %v (present %v)", expiry, got, ok, want, present)
			}
		})
	}
}
