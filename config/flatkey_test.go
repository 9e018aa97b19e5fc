package config

import "testing"

// A setting written in the file under another of its spellings (its path
// dotted, as the README names it, or its flag's or its variable's) is
// told how the file spells it: the error repeated "unknown key
// upstream.connect_timeout", the setting's own name, and no more.
func TestUnknownKeyInAnotherSpelling(t *testing.T) {
	for _, tc := range []struct {
		name, yaml, want string
	}{
		{"dotted path", "upstream.connect_timeout: 3s\n",
			"line 1: unknown key upstream.connect_timeout (the setting upstream.connect_timeout: the file nests it, connect_timeout: indented under upstream:)"},
		{"flag spelling", "tls-acme-dns-provider: rfc2136\n",
			"line 1: unknown key tls-acme-dns-provider (the setting tls.acme.dns.provider: the file nests it, provider: indented under tls: acme: dns:)"},
		{"variable spelling", "CUBEPROXY_HTTP_ADDR: ':1'\n", "line 1: unknown key CUBEPROXY_HTTP_ADDR (did you mean http_addr?)"},
		{"variable spelling under its section", "redis:\n  SENTINEL_MASTER_NAME: m\n",
			"line 2: unknown key redis.SENTINEL_MASTER_NAME (the setting redis.sentinel.master_name: the file nests it, master_name: indented under redis: sentinel:)"},
		{"a typo still gets the nearest key", "cache:\n  sise: 5\n", "line 2: unknown key cache.sise (did you mean cache.size?)"},
		// A key under the wrong section (client: and upstream: both have
		// timeouts) is told the section that has it: no key of client:
		// is near connect_timeout, and the error named none.
		{"key of another section", "client:\n  connect_timeout: 3s\n", "line 2: unknown key client.connect_timeout (did you mean upstream.connect_timeout?)"},
		{"key of another section, nested deeper", "tls:\n  email: ops@cube.test\n", "line 2: unknown key tls.email (did you mean tls.acme.email?)"},
		{"key of a section written at the top", "size: 5\n", "line 1: unknown key size (did you mean cache.size?)"},
		{"key of two other sections", "redis:\n  idle_timeout: 5s\n", "line 2: unknown key redis.idle_timeout (did you mean upstream.idle_timeout or client.idle_timeout?)"},
	} {
		t.Run(tc.name, func(t *testing.T) { loadWants(t, tc.yaml, tc.want) })
	}
}
