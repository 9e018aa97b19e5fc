package config

import (
	"io"
	"strings"
	"testing"
)

// A mistake in the file is reported with the key it is under and the kind
// of value that key takes, as -h names them, not with the decoder's Go
// types: "cannot unmarshal !!int `30` into time.Duration" left the
// operator who wrote drain_timeout: 30 to find the key by its line and to
// guess what a time.Duration is. Where the line cannot be tied to one key
// for sure (a value that came through an alias), the decoder's words stay.
func TestLoadExplainsTypeErrors(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		want       []string // each must appear; "" lines never do
	}{
		{"unknown key", "http_adr: ':1'\n", []string{"line 1: unknown key http_adr (did you mean http_addr?)"}},
		{"unknown nested key", "cache:\n  sizee: 5\n", []string{"line 2: unknown key cache.sizee (did you mean cache.size?)"}},
		{"key in upper case", "HTTP_ADDR: ':1'\n", []string{"line 1: unknown key HTTP_ADDR (did you mean http_addr?)"}},
		{"unknown key far from any", "frobnicate: 1\n", []string{"line 1: unknown key frobnicate"}},
		{"unknown key in a list item", "tls:\n  files:\n    - cert_file: a\n      keyfile: b\n",
			[]string{"line 4: unknown key tls.files.keyfile (did you mean tls.files.key_file?)"}},
		{"duration without unit", "drain_timeout: 30\n", []string{"line 1: drain_timeout: want a duration with its unit (30s, 5m, 2h), got `30`"}},
		{"nested duration", "upstream:\n  connect_timeout: 3 seconds\n", []string{"line 2: upstream.connect_timeout: want a duration with its unit"}},
		{"size with a unit", "max_request_body: 256MiB\n", []string{"line 1: max_request_body: want a whole number, got `256MiB`"}},
		{"long value", "cache:\n  size: lots-and-lots\n", []string{"line 2: cache.size: want a whole number, got `lots-an...`"}},
		{"bool", "reuse_port: yes please\n", []string{"line 1: reuse_port: want true or false (yes/no and on/off work too), got `yes please`"}},
		// A template that quotes every value ("{{ .Values.x }}"): the quotes
		// make a string of a word the key would take bare, and `true` alone
		// left "want true or false, got true" to puzzle over.
		{"quoted bool", "reuse_port: \"true\"\n", []string{"line 1: reuse_port: want true or false (yes/no and on/off work too), got \"true\" in quotes, a string: write it without them"}},
		{"quoted number", "cache:\n  size: '5000'\n", []string{"line 2: cache.size: want a whole number, got '5000' in quotes, a string: write it without them"}},
		{"quoted ratio", "telemetry:\n  trace_sample_ratio: \"0.5\"\n", []string{"got \"0.5\" in quotes, a string: write it without them"}},
		{"quoted list entry", "auth:\n  exempt_ports: ['49983']\n", []string{"line 2: an entry of auth.exempt_ports: want a whole number, got '49983' in quotes"}},
		{"quoted word", "reuse_port: 'maybe'\n", []string{"got `maybe`"}},
		{"list for a string", "http_addr: [a, b]\n", []string{"line 1: http_addr: want a string, got a list"}},
		{"string for a list", "domains: cube.app\n", []string{"line 1: domains: want a list of strings ([a, b], or one - line each), got `cube.app`"}},
		{"list entry", "auth:\n  exempt_ports:\n    - http\n", []string{"line 3: an entry of auth.exempt_ports: want a whole number, got `http`"}},
		{"section for a value", "cache: 5\n", []string{"line 1: cache: want a section of keys (name: value lines under it), got `5`"}},
		{"map for options", "tls:\n  acme:\n    dns:\n      options: [a]\n", []string{"line 4: tls.acme.dns.options: want a map of name: value lines, got a list"}},
		// The shipped routes file named by --config, the file beside it.
		{"routes file as the config", "routes:\n  example:\n    HostIP: \"127.0.0.1\"\n", []string{
			"line 2: routes: want a string, got a section of keys (this looks like a routes file: name it with --routes, and the proxy's settings with --config)"}},
		{"list at the top", "- http_addr: ':1'\n", []string{"line 1: want settings (name: value lines) at the top of the file, got a list"}},
		{"several at once", "cache:\n  sizee: 1\n  ttl_min: 5\nreuse_port: 1\n", []string{
			"line 2: unknown key cache.sizee (did you mean cache.size?)",
			"line 3: cache.ttl_min: want a duration",
			"line 4: reuse_port: want true or false (yes/no and on/off work too), got `1`",
		}},
		// The decoder names the anchor's line for a key met through an
		// alias: cache.size is a known key, so it must not be named.
		{"unknown key through an alias", "cache: &c\n  size: 5\nupstream:\n  <<: *c\n", []string{"line 2: field size not found in type config.Upstream"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Load([]string{"--config", writeFile(t, tc.body)}, env(nil), io.Discard)
			if err == nil {
				t.Fatal("loaded")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q\ndoes not say %q", err, w)
				}
			}
			if strings.Contains(err.Error(), "cannot unmarshal") {
				t.Errorf("error %q still speaks of Go types", err)
			}
		})
	}
}
