package config

import (
	"io"
	"strings"
	"testing"
)

// Every bounded setting takes its limit and refuses one step past it: the
// checks are written with < and >, and an off-by-one would refuse a value
// the README names as allowed (trace_sample_ratio: 1, ttl_min equal to
// ttl_max, port 65535) or let one past the limit through to the listener
// or the allocator.
func TestLimitsTakeTheEdge(t *testing.T) {
	for _, tc := range []struct {
		name     string
		ok, past map[string]string
		want     string // in past's error
	}{
		{"shortest duration",
			map[string]string{"CUBEPROXY_UPSTREAM_CONNECT_TIMEOUT": "1ms"},
			map[string]string{"CUBEPROXY_UPSTREAM_CONNECT_TIMEOUT": "999999ns"}, "upstream.connect_timeout: 999.999µs is below 1ms"},
		{"longest duration",
			map[string]string{"CUBEPROXY_UPSTREAM_CONNECT_TIMEOUT": "8760h"},
			map[string]string{"CUBEPROXY_UPSTREAM_CONNECT_TIMEOUT": "8760h1ns"}, "upstream.connect_timeout: 8760h0m0.000000001s is above 8760h0m0s"},
		{"trace sample ratio",
			map[string]string{"CUBEPROXY_TELEMETRY_TRACE_SAMPLE_RATIO": "1"},
			map[string]string{"CUBEPROXY_TELEMETRY_TRACE_SAMPLE_RATIO": "1.0001"}, "telemetry.trace_sample_ratio: 1.0001 is not a fraction"},
		{"cache ttl_min up to ttl_max",
			map[string]string{"CUBEPROXY_CACHE_TTL_MIN": "10m", "CUBEPROXY_CACHE_TTL_MAX": "10m"},
			map[string]string{"CUBEPROXY_CACHE_TTL_MIN": "10m1s", "CUBEPROXY_CACHE_TTL_MAX": "10m"}, "cache.ttl_min (10m1s) is above cache.ttl_max (10m0s)"},
		{"cache ttl_max alone down to ttl_min's default",
			map[string]string{"CUBEPROXY_CACHE_TTL_MAX": "500s"},
			map[string]string{"CUBEPROXY_CACHE_TTL_MAX": "499s"}, "cache.ttl_max (8m19s) is below cache.ttl_min's default"},
		{"redirect port",
			map[string]string{"CUBEPROXY_HTTPS_ADDR": ":8443", "CUBEPROXY_TLS_REDIRECT_PORT": "65535"},
			map[string]string{"CUBEPROXY_HTTPS_ADDR": ":8443", "CUBEPROXY_TLS_REDIRECT_PORT": "65536"}, "tls.redirect_port: 65536 is not a port"},
		{"listen port",
			map[string]string{"CUBEPROXY_HTTP_ADDR": ":65535"},
			map[string]string{"CUBEPROXY_HTTP_ADDR": ":65536"}, `http_addr ":65536": port 65536 is above 65535`},
		{"smallest header limit",
			map[string]string{"CUBEPROXY_CLIENT_MAX_HEADER_SIZE": "1024"},
			map[string]string{"CUBEPROXY_CLIENT_MAX_HEADER_SIZE": "1023"}, "client.max_header_size: 1023 is below 1024 bytes"},
		{"largest header limit",
			map[string]string{"CUBEPROXY_UPSTREAM_MAX_HEADER_SIZE": "1048576"},
			map[string]string{"CUBEPROXY_UPSTREAM_MAX_HEADER_SIZE": "1048577"}, "upstream.max_header_size: 1048577 is above 1048576 bytes"},
		{"access log buffer",
			map[string]string{"CUBEPROXY_ACCESS_LOG_BUFFER_LINES": "1048576"},
			map[string]string{"CUBEPROXY_ACCESS_LOG_BUFFER_LINES": "1048577"}, "access_log.buffer_lines: 1048577 is above 1048576"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := Load([]string{"--config="}, env(tc.ok), io.Discard); err != nil {
				t.Errorf("%v refused: %v", tc.ok, err)
			}
			_, err := Load([]string{"--config="}, env(tc.past), io.Discard)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("%v: error %v, want it to say %q", tc.past, err, tc.want)
			}
		})
	}
}
