package config

import (
	"errors"
	"flag"
	"io"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"
)

// flagLine is a flag's first line in -h: its name and the kind it takes.
var flagLine = regexp.MustCompile(`^  -([a-z0-9-]+) ([a-z-]+)$`)

// helpFlags parses -h text into each flag's kind and shown default ("" when none).
func helpFlags(t *testing.T, usage string) (kinds, defaults map[string]string) {
	t.Helper()
	kinds, defaults = map[string]string{}, map[string]string{}
	lines := strings.Split(usage, "\n")
	for i, l := range lines {
		m := flagLine.FindStringSubmatch(l)
		if m == nil || i+1 == len(lines) {
			continue
		}
		kinds[m[1]] = m[2]
		if _, d, ok := strings.Cut(lines[i+1], " (default "); ok {
			defaults[m[1]] = strings.TrimSuffix(d, ")")
		}
	}
	return kinds, defaults
}

// Every flag names the kind of value it takes. Flags built with flag.Func
// used to show "value" for all of them: an operator could not tell a
// duration ("3s") from a count.
func TestHelpShowsEachFlagsKind(t *testing.T) {
	var b strings.Builder
	if _, err := Load([]string{"-h"}, env(nil), &b); !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("-h: %v", err)
	}
	kinds, _ := helpFlags(t, b.String())
	for _, s := range collect(reflect.ValueOf(Default()).Elem()) {
		switch k := kinds[s.flagName()]; k {
		case "duration", "int", "float", "bool", "string", "list", "int-list":
		default:
			t.Errorf("-%s shows kind %q", s.flagName(), k)
		}
	}
	for _, tc := range []struct{ flag, kind string }{
		{"cache-size", "int"},
		{"max-request-body", "int"},
		{"upstream-connect-timeout", "duration"},
		{"telemetry-trace-sample-ratio", "float"},
		{"persist-routes", "bool"},
		{"admin-addr", "string"},
		{"domains", "list"},
		{"auth-exempt-ports", "int-list"},
		{"config", "string"},
	} {
		if got := kinds[tc.flag]; got != tc.kind {
			t.Errorf("-%s: kind %q, want %q", tc.flag, got, tc.kind)
		}
	}
}

// -h names the defaults it is given, in the syntax its flag takes; a zero
// default is not shown (the usage says what unset means).
func TestHelpShowsGivenDefaults(t *testing.T) {
	shown := Default()
	shown.Cache.Size = 123
	shown.Upstream.IdleTimeout = 7206 * time.Second
	shown.Client.BodyTimeout = 1500 * time.Millisecond
	shown.Domains = []string{"a.test", "b.test"}
	shown.Auth.ExemptPorts = []int{49983}
	shown.Telemetry.TraceSampleRatio = 0.01
	shown.Registry.Enabled = true
	var b strings.Builder
	if _, err := LoadCommand("cubeproxy serve", shown, []string{"-h"}, env(nil), &b); !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("-h: %v", err)
	}
	_, defaults := helpFlags(t, b.String())
	for _, tc := range []struct{ flag, want string }{
		{"cache-size", "123"},
		{"upstream-idle-timeout", "7206s"},
		{"client-body-timeout", "1.5s"},
		{"domains", `"a.test,b.test"`},
		{"auth-exempt-ports", `"49983"`},
		{"telemetry-trace-sample-ratio", "0.01"},
		{"registry-enabled", "true"},
		{"http-addr", `":8081"`},
		{"max-streams-per-sandbox", ""},
		{"persist-routes", ""},
		{"config", ""},
	} {
		if got := defaults[tc.flag]; got != tc.want {
			t.Errorf("-%s: default %q, want %q", tc.flag, got, tc.want)
		}
	}
	if !strings.HasPrefix(b.String(), "Usage of cubeproxy serve:\n") {
		t.Errorf("usage title: %.40q", b.String())
	}
}

// A flag whose unset value is neither off nor a number -h could show (it
// depends on other settings, or a library picks it) says in its text what
// unset means, as the README promises for every flag -h shows no default for.
func TestHelpNamesWhatUnsetMeans(t *testing.T) {
	text := helpTexts(t)
	for _, tc := range []struct{ flag, want string }{
		{"tls-source", "unset: files when certificate files are given, else self_signed"},
		{"tls-acme-dns-propagation-timeout", "unset: certmagic's default"},
		{"tls-acme-dns-resolvers", "empty: the system's"},
		{"tls-acme-ca", "default Let's Encrypt"},
		{"instance-id", "default: hostname"},
		{"redis-pool-size", "0: go-redis default"},
		{"redis-username", "empty: the default user"},
		{"redis-ca-file", "empty: the system's roots"},
		{"tls-acme-trusted-roots-file", "empty: the system's"},
	} {
		if !strings.Contains(text[tc.flag], tc.want) {
			t.Errorf("-%s: %q, want it to say %q", tc.flag, text[tc.flag], tc.want)
		}
	}
}

// A flag's text says what the proxy does now, as README does: -h is where
// an operator looks first. access_log.path's said SIGHUP alone, where
// SIGUSR1 (nginx's reopen signal, the one logrotate's postrotate sends)
// reopens the file too; client.write_timeout's still bounded each response
// piece whole, where a client is now cut only once it took nothing for that
// long (nginx's send_timeout).
func TestHelpSaysWhatTheProxyDoes(t *testing.T) {
	text := helpTexts(t)
	for _, tc := range []struct{ flag, want, not string }{
		{"access-log-path", "SIGHUP or SIGUSR1", ""},
		{"client-write-timeout", "took nothing", "each response piece"},
	} {
		if !strings.Contains(text[tc.flag], tc.want) {
			t.Errorf("-%s: %q, want it to say %q", tc.flag, text[tc.flag], tc.want)
		}
		if tc.not != "" && strings.Contains(text[tc.flag], tc.not) {
			t.Errorf("-%s: %q still says %q", tc.flag, text[tc.flag], tc.not)
		}
	}
}

// What YAML writes loads back to the same settings.
func TestYAMLLoadsBack(t *testing.T) {
	c := Default()
	c.Upstream.IdleTimeout = 7206 * time.Second
	c.Upstream.HeartbeatInterval = -time.Second
	c.Client.BodyTimeout = 1500 * time.Millisecond
	c.Domains = []string{"a.test"}
	c.Store, c.Redis.Addr, c.Redis.KeyPrefix = "redis", "127.0.0.1:6379", "cube:v1:"
	c.HTTPSAddr, c.TLS.Source = ":8443", "acme"
	c.TLS.ACME.DNS.Provider, c.TLS.ACME.DNS.Options = "rfc2136", map[string]string{"server": "127.0.0.1:53"}
	out, err := c.YAML()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(out), "idle_timeout: 7206s\n") || !strings.Contains(string(out), "\n  body_timeout: 1.5s\n") {
		t.Errorf("durations not as -h shows them:\n%s", out)
	}
	back, err := Load([]string{"--config", writeFile(t, string(out))}, env(nil), io.Discard)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	again, err := back.YAML()
	if err != nil {
		t.Fatal(err)
	}
	if string(again) != string(out) {
		t.Errorf("loaded back differently:\n%s\nwant\n%s", again, out)
	}
	if back.Upstream.IdleTimeout != c.Upstream.IdleTimeout || back.Upstream.HeartbeatInterval != -time.Second {
		t.Errorf("durations: %v %v", back.Upstream.IdleTimeout, back.Upstream.HeartbeatInterval)
	}
}

// helpTexts runs -h and returns each flag's text (the line under its
// name), by flag name.
func helpTexts(t *testing.T) map[string]string {
	t.Helper()
	var b strings.Builder
	if _, err := Load([]string{"-h"}, env(nil), &b); !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("-h: %v", err)
	}
	text := map[string]string{}
	lines := strings.Split(b.String(), "\n")
	for i, l := range lines {
		if m := flagLine.FindStringSubmatch(l); m != nil && i+1 < len(lines) {
			text[m[1]] = lines[i+1]
		}
	}
	return text
}

// NotedYAML ends a setting's line with its note, which loads back as
// nothing, and refuses a note on no setting (a key renamed under it).
func TestNotedYAML(t *testing.T) {
	c := Default()
	c.Telemetry.TraceSampleRatio = 0.25
	out, err := c.NotedYAML(map[string]string{"telemetry.trace_sample_ratio": "not used: traces are off"})
	if err != nil {
		t.Fatal(err)
	}
	if want := "\n  trace_sample_ratio: 0.25 # not used: traces are off\n"; !strings.Contains(string(out), want) {
		t.Errorf("output\n%s\nwant the line %q", out, want)
	}
	back, err := Load([]string{"--config", writeFile(t, string(out))}, env(nil), io.Discard)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if back.Telemetry.TraceSampleRatio != 0.25 {
		t.Errorf("loaded back trace_sample_ratio %v, want 0.25", back.Telemetry.TraceSampleRatio)
	}
	for _, key := range []string{"telemetry.sample_ratio", "telemetry"} {
		if _, err := c.NotedYAML(map[string]string{key: "x"}); err == nil {
			t.Errorf("note on %s: no error", key)
		}
	}
}
