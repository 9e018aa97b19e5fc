package config

import (
	"bufio"
	"io"
	"maps"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"
)

// The Redis example configs load with every key known (KnownFields), take
// their secrets from the environment, and name a valid Redis deployment.
func TestExampleConfigsLoad(t *testing.T) {
	secrets := map[string]string{
		"CUBEPROXY_ADMIN_TOKEN":             "admin-secret",
		"CUBEPROXY_REDIS_PASSWORD":          "redis-secret",
		"CUBEPROXY_REDIS_SENTINEL_PASSWORD": "sentinel-secret",
	}
	for _, tc := range []struct {
		file  string
		check func(t *testing.T, c *Config)
	}{
		{"../configs/cubeproxy.redis.yaml", func(t *testing.T, c *Config) {
			if c.Redis.Addr == "" || c.Redis.Sentinel.MasterName != "" {
				t.Errorf("want a standalone addr: %+v", c.Redis)
			}
			if c.AccessLog.Format != "cube" || c.AccessLog.Path == "" || c.AccessLog.Path == "-" {
				t.Errorf("want a cube access log to a file: %+v", c.AccessLog)
			}
			if c.Registry.Interval != 5*time.Second {
				t.Errorf("registry interval %v", c.Registry.Interval)
			}
		}},
		{"../configs/cubeproxy.sentinel.yaml", func(t *testing.T, c *Config) {
			if c.Redis.Addr != "" || c.Redis.Sentinel.MasterName == "" || len(c.Redis.Sentinel.Addrs) < 2 {
				t.Errorf("want sentinel settings only: %+v", c.Redis)
			}
			if c.Redis.Sentinel.Password != "sentinel-secret" {
				t.Errorf("sentinel password not taken from the environment: %q", c.Redis.Sentinel.Password)
			}
		}},
	} {
		t.Run(tc.file, func(t *testing.T) {
			vars := maps.Clone(secrets)
			if !strings.Contains(tc.file, "sentinel") {
				// A sentinel password without sentinels is refused:
				// nothing would read it.
				delete(vars, "CUBEPROXY_REDIS_SENTINEL_PASSWORD")
			}
			c, err := Load([]string{"--config", tc.file}, env(vars), io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			if c.Store != "redis" || !c.Registry.Enabled {
				t.Errorf("store %q registry %v: want redis with the registry on", c.Store, c.Registry.Enabled)
			}
			if c.AdminToken != "admin-secret" || c.Redis.Password != "redis-secret" {
				t.Errorf("secrets not taken from the environment: token %q password %q", c.AdminToken, c.Redis.Password)
			}
			if c.NodeIP == "" || !reflect.DeepEqual(c.Domains, []string{"cube.example.com"}) {
				t.Errorf("node_ip %q domains %v", c.NodeIP, c.Domains)
			}
			if err := c.Redis.Validate(); err != nil {
				t.Errorf("redis section: %v", err)
			}
			tc.check(t, c)

			// Without the environment the secrets stay empty: none is in the file.
			bare, err := Load([]string{"--config", tc.file}, env(nil), io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			if bare.AdminToken != "" || bare.Redis.Password != "" || bare.Redis.Sentinel.Password != "" {
				t.Errorf("example file carries a secret")
			}
			checkCommented(t, tc.file)
		})
	}
}

// checkCommented fails for a YAML key line with no comment on it or
// directly above it: the examples are documentation.
func checkCommented(t *testing.T, path string) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	prevComment := false
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		isKey := line != "" && !strings.HasPrefix(line, "#") && !strings.HasPrefix(line, "-")
		if isKey && !strings.Contains(line, "#") && !prevComment {
			t.Errorf("%s:%d: key without a comment: %s", path, n, line)
		}
		prevComment = strings.HasPrefix(line, "#")
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
}

// A bool setting given as a bare flag means true (the examples' docs and
// tests use --registry-enabled); =false and the environment still work.
func TestBoolFlagWithoutValue(t *testing.T) {
	for _, tc := range []struct {
		args []string
		env  map[string]string
		want bool
	}{
		{[]string{"--registry-enabled", "--registry-interval", "200ms"}, nil, true},
		{[]string{"--registry-enabled=true"}, nil, true},
		{[]string{"--registry-enabled=false"}, map[string]string{"CUBEPROXY_REGISTRY_ENABLED": "true"}, false},
		{nil, map[string]string{"CUBEPROXY_REGISTRY_ENABLED": "true"}, true},
		{nil, nil, false},
	} {
		// The registry lives in Redis: with the memory store it is refused.
		c, err := Load(append([]string{"--store", "redis"}, tc.args...), env(tc.env), io.Discard)
		if err != nil {
			t.Fatalf("%v: %v", tc.args, err)
		}
		if c.Registry.Enabled != tc.want {
			t.Errorf("%v %v: registry.enabled = %v, want %v", tc.args, tc.env, c.Registry.Enabled, tc.want)
		}
	}
	if c, err := Load([]string{"--store", "redis", "--registry-enabled", "--registry-interval", "200ms"}, env(nil), io.Discard); err != nil || c.Registry.Interval != 200*time.Millisecond {
		t.Errorf("the flag after a bare bool flag was lost: %v", err)
	}
}

// A list flag given more than once keeps every value, as pflag's lists do:
// keeping only the last silently dropped the others (the new key of a
// signing-key rotation, a second domain then answered 400). The flags still
// replace the file's and the environment's list as a whole.
func TestRepeatedListFlag(t *testing.T) {
	file := writeFile(t, "domains: [file.app]\n")
	for _, tc := range []struct {
		args  []string
		env   map[string]string
		check func(c *Config) bool
	}{
		{[]string{"--domains", "a.app", "--domains", "b.app,c.app"}, nil, func(c *Config) bool {
			return reflect.DeepEqual(c.Domains, []string{"a.app", "b.app", "c.app"})
		}},
		{[]string{"--config", file, "--domains=a.app", "--domains=b.app"}, map[string]string{"CUBEPROXY_DOMAINS": "env.app"}, func(c *Config) bool {
			return reflect.DeepEqual(c.Domains, []string{"a.app", "b.app"})
		}},
		{[]string{"--config", file, "--domains="}, nil, func(c *Config) bool { return len(c.Domains) == 0 }},
		{[]string{"--auth-exempt-ports", "49983", "--auth-exempt-ports=50005"}, nil, func(c *Config) bool {
			return reflect.DeepEqual(c.Auth.ExemptPorts, []int{49983, 50005})
		}},
		{[]string{"--auth-signing-keys", strings.Repeat("n", 32), "--auth-signing-keys", strings.Repeat("o", 32)}, nil, func(c *Config) bool {
			return reflect.DeepEqual(c.Auth.SigningKeys, []string{strings.Repeat("n", 32), strings.Repeat("o", 32)})
		}},
		// A scalar flag given again still means the last one.
		{[]string{"--http-addr", ":1", "--http-addr", ":2"}, nil, func(c *Config) bool { return c.HTTPAddr == ":2" }},
	} {
		c, err := Load(tc.args, env(tc.env), io.Discard)
		if err != nil {
			t.Fatalf("%v: %v", tc.args, err)
		}
		if !tc.check(c) {
			t.Errorf("%v %v: domains %v, exempt_ports %v, signing_keys %d, http_addr %q", tc.args, tc.env,
				c.Domains, c.Auth.ExemptPorts, len(c.Auth.SigningKeys), c.HTTPAddr)
		}
	}
}
