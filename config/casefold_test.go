package config

import (
	"io"
	"strings"
	"testing"
)

// A setting that takes one of a few words takes it in any case, as
// log_level always did (slog reads INFO as info): log_format: JSON was
// refused while log_level: INFO was not, and store: Redis passed config's
// checks of the Redis settings as "not memory" only to be refused by
// serve. The word is kept in its lower-case spelling, which check prints.
func TestEnumSettingsTakeAnyCase(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		env  map[string]string
		got  func(c *Config) string
		want string
	}{
		{"log_format in the file", []string{"--config", writeFile(t, "log_format: JSON\n")}, nil, func(c *Config) string { return c.LogFormat }, "json"},
		{"log_format from the environment", nil, map[string]string{"CUBEPROXY_LOG_FORMAT": "Text"}, func(c *Config) string { return c.LogFormat }, "text"},
		{"log_level from a flag", []string{"--log-level=WARN"}, nil, func(c *Config) string { return c.LogLevel }, "warn"},
		{"access_log.format", []string{"--config", writeFile(t, "access_log:\n  format: Cube\n")}, nil, func(c *Config) string { return c.AccessLog.Format }, "cube"},
		{"access_log.format off", nil, map[string]string{"CUBEPROXY_ACCESS_LOG_FORMAT": "OFF"}, func(c *Config) string { return c.AccessLog.Format }, "off"},
		{"store", []string{"--config", writeFile(t, "store: Redis\nredis:\n  addr: 127.0.0.1:6379\n")}, nil, func(c *Config) string { return c.Store }, "redis"},
		{"tls.source", []string{"--config", writeFile(t, "https_addr: ':8443'\ntls:\n  source: Self_Signed\n")}, nil, func(c *Config) string { return c.TLS.Source }, "self_signed"},
		{"tls.source acme", []string{"--config", writeFile(t, "https_addr: ':8443'\ntls:\n  source: ACME\n  acme:\n    dns:\n      provider: rfc2136\n      options: {server: 'ns:53'}\n")}, nil,
			func(c *Config) string { return c.TLS.Source }, "acme"},
		// Taken in any case by certs all along (it looks them up folded),
		// but check printed them as written.
		{"tls.acme.dns.provider", []string{"--config", writeFile(t, "https_addr: ':8443'\ntls:\n  source: acme\n  acme:\n    dns:\n      provider: RFC2136\n      options: {server: 'ns:53'}\n")}, nil,
			func(c *Config) string { return c.TLS.ACME.DNS.Provider }, "rfc2136"},
		{"the rfc2136 net option", []string{"--config", writeFile(t, "https_addr: ':8443'\ntls:\n  source: acme\n  acme:\n    dns:\n      provider: Rfc2136\n      options: {server: 'ns:53', net: TCP}\n")}, nil,
			func(c *Config) string { return c.TLS.ACME.DNS.Options["net"] }, "tcp"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Load(tc.args, env(tc.env), io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			if got := tc.got(c); got != tc.want {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
	// A word that is none of them is still refused as written, listing
	// the words.
	if _, err := Load([]string{"--tls-source=ACMe2"}, env(nil), io.Discard); err == nil || !strings.HasPrefix(err.Error(), `tls.source "ACMe2": want self_signed, files or acme`) {
		t.Errorf("tls.source ACMe2: %v", err)
	}
}
