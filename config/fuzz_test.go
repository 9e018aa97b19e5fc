package config

import (
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
)

// envValue renders a setting the way an operator would write it in its
// CUBEPROXY_* variable; ok is false when the environment cannot say it
// (an empty value counts as unset, a blank one is refused; a list entry
// with a comma or blanks around it would be split or trimmed).
func envValue(s *setting) (string, bool) {
	v := s.v
	var out string
	switch {
	case v.Type() == durationType:
		out = time.Duration(v.Int()).String()
	case v.Kind() == reflect.String:
		out = v.String()
		if strings.TrimSpace(out) == "" {
			return "", false // a blank variable is refused (checkBlankEnv): the file or a flag says it
		}
	case v.Kind() == reflect.Bool:
		out = strconv.FormatBool(v.Bool())
	case v.Kind() == reflect.Int || v.Kind() == reflect.Int64:
		out = strconv.FormatInt(v.Int(), 10)
	case v.Kind() == reflect.Float64:
		out = strconv.FormatFloat(v.Float(), 'g', -1, 64)
	case v.Kind() == reflect.Slice:
		parts := make([]string, v.Len())
		for i := range parts {
			p := v.Index(i)
			if p.Kind() == reflect.Int {
				parts[i] = strconv.FormatInt(p.Int(), 10)
			} else {
				parts[i] = p.String()
			}
			if parts[i] == "" || strings.Contains(parts[i], ",") || strings.TrimSpace(parts[i]) != parts[i] {
				return "", false
			}
		}
		out = strings.Join(parts, ",")
	}
	return out, out != ""
}

// loadYAML loads data as the config file, with no environment or flags.
func loadYAML(t *testing.T, dir string, data []byte) (*Config, error) {
	t.Helper()
	path := filepath.Join(dir, "cubeproxy.yaml")
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return Load([]string{"--config", path}, env(nil), io.Discard)
}

// FuzzLoadFile feeds arbitrary text to the config file loader: an error or
// a configuration, never a panic. A configuration it accepts passes
// Validate, is written back as YAML that loads as the same configuration,
// and every setting it holds, given as its CUBEPROXY_* variable instead,
// loads as the same value (what a file says, the environment can say).
func FuzzLoadFile(f *testing.F) {
	for _, name := range []string{"cubeproxy.yaml", "cubeproxy.redis.yaml", "cubeproxy.sentinel.yaml", "cubeproxy.tls.yaml"} {
		if data, err := os.ReadFile(filepath.Join("..", "configs", name)); err == nil {
			f.Add(data)
		}
	}
	f.Add([]byte("http_addr: ':1'\n---\nhttp_addr: ':2'\n"))
	f.Add([]byte("upstream:\n  connect_timeout: 1h2m3.5s\n  heartbeat_interval: -1s\nmax_request_body: 0x100\n"))
	f.Add([]byte("telemetry:\n  trace_sample_ratio: .5\ndomains: ['*.a.test', b.test.]\nauth:\n  exempt_ports: [80, 443]\n"))
	f.Add([]byte("cache: {ttl_min: 1s, ttl_max: 2s}\ntls:\n  acme:\n    dns:\n      options: {a: b}\n"))
	f.Add([]byte("routes:\npersist_routes: yes\naccess_log: ~\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		dir := t.TempDir()
		cfg, err := loadYAML(t, dir, data)
		if err != nil {
			return
		}
		if err := cfg.Validate(); err != nil {
			t.Fatalf("Load accepted a configuration Validate refuses: %v", err)
		}
		out, err := yaml.Marshal(cfg)
		if err != nil {
			t.Fatalf("marshal an accepted configuration: %v", err)
		}
		again, err := loadYAML(t, dir, out)
		if err != nil {
			t.Fatalf("the configuration written back does not load: %v\n%s", err, out)
		}
		// Compared as YAML: a nil list and an empty one are the same setting.
		if out2, _ := yaml.Marshal(again); string(out) != string(out2) {
			t.Fatalf("loaded as\n%s\nwritten back and loaded again as\n%s", out, out2)
		}
		if cfg.TLS.Source == "files" && cfg.TLS.CertFile == "" && len(cfg.TLS.Files) > 0 {
			// tls.files, a list of pairs, has no variable: the
			// environment alone names no certificate, which is refused.
			return
		}
		vars := map[string]string{}
		for _, s := range collect(reflect.ValueOf(cfg).Elem()) {
			if v, ok := envValue(&s); ok {
				vars[s.envName()] = v
			}
		}
		fromEnv, err := Load(nil, env(vars), io.Discard)
		if err != nil {
			t.Fatalf("the same settings as environment variables do not load: %v\n%v", err, vars)
		}
		want := collect(reflect.ValueOf(cfg).Elem())
		for i, s := range collect(reflect.ValueOf(fromEnv).Elem()) {
			if _, ok := vars[s.envName()]; ok && !reflect.DeepEqual(s.v.Interface(), want[i].v.Interface()) {
				t.Fatalf("%s=%q loads as %v, the file's value is %v", s.envName(), vars[s.envName()], s.v.Interface(), want[i].v.Interface())
			}
		}
	})
}

// FuzzLoadEnv sets one CUBEPROXY_* variable (chosen by index) to arbitrary
// text: an error naming the variable or a configuration, never a panic. A
// value it accepts passes Validate, and the setting's value written back
// (as the documentation writes values: decimal, Go durations) loads as the
// same value: numbers round-trip.
func FuzzLoadEnv(f *testing.F) {
	settings := collect(reflect.ValueOf(Default()).Elem())
	f.Add(uint(0), ":8081")
	f.Add(uint(1), "9223372036854775807")
	f.Add(uint(3), "1e-400")
	f.Add(uint(5), "-9223372036854775808ns")
	f.Add(uint(7), " a.test , ,b.test ")
	f.Add(uint(9), "0x10")
	f.Add(uint(11), "NaN")
	f.Add(uint(13), "T")
	f.Fuzz(func(t *testing.T, i uint, value string) {
		s := settings[i%uint(len(settings))]
		name := s.envName()
		cfg, err := Load(nil, env(map[string]string{name: value}), io.Discard)
		if err != nil {
			// A check across settings may name another one (tls.source
			// refused without https_addr), but some setting is named.
			if msg := err.Error(); !strings.Contains(msg, name) && !strings.Contains(msg, strings.Join(s.path, ".")) && !strings.ContainsAny(msg, "._") {
				t.Fatalf("%s=%q: error %q names no setting", name, value, err)
			}
			return
		}
		if err := cfg.Validate(); err != nil {
			t.Fatalf("%s=%q: Load accepted a configuration Validate refuses: %v", name, value, err)
		}
		var got *setting
		all := collect(reflect.ValueOf(cfg).Elem())
		for j := range all {
			if all[j].envName() == name {
				got = &all[j]
			}
		}
		back, ok := envValue(got)
		if !ok {
			return
		}
		again, err := Load(nil, env(map[string]string{name: back}), io.Discard)
		if err != nil {
			t.Fatalf("%s=%q loaded, but its value written back, %q, does not: %v", name, value, back, err)
		}
		for _, s2 := range collect(reflect.ValueOf(again).Elem()) {
			if s2.envName() == name && !reflect.DeepEqual(s2.v.Interface(), got.v.Interface()) {
				t.Fatalf("%s=%q loads as %v; written back as %q it loads as %v", name, value, got.v.Interface(), back, s2.v.Interface())
			}
		}
	})
}
