package main

import (
	"path/filepath"
	"strings"
	"testing"
)

// A switch that is off keeps its settings without a word, as the README's
// Configuration section promises, so that turning a feature off for a
// while is one line; check loads what serve would. tls.redirect_port is
// the one setting refused under its switch (only redirects name the port,
// so one set alone most likely meant a redirect), and the README says so.
func TestCheckKeepsTheSettingsOfASwitchThatIsOff(t *testing.T) {
	dir := t.TempDir()
	missingDir := filepath.Join(dir, "missing")
	base := "http_addr: 127.0.0.1:0\nadmin_addr: 127.0.0.1:0\nroutes: \"\"\n"
	for _, tc := range []struct {
		name string
		yaml string
		want string // "" passes
	}{
		{"registry settings with the registry off", "registry:\n  enabled: false\n  interval: 10s\n  hash: 'ops:registry'\n", ""},
		// A path serve could not open: it is not opened while nothing
		// would be written to it.
		{"access log path with format off", "access_log:\n  format: off\n  path: " + filepath.Join(missingDir, "access.log") + "\n", ""},
		// Every example has a tls section; without https_addr nothing reads it.
		{"tls section without https_addr", "tls:\n  source: self_signed\n  domain: cube.test\n  redirect_http: false\n", ""},
		{"on_demand_rate with on_demand off", "https_addr: 127.0.0.1:0\ntls:\n  source: acme\n  domain: cube.test\n  acme:\n" +
			"    email: ops@cube.test\n    storage_dir: " + filepath.Join(dir, "acme") + "\n    on_demand: false\n    on_demand_rate: 5\n" +
			"    dns:\n      provider: rfc2136\n      options: {server: '127.0.0.1:53'}\n", ""},
		// The image sets CUBEPROXY_ROUTES; under Redis the file is not
		// read (here a directory, which the memory store refuses).
		{"routes with store redis", "store: redis\nredis:\n  addr: 127.0.0.1:6379\nroutes: " + dir + "\n", ""},
		{"routes is read with store memory", "routes: " + dir + "\n", "is a directory"},
		{"redirect_port with redirect_http off", "https_addr: 127.0.0.1:0\ntls:\n  redirect_http: false\n  redirect_port: 443\n",
			"tls.redirect_port is set but tls.redirect_http is off"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// A second routes key is refused as a duplicate: a case
			// that names its own replaces base's.
			body := base + tc.yaml
			if strings.Contains(tc.yaml, "routes: ") {
				body = strings.Replace(base, "routes: \"\"\n", "", 1) + tc.yaml
			}
			cfg := writeTemp(t, t.TempDir(), "cubeproxy.yaml", body)
			code, _, stderr := runCheck(t, noEnv, "--config", cfg)
			if tc.want == "" {
				if code != 0 {
					t.Fatalf("check exit %d; want 0 (a switch off keeps its settings)\n%s", code, stderr)
				}
				return
			}
			if code != 1 || !strings.Contains(stderr, tc.want) {
				t.Fatalf("check exit %d, stderr:\n%s\nwant exit 1 and %q", code, stderr, tc.want)
			}
		})
	}
}
