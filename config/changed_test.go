package config

import (
	"io"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// Changed names what a second load of the configuration (SIGHUP's check)
// would change, and nothing for a file loaded again as it was: each
// shipped configuration, with its lists, durations, TLS pairs and Redis
// sections, must compare equal to itself, or SIGHUP would warn of changes
// nobody made.
func TestChangedNamesSettings(t *testing.T) {
	files, _ := filepath.Glob("../configs/cubeproxy*.yaml")
	if len(files) == 0 {
		t.Fatal("no shipped configuration found")
	}
	for _, f := range files {
		vars := map[string]string{"CUBEPROXY_ADMIN_TOKEN": "admin-secret"}
		switch filepath.Base(f) {
		case "cubeproxy.sentinel.yaml":
			vars["CUBEPROXY_REDIS_SENTINEL_PASSWORD"] = "sentinel-secret"
			fallthrough
		case "cubeproxy.redis.yaml":
			vars["CUBEPROXY_REDIS_PASSWORD"] = "redis-secret"
		}
		e := env(vars)
		a, err := Load([]string{"--config", f}, e, io.Discard)
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		b, err := Load([]string{"--config", f}, e, io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		if got := a.Changed(b); len(got) != 0 {
			t.Errorf("%s loaded twice: Changed = %q, want none", f, got)
		}
		if a.File() != f {
			t.Errorf("File() = %q, want %q", a.File(), f)
		}
	}

	path := filepath.Join(t.TempDir(), "c.yaml")
	write := func(s string) {
		if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("domains: [a.test]\ncache:\n  size: 10\nadmin_token: one-secret-token\n")
	a, err := Load([]string{"--config", path}, env(nil), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	write("domains: [a.test, b.test]\ncache:\n  size: 10\nadmin_token: another-secret\nupstream:\n  max_conns: 3\n")
	b, err := Load([]string{"--config", path}, env(nil), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := a.Changed(b), []string{"admin_token", "domains", "upstream.max_conns"}; !slices.Equal(got, want) {
		t.Errorf("Changed = %q, want %q", got, want)
	}
	none, err := Load(nil, env(nil), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if none.File() != "" {
		t.Errorf("File() without a configuration file = %q, want empty", none.File())
	}
}
