package main

import (
	"errors"
	"flag"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/cube-sandbox/cubeproxy/config"
)

// fuzzAdminToken is the admin token the fuzzed starts get from the
// environment: no error and no printed configuration may hold it.
const fuzzAdminToken = "fuzz-admin-token-0123456789abcdef"

// Secrets shaped like variable references, which a second start of each
// input gets from the environment: a real secret may look like one, and
// the refusal of the shape must not print it either.
const (
	fuzzRefAdminToken = "$FUZZ_ADMIN_TOKEN_0123456789abcdef"
	fuzzRefSigningKey = "${FUZZ_SIGNING_KEY_0123456789abcdef_0123456789}"
)

// fileSecrets lists the values the input file gives the secret settings
// (admin_token, auth.signing_keys, the Redis passwords, redis.url's as
// written: between its first ':' after "://" and its last '@', and the
// DNS provider's secret options) that no error or printed configuration
// may hold: those long and odd enough (16 bytes or more, a digit, no space)
// that an error holding one took it from the setting, and written once in
// the input, so that no other setting can have quoted it.
func fileSecrets(data []byte) []string {
	var doc struct {
		AdminToken any `yaml:"admin_token"`
		Auth       struct {
			SigningKeys any `yaml:"signing_keys"`
		} `yaml:"auth"`
		TLS struct {
			ACME struct {
				DNS struct {
					Options map[string]any `yaml:"options"`
				} `yaml:"dns"`
			} `yaml:"acme"`
		} `yaml:"tls"`
		Redis struct {
			URL      any `yaml:"url"`
			Password any `yaml:"password"`
			Sentinel struct {
				Password any `yaml:"password"`
			} `yaml:"sentinel"`
		} `yaml:"redis"`
	}
	if yaml.Unmarshal(data, &doc) != nil {
		return nil
	}
	var out []string
	var add func(v any)
	add = func(v any) {
		switch v := v.(type) {
		case string:
			if len(v) >= 16 && strings.ContainsAny(v, "0123456789") && !strings.ContainsAny(v, " \t\r\n") && strings.Count(string(data), v) == 1 {
				out = append(out, v)
			}
		case []any:
			for _, e := range v {
				add(e)
			}
		}
	}
	add(doc.AdminToken)
	add(doc.Auth.SigningKeys)
	add(doc.Redis.Password)
	add(doc.Redis.Sentinel.Password)
	for k, v := range doc.TLS.ACME.DNS.Options {
		if secretOption(k) {
			add(v)
		}
	}
	if u, ok := doc.Redis.URL.(string); ok {
		if _, rest, ok := strings.Cut(u, "://"); ok {
			if at := strings.LastIndexByte(rest, '@'); at >= 0 {
				if _, pw, ok := strings.Cut(rest[:at], ":"); ok {
					add(pw)
				}
			}
		}
	}
	return out
}

// yamlPaths lists every key of the configuration, sections included
// (cache, cache.size, ...).
func yamlPaths(t reflect.Type, prefix string, out *[]string) {
	for i := 0; i < t.NumField(); i++ {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("yaml"), ",")
		if name == "" || name == "-" {
			continue
		}
		*out = append(*out, prefix+name)
		ft := t.Field(i).Type
		if ft.Kind() == reflect.Slice {
			ft = ft.Elem()
		}
		if ft.Kind() == reflect.Struct {
			yamlPaths(ft, prefix+name+".", out)
		}
	}
}

// FuzzStartupSettings feeds arbitrary text to the binary as its config
// file, with the admin token in the environment, through config's loading
// and validation and then the binary's own checks of the settings. Whatever
// the text: no panic; a refusal names what it refuses (a setting, a line
// of the file or a variable) and never holds the admin token, nor a
// secret shaped like a variable reference (a second start of the input
// gets those from the environment), nor a secret the file gives; and what is
// accepted prints, as check prints it, without the token, as YAML that
// loads again as the same configuration.
func FuzzStartupSettings(f *testing.F) {
	for _, name := range []string{"cubeproxy.yaml", "cubeproxy.redis.yaml", "cubeproxy.sentinel.yaml", "cubeproxy.tls.yaml"} {
		if data, err := os.ReadFile(filepath.Join("..", "..", "configs", name)); err == nil {
			f.Add(data)
		}
	}
	for _, s := range []string{
		"log_level: loud\n", "log_format: xml\n", "store: mongo\n", "access_log: {format: nginx}\n",
		"auth: {exempt_ports: [0, 70000]}\n", "auth: {signing_keys: [short]}\n", "node_ip: 1.2.3\n",
		"tls: {redirect_port: 8443}\n", "tls: {redirect_http: true}\n", "reuse_port: on\n",
		"store: redis\nredis: {addr: 'r:6379', db: 1, cluster: {addrs: ['r:7000']}}\n",
		"store: redis\nredis: {url: 'redis://u:p@r:99999/0'}\n", "cache: {size: 1.5, ttl_max: 1s}\n",
		"admin_addr: 0.0.0.0:8082\nadmin_token: ''\n", "\ufeffhttp_addr: ':1'\r\n", "\t- x\n", "",
		"auth: {signing_keys: s3cret-signing-key-0123456789abcdef}\n", "x: &k s3cret-signing-key-0123456789abcdef\nauth: {signing_keys: *k}\n",
		"store: redis\nredis: {addr: 'r:6379', password: [s3cret-redis-password-0123]}\n",
		"store: redis\nredis: {url: 'redis://u:#s3cret-redis-password-0123@r:6379'}\n",
		"store: redis\nredis: {url: 'redis://u:0/s3cret-redis-password-0123@r:6379'}\n",
		"store: redis\nredis: {url: 'rediss://u:s3cret-redis%2Fpassword-0123@r:6379/1'}\n",
		"https_addr: ':18443'\ntls: {source: acme, domain: cube.test, acme: {email: a@b.c, storage_dir: /tmp/x, dns: {provider: rfc2136, options: {server: '127.0.0.1:53', key_name: k, key_secret: czNjcmV0LXRzaWcta2V5LTAxMjM0NTY3}}}}\n",
		"https_addr: ':18443'\ntls: {source: acme, domain: cube.test, acme: {email: a@b.c, storage_dir: /tmp/x, dns: {provider: rfc2136, options: {server: '127.0.0.1:53', key_secret: czNjcmV0LXRzaWcta2V5LTAxMjM0NTY3, timeout: x}}}}\n",
	} {
		f.Add([]byte(s))
	}
	var keys []string
	yamlPaths(reflect.TypeOf(config.Config{}), "", &keys)
	getenv := func(k string) string {
		if k == "CUBEPROXY_ADMIN_TOKEN" {
			return fuzzAdminToken
		}
		return ""
	}
	refEnv := func(k string) string {
		switch k {
		case "CUBEPROXY_ADMIN_TOKEN":
			return fuzzRefAdminToken
		case "CUBEPROXY_AUTH_SIGNING_KEYS":
			return fuzzRefSigningKey
		}
		return ""
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		path := filepath.Join(t.TempDir(), "cubeproxy.yaml")
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		cfg, err := config.LoadCommand("cubeproxy check", shownDefaults(), []string{"--config", path}, getenv, io.Discard)
		if err == nil {
			err = cfg.NameOrigins(startRefusal(cfg))
		}
		if errors.Is(err, flag.ErrHelp) {
			t.Fatal("no flag was given, yet -h's error")
		}
		secrets := fileSecrets(data)
		if _, rerr := config.LoadCommand("cubeproxy check", shownDefaults(), []string{"--config", path}, refEnv, io.Discard); rerr == nil {
			t.Fatalf("secrets shaped like variable references were accepted:\n%q", data)
		} else if msg := rerr.Error(); !strings.Contains(string(data), "FUZZ_") && (strings.Contains(msg, "FUZZ_ADMIN_TOKEN") || strings.Contains(msg, "FUZZ_SIGNING_KEY")) {
			t.Fatalf("error shows a secret shaped like a variable reference: %s", msg)
		} else {
			for _, sec := range secrets {
				if strings.Contains(msg, sec) {
					t.Fatalf("error shows the file's secret %q: %s", sec, msg)
				}
			}
		}
		if err != nil {
			msg := err.Error()
			if strings.Contains(msg, fuzzAdminToken) {
				t.Fatalf("error shows the admin token: %s", msg)
			}
			for _, sec := range secrets {
				if strings.Contains(msg, sec) {
					t.Fatalf("error shows the file's secret %q: %s", sec, msg)
				}
			}
			named := strings.Contains(msg, "line ") || strings.Contains(msg, config.EnvPrefix) || strings.Contains(msg, path)
			for _, k := range keys {
				named = named || strings.Contains(msg, k)
			}
			if !named {
				t.Fatalf("error names no setting, line or variable: %s\n%q", msg, data)
			}
			return
		}
		out, err := redact(effective(cfg, getenv)).YAML()
		if err != nil {
			t.Fatalf("print the configuration: %v", err)
		}
		if strings.Contains(string(out), fuzzAdminToken) {
			t.Fatalf("printed configuration shows the admin token:\n%s", out)
		}
		for _, sec := range secrets {
			if strings.Contains(string(out), sec) {
				t.Fatalf("printed configuration shows the file's secret %q:\n%s", sec, out)
			}
		}
		again := filepath.Join(t.TempDir(), "again.yaml")
		if err := os.WriteFile(again, out, 0o600); err != nil {
			t.Fatal(err)
		}
		cfg2, err := config.LoadCommand("cubeproxy check", shownDefaults(), []string{"--config", again}, getenv, io.Discard)
		if err != nil {
			t.Fatalf("the printed configuration does not load: %v\n%s", err, out)
		}
		if err := startRefusal(cfg2); err != nil {
			t.Fatalf("the printed configuration is refused: %v\n%s", err, out)
		}
		if out2, _ := redact(effective(cfg2, getenv)).YAML(); string(out2) != string(out) {
			t.Fatalf("printed\n%s\nloaded again and printed\n%s", out, out2)
		}
	})
}
