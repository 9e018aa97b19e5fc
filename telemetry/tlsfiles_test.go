//go:build unix

package telemetry

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// The exporters' TLS files are checked where serve and check read the
// other OTLP settings. The exporters skipped a file they could not read
// or parse with one error line, and a client certificate without its key
// without a word, so the proxy ran with every export failing its
// handshake ("certificate required"); a FIFO named as the CA hung the
// start; and with an http endpoint a TLS file made the OTLP/HTTP
// exporter refuse to start while check said "configuration ok".
func TestTraceTLSFilesChecked(t *testing.T) {
	ca := testenv.NewCA(t, "collector CA")
	dir := t.TempDir()
	write := func(name string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	caFile := write("ca.pem", ca.CertPEM())
	now := time.Now()
	cc, ck := ca.IssueClient(t, now.Add(-time.Hour), now.Add(time.Hour), "proxy")
	_, otherKey := ca.IssueClient(t, now.Add(-time.Hour), now.Add(time.Hour), "other")
	certFile, keyFile, otherKeyFile := write("client.pem", cc), write("client-key.pem", ck), write("other-key.pem", otherKey)
	fifo := testenv.Mkfifo(t, dir, "ca.fifo")

	const https, http = "https://collector:4318", "http://collector:4318"
	for _, tc := range []struct {
		name    string
		env     map[string]string
		wantErr string // "" : accepted
	}{
		{"CA file", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": https, "OTEL_EXPORTER_OTLP_CERTIFICATE": caFile}, ""},
		{"client pair", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": https, "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE": certFile, "OTEL_EXPORTER_OTLP_CLIENT_KEY": keyFile}, ""},
		{"traces client pair", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": https, "OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE": certFile, "OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY": keyFile}, ""},
		{"no CA file", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": https, "OTEL_EXPORTER_OTLP_CERTIFICATE": filepath.Join(dir, "none.pem")},
			"OTEL_EXPORTER_OTLP_CERTIFICATE"},
		{"CA file holds a key", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": https, "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE": keyFile},
			"OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE=" + `"` + keyFile + `": no PEM certificate`},
		{"CA file a FIFO", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": https, "OTEL_EXPORTER_OTLP_CERTIFICATE": fifo},
			"OTEL_EXPORTER_OTLP_CERTIFICATE"},
		{"client certificate alone", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": https, "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE": certFile},
			"OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE and OTEL_EXPORTER_OTLP_CLIENT_KEY go together"},
		{"traces client key alone", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": https, "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE": certFile,
			"OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY": keyFile}, "go together"},
		{"no client key file", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": https, "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE": certFile,
			"OTEL_EXPORTER_OTLP_CLIENT_KEY": filepath.Join(dir, "none.pem")}, "OTEL_EXPORTER_OTLP_CLIENT_KEY"},
		{"client pair swapped", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": https, "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE": keyFile,
			"OTEL_EXPORTER_OTLP_CLIENT_KEY": certFile}, "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE="},
		{"client key of another certificate", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": https, "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE": certFile,
			"OTEL_EXPORTER_OTLP_CLIENT_KEY": otherKeyFile}, "does not match"},
		{"CA file with an http endpoint", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": http, "OTEL_EXPORTER_OTLP_CERTIFICATE": caFile},
			"OTEL_EXPORTER_OTLP_CERTIFICATE is set while the trace endpoint is plain HTTP"},
		{"client pair with a grpc http endpoint", map[string]string{"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": http,
			"OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE": certFile, "OTEL_EXPORTER_OTLP_CLIENT_KEY": keyFile}, "plain HTTP"},
		{"CA file with the insecure default endpoint", map[string]string{"OTEL_EXPORTER_OTLP_INSECURE": "true", "OTEL_EXPORTER_OTLP_CERTIFICATE": caFile},
			"plain HTTP"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.env["OTEL_TRACES_EXPORTER"] = "otlp"
			cfg := Config{Env: envMap(tc.env), TraceSampleRatio: 1}
			checkErr := cfg.Check()
			tel, err := New(context.Background(), cfg)
			if err == nil {
				defer tel.Shutdown(context.Background())
			}
			if tc.wantErr == "" {
				if err != nil || checkErr != nil {
					t.Fatalf("New: %v; Check: %v; want both nil", err, checkErr)
				}
				return
			}
			for which, err := range map[string]error{"New": err, "Check": checkErr} {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Errorf("%s error %v, want one mentioning %q", which, err, tc.wantErr)
				}
			}
		})
	}
}
