package main

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
)

// admin_pprof is read from each of its three spellings, as its neighbours
// admin_addr and admin_token are (flag over environment over file), off by
// default, and reaches the admin listener: the heap profile with it, the
// admin API's 404 without it. The traffic listener never serves a profile,
// and `check` prints the setting in effect.
func TestAdminPprofSetting(t *testing.T) {
	const token = "pprof-setting-admin-token"
	port := sandboxServer(t, func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "sandbox saw "+r.URL.Path) })
	dir := t.TempDir()
	routes := boxRoutes(t, dir, port)
	onInFile := writeTemp(t, dir, "on.yaml", "admin_pprof: true\n")
	env := func(k string) string {
		if k == "CUBEPROXY_ADMIN_PPROF" {
			return "true"
		}
		return ""
	}
	get := func(addr, host, path string) (int, string) {
		t.Helper()
		req, err := http.NewRequest("GET", "http://"+addr+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		if host != "" {
			req.Host = host
		}
		req.Header.Set("X-Cube-Admin-Token", token)
		resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	for _, tc := range []struct {
		name   string
		args   []string
		getenv func(string) string
		on     bool
	}{
		{"default", nil, noEnv, false},
		{"flag", []string{"--admin-pprof"}, noEnv, true},
		{"environment", nil, env, true},
		{"file", []string{"--config", onInFile}, noEnv, true},
		{"flag over file", []string{"--config", onInFile, "--admin-pprof=false"}, noEnv, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"--http-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0", "--routes", routes, "--admin-token", token}, tc.args...)
			r := runServe(t, args, tc.getenv)
			admin, traffic := r.a.adminLn.Addr().String(), r.a.httpLn.Addr().String()
			st, body := get(admin, "", "/debug/pprof/heap")
			switch {
			case tc.on && (st != 200 || !strings.HasPrefix(body, "\x1f\x8b")):
				t.Errorf("on: heap profile %d %.200q, want 200 and a gzip'd profile", st, body)
			case !tc.on && (st != 404 || !strings.Contains(body, "profiling is off")):
				t.Errorf("off: heap profile %d %.200q, want the admin API's 404", st, body)
			}
			if st, body := get(traffic, fmt.Sprintf("%d-box.cube.test", port), "/debug/pprof/heap"); st != 200 || body != "sandbox saw /debug/pprof/heap" {
				t.Errorf("traffic listener, sandbox host: %d %.200q, want the sandbox's answer", st, body)
			}
			if st, body := get(traffic, "", "/debug/pprof/heap"); st < 400 || !strings.Contains(body, `"code"`) {
				t.Errorf("traffic listener, no sandbox: %d %.200q, want a routing error", st, body)
			}

			code, stdout, stderr := runCheck(t, tc.getenv, append([]string{"--routes", routes}, tc.args...)...)
			var printed struct {
				Pprof *bool `yaml:"admin_pprof"`
			}
			if code != 0 || yaml.Unmarshal([]byte(stdout), &printed) != nil || printed.Pprof == nil || *printed.Pprof != tc.on {
				t.Errorf("check: exit %d, admin_pprof printed %v, want %v\n%s\n%s", code, printed.Pprof, tc.on, stdout, stderr)
			}
		})
	}
}
