package config

import (
	"errors"
	"io"
	"strings"
	"testing"
)

// An error about a value that came from the environment or a flag says
// so: an operator told "cache.size: -1 is negative" looks for -1 in the
// config file, and the image, the unit file or the pod spec set it. A
// value from the file (or a word of the message that only looks like a
// key) gets no note, and the note never holds the value.
func TestErrorsNameTheVariableOrFlagOfAValue(t *testing.T) {
	file := writeFile(t, "cache:\n  size: -1\n")
	for _, tc := range []struct {
		name string
		args []string
		env  map[string]string
		want string // the whole error
	}{
		{"from the environment", nil, map[string]string{"CUBEPROXY_CACHE_SIZE": "-1"},
			"cache.size: -1 is negative (cache.size is set by CUBEPROXY_CACHE_SIZE)"},
		{"from a flag", []string{"--cache-size=-1"}, nil,
			"cache.size: -1 is negative (cache.size is set by --cache-size)"},
		{"a flag over the environment", []string{"--cache-size=-2"}, map[string]string{"CUBEPROXY_CACHE_SIZE": "-1"},
			"cache.size: -2 is negative (cache.size is set by --cache-size)"},
		{"from the file", []string{"--config", file}, nil, "cache.size: -1 is negative"},
		{"two settings", []string{"--cache-ttl-max=1s"}, map[string]string{"CUBEPROXY_CACHE_TTL_MIN": "2s"},
			"cache.ttl_min (2s) is above cache.ttl_max (1s) (cache.ttl_min is set by CUBEPROXY_CACHE_TTL_MIN; cache.ttl_max is set by --cache-ttl-max)"},
		{"a one-word key", nil, map[string]string{"CUBEPROXY_STORE": "redis", "CUBEPROXY_PERSIST_ROUTES": "on", "CUBEPROXY_REDIS_ADDR": "r:6379"},
			"persist_routes is on but store is redis: only the memory store writes its routes file; remove persist_routes, or set store: memory (persist_routes is set by CUBEPROXY_PERSIST_ROUTES; store is set by CUBEPROXY_STORE)"},
		// The image sets CUBEPROXY_ROUTES: "to read routes from Redis" does not name it.
		{"a word that is also a key", nil, map[string]string{"CUBEPROXY_ROUTES": "/etc/routes.yaml", "CUBEPROXY_REDIS_ADDR": "r:6379"},
			"redis.addr is set but store is memory: set store: redis (CUBEPROXY_STORE=redis) to read routes from Redis, or remove redis.addr (redis.addr is set by CUBEPROXY_REDIS_ADDR)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Load(tc.args, env(tc.env), io.Discard)
			if err == nil || err.Error() != tc.want {
				t.Fatalf("Load = %v\nwant %s", err, tc.want)
			}
		})
	}
}

// An error found after Load (by the binary's own checks) gets the same
// note through NameOrigins; one that names no setting set outside the
// file is returned as it is.
func TestNameOrigins(t *testing.T) {
	cfg, err := Load([]string{"--log-level=loud"}, env(map[string]string{"CUBEPROXY_NODE_IP": "10.0.0.1"}), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	got := cfg.NameOrigins(errors.New(`log_level "loud": want debug, info, warn or error`))
	if want := `log_level "loud": want debug, info, warn or error (log_level is set by --log-level)`; got.Error() != want {
		t.Fatalf("NameOrigins = %v\nwant %s", got, want)
	}
	// A package's error that names the file a setting names.
	cfg, err = Load([]string{"--access-log-path", "/var/log/cube/access.log"}, env(nil), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	got = cfg.NameOrigins(errors.New("open access log /var/log/cube/access.log: permission denied"))
	if want := "open access log /var/log/cube/access.log: permission denied (access_log.path is set by --access-log-path)"; got.Error() != want {
		t.Fatalf("NameOrigins = %v\nwant %s", got, want)
	}
	plain := errors.New("tls certificates: tls.cert_file: stat /x.pem: no such file or directory")
	if got := cfg.NameOrigins(plain); got != plain {
		t.Fatalf("NameOrigins = %v, want the error as it was", got)
	}
	if !errors.Is(cfg.NameOrigins(plain), plain) || !strings.Contains(Default().NameOrigins(plain).Error(), "tls certificates") {
		t.Fatal("NameOrigins loses the error")
	}
}
