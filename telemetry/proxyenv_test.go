package telemetry

import (
	"strings"
	"testing"
)

// TestTraceProxyVariables: the proxy variable the trace exporter would
// send its exports through is refused where the exporter cannot use it as
// written, and never shown. Go's HTTP client (which gRPC's proxy support
// reads the variables through too) ignored an HTTPS_PROXY that does not
// parse, a password's unescaped %, unsaid: the exports went around the
// proxy (measured with tinyproxy: none reached it, check passed). One with
// a scheme and a password's unescaped # or / it read as a proxy named
// "http" ("lookup http: no such host"). gRPC dialed an https:// or
// socks5:// proxy with plain HTTP CONNECT, and one without a port on 443.
func TestTraceProxyVariables(t *testing.T) {
	const (
		https = "https://collector.example.com:4318"
		http  = "http://collector.example.com:4318"
	)
	tests := []struct {
		name     string
		endpoint string
		grpc     bool
		env      map[string]string
		wantErr  string
	}{
		{"credentials", https, false, map[string]string{"HTTPS_PROXY": "http://user:s3cret@proxy:3128"}, ""},
		{"no scheme", https, false, map[string]string{"HTTPS_PROXY": "proxy:3128"}, ""},
		{"no scheme, credentials", https, false, map[string]string{"HTTPS_PROXY": "user:s3cret@proxy:3128"}, ""},
		{"escaped password", https, false, map[string]string{"HTTPS_PROXY": "http://user:s3%25cr%23et@proxy:3128"}, ""},
		{"socks5", https, false, map[string]string{"HTTPS_PROXY": "socks5://user:s3cret@proxy:1080"}, ""},
		{"bad escape", https, false, map[string]string{"HTTPS_PROXY": "http://user:s3cret%zz@proxy:3128"},
			"HTTPS_PROXY (not shown: it may hold the proxy's password) does not parse"},
		{"lower case", https, false, map[string]string{"https_proxy": "http://user:s3cret%zz@proxy:3128"}, "https_proxy (not shown"},
		{"upper case first", https, false, map[string]string{"HTTPS_PROXY": "http://proxy:3128", "https_proxy": "http://user:s3cret%zz@proxy:3128"}, ""},
		{"unescaped #", https, false, map[string]string{"HTTPS_PROXY": "http://user:s3cret#1@proxy:3128"}, "does not parse"},
		{"unescaped /", https, false, map[string]string{"HTTPS_PROXY": "http://user:s3cret/1@proxy:3128"}, "does not parse"},
		{"one slash", https, false, map[string]string{"HTTPS_PROXY": "http:/proxy:3128"}, "does not parse"},
		{"socks4", https, false, map[string]string{"HTTPS_PROXY": "socks4://proxy:1080"}, "is a socks4 proxy"},
		// The variable for the other scheme is not the exporter's.
		{"http endpoint, bad HTTPS_PROXY", http, false, map[string]string{"HTTPS_PROXY": "http://user:s3cret%zz@proxy:3128"}, ""},
		{"http endpoint, bad HTTP_PROXY", http, false, map[string]string{"HTTP_PROXY": "http://user:s3cret%zz@proxy:3128"}, "HTTP_PROXY (not shown"},
		// Nor is a variable Go would not use for the endpoint.
		{"NO_PROXY", https, false, map[string]string{"HTTPS_PROXY": "http://user:s3cret%zz@proxy:3128", "NO_PROXY": ".example.com"}, ""},
		{"no_proxy", https, false, map[string]string{"HTTPS_PROXY": "http://user:s3cret%zz@proxy:3128", "no_proxy": "collector.example.com:4318"}, ""},
		{"NO_PROXY another host", https, false, map[string]string{"HTTPS_PROXY": "http://user:s3cret%zz@proxy:3128", "NO_PROXY": "other.example.com"}, "does not parse"},
		{"loopback endpoint", "https://127.0.0.1:4318", false, map[string]string{"HTTPS_PROXY": "http://user:s3cret%zz@proxy:3128"}, ""},
		{"default endpoint", "", false, map[string]string{"HTTPS_PROXY": "http://user:s3cret%zz@proxy:3128"}, ""},
		// gRPC reads HTTPS_PROXY whatever the endpoint's scheme.
		{"grpc", http, true, map[string]string{"HTTPS_PROXY": "http://user:s3cret@proxy:3128"}, ""},
		{"grpc bad HTTPS_PROXY", http, true, map[string]string{"HTTPS_PROXY": "http://user:s3cret%zz@proxy:3128"}, "HTTPS_PROXY (not shown"},
		{"grpc bad HTTP_PROXY", http, true, map[string]string{"HTTP_PROXY": "http://user:s3cret%zz@proxy:3128"}, ""},
		{"grpc socks5", https, true, map[string]string{"HTTPS_PROXY": "socks5://user:s3cret@proxy:1080"}, "is a socks5 proxy: the gRPC trace exporter"},
		{"grpc https proxy", https, true, map[string]string{"HTTPS_PROXY": "https://proxy:3129"}, "is a https proxy"},
		{"grpc no port", https, true, map[string]string{"HTTPS_PROXY": "http://user:s3cret@proxy"}, "has no port"},
		{"no port", https, false, map[string]string{"HTTPS_PROXY": "http://user:s3cret@proxy"}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env := map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_ENDPOINT": tt.endpoint}
			if tt.grpc {
				env["OTEL_EXPORTER_OTLP_PROTOCOL"] = "grpc"
			}
			for k, v := range tt.env {
				env[k] = v
			}
			err := Config{Env: envMap(env)}.Check()
			switch {
			case tt.wantErr == "" && err != nil:
				t.Fatalf("Check: %v", err)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Fatalf("Check error %v, want one mentioning %q", err, tt.wantErr)
			case err != nil && strings.Contains(err.Error(), "s3cret"):
				t.Errorf("Check error %q shows the proxy's password", err)
			}
			// Tracing off, the variables are not looked at.
			delete(env, "OTEL_TRACES_EXPORTER")
			if err := (Config{Env: envMap(env)}).Check(); err != nil {
				t.Errorf("Check with tracing off: %v", err)
			}
		})
	}
}

// exportVia names the proxy a failed export went through, by its host and
// the variable, never its credentials, and nothing when the exports go
// direct.
func TestExportVia(t *testing.T) {
	const proxy = "http://user:s3cret@squid:3128"
	tests := []struct {
		name string
		env  map[string]string
		grpc bool
		want string
	}{
		{"https", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "https://collector:4318", "HTTPS_PROXY": proxy}, false, "through the proxy squid:3128 of HTTPS_PROXY"},
		{"traces endpoint", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "https://collector:4318", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces",
			"HTTPS_PROXY": proxy, "http_proxy": "squid:3129"}, false, "through the proxy squid:3129 of http_proxy"},
		{"grpc reads HTTPS_PROXY", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4317", "HTTPS_PROXY": proxy, "HTTP_PROXY": "http://other:3128"}, true, "through the proxy squid:3128 of HTTPS_PROXY"},
		{"direct", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "https://collector:4318", "HTTP_PROXY": proxy}, false, ""},
		{"NO_PROXY", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "https://collector:4318", "HTTPS_PROXY": proxy, "NO_PROXY": "collector"}, false, ""},
		{"loopback", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "https://127.0.0.1:4318", "HTTPS_PROXY": proxy}, false, ""},
		{"default endpoint", map[string]string{"HTTPS_PROXY": proxy}, false, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := exportVia(envMap(tt.env), tt.grpc); got != tt.want {
				t.Errorf("exportVia = %q, want %q", got, tt.want)
			}
		})
	}
}
