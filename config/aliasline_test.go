package config

import (
	"io"
	"strings"
	"testing"
)

// A wrong value that other keys take through an alias is one mistake,
// written on one line: the decoder reports it once for each key that
// takes it, each naming the anchor's line, and the error repeated that
// line word for word. It is named once, with the keys that take it
// through an alias.
func TestTypeErrorThroughAliasNamedOnce(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		line       string // the line named, once
		want       string
	}{
		{"alias in the same section", "cache:\n  ttl_min: &t 5\n  ttl_max: *t\n", "line 2: ",
			"line 2: cache.ttl_min: want a duration with its unit (30s, 5m, 2h), got `5` (taken through an alias by cache.ttl_max at line 3)"},
		{"aliases in other sections", "cache:\n  ttl_min: &t 5\nupstream:\n  connect_timeout: *t\n  idle_timeout: *t\n", "line 2: ",
			"line 2: cache.ttl_min: want a duration with its unit (30s, 5m, 2h), got `5` (taken through an alias by upstream.connect_timeout at line 4, upstream.idle_timeout at line 5)"},
		// Under a key that is no setting, named once too.
		{"anchor under an unknown key", "defaults: &d 30\ndrain_timeout: *d\nupstream:\n  connect_timeout: *d\n", "line 1: want",
			"line 1: want a duration with its unit (30s, 5m, 2h), got `30` (taken through an alias by drain_timeout at line 2, upstream.connect_timeout at line 4)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Load([]string{"--config", writeFile(t, tc.body)}, env(nil), io.Discard)
			if err == nil {
				t.Fatal("loaded")
			}
			msg := err.Error()
			if n := strings.Count(msg, tc.line); n != 1 {
				t.Errorf("error names %q %d times:\n%s", tc.line, n, msg)
			}
			if !strings.Contains(msg, tc.want) {
				t.Errorf("error %q\ndoes not say %q", msg, tc.want)
			}
		})
	}
}

// A value that reaches a setting only through an alias, where the decoder
// names the anchor's line and a Go type ("cannot unmarshal !!seq into
// config.Cache"), is named by the setting that takes it and the alias's
// line: the anchor may sit under a key of another kind (or no setting),
// and the Go words named neither the setting nor the kind it takes.
func TestTypeErrorOnlyThroughAliasNamesTheSetting(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		want       string
	}{
		{"anchor under an unknown key", "defaults: &d 30\ndrain_timeout: *d\nupstream:\n  connect_timeout: *d\n",
			"line 1: want a duration with its unit (30s, 5m, 2h), got `30` (taken through an alias by drain_timeout at line 2, upstream.connect_timeout at line 4)"},
		{"a list taken as list entries", "domains: &a [a.com, b.com]\nshared_hosts: [*a]\n",
			"line 1: want a string, got a list (taken through an alias by an entry of shared_hosts at line 2)"},
		{"a list taken as a section", "x: &a [1]\ncache: *a\n",
			"line 1: want a section of keys (name: value lines under it), got a list (taken through an alias by cache at line 2)"},
		{"nested aliases", "x: &a [l]\ny: &b [*a]\ndomains: *b\n",
			"line 1: want a string, got a list (taken through an alias by an entry of domains at line 3)"},
		{"a map value of the DNS options", "tls:\n  acme:\n    dns:\n      options: {a: [1]}\n",
			"line 4: tls.acme.dns.options.a: want a string, got a list"},
		{"a secret through an alias", "x: &s [1]\nadmin_token: *s\n",
			"line 1: want a string, got a list (taken through an alias by admin_token at line 2)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Load([]string{"--config", writeFile(t, tc.body)}, env(nil), io.Discard)
			if err == nil {
				t.Fatal("loaded")
			}
			msg := err.Error()
			if strings.Contains(msg, "cannot unmarshal") {
				t.Errorf("the decoder's words:\n%s", msg)
			}
			if !strings.Contains(msg, tc.want) {
				t.Errorf("error %q\ndoes not say %q", msg, tc.want)
			}
		})
	}
}
