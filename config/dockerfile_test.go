package config

import (
	"bufio"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// dockerImage is what the Dockerfile sets up for a container: the CMD
// arguments after the subcommand, and the ENV variables.
type dockerImage struct {
	args []string
	env  map[string]string
}

// readDockerfile parses the CMD (exec form) and ENV KEY=VALUE lines of
// ../Dockerfile, with the image's config path mapped to the file it copies.
func readDockerfile(t *testing.T) dockerImage {
	t.Helper()
	f, err := os.Open("../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img := dockerImage{env: map[string]string{}}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case strings.HasPrefix(line, "CMD "):
			var cmd []string
			if err := json.Unmarshal([]byte(strings.TrimPrefix(line, "CMD ")), &cmd); err != nil || len(cmd) == 0 || cmd[0] != "serve" {
				t.Fatalf("CMD %q: want the exec form of serve (%v)", line, err)
			}
			for _, a := range cmd[1:] {
				img.args = append(img.args, strings.ReplaceAll(a, "/etc/cubeproxy/cubeproxy.yaml", "../configs/cubeproxy.yaml"))
			}
		case strings.HasPrefix(line, "ENV "):
			k, v, ok := strings.Cut(strings.TrimPrefix(line, "ENV "), "=")
			if !ok {
				t.Fatalf("ENV %q: want KEY=VALUE", line)
			}
			img.env[k] = strings.ReplaceAll(strings.Trim(v, `"`), "/etc/cubeproxy/cubeproxy.yaml", "../configs/cubeproxy.yaml")
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return img
}

// The container's defaults must leave every setting to `docker run -e`:
// a flag in CMD outranks the environment, so CUBEPROXY_ROUTES would be
// ignored without a word (and persist_routes refused for want of a file),
// and so would CUBEPROXY_CONFIG behind a --config in CMD: the image's
// config file names itself through the environment too.
func TestDockerImageLeavesSettingsToTheEnvironment(t *testing.T) {
	img := readDockerfile(t)
	for _, a := range img.args {
		if strings.HasPrefix(a, "-") {
			t.Errorf("CMD sets %s: a flag outranks the container's environment", a)
		}
	}
	own := filepath.Join(t.TempDir(), "operator.yaml")
	if err := os.WriteFile(own, []byte("http_addr: \":9999\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name     string
		env      map[string]string
		want     string
		wantHTTP string
	}{
		{"image default", nil, img.env["CUBEPROXY_ROUTES"], ":8081"},
		{"operator's routes file", map[string]string{"CUBEPROXY_ROUTES": "/data/routes.yaml"}, "/data/routes.yaml", ":8081"},
		{"operator's config file", map[string]string{"CUBEPROXY_CONFIG": own}, img.env["CUBEPROXY_ROUTES"], ":9999"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := map[string]string{}
			for k, v := range img.env {
				env[k] = v
			}
			for k, v := range tc.env {
				env[k] = v
			}
			c, err := Load(img.args, func(k string) string { return env[k] }, io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			if c.Routes != tc.want {
				t.Errorf("routes = %q, want %q", c.Routes, tc.want)
			}
			if c.HTTPAddr != tc.wantHTTP {
				t.Errorf("http_addr = %q, want %q (from the config file CUBEPROXY_CONFIG names)", c.HTTPAddr, tc.wantHTTP)
			}
			// The image has no configs/ directory: a relative path names nothing.
			if !strings.HasPrefix(c.Routes, "/") {
				t.Errorf("routes %q is not an absolute path in the image", c.Routes)
			}
		})
	}
}

// The image's config (configs/cubeproxy.yaml) leaves unset the keys whose
// zero defers to something else, as the README documents: a value written
// there would silently outrank it. An image run with
// OTEL_TRACES_SAMPLER_ARG=0.5 must sample half the traces, not the
// file's 1 %.
func TestImageConfigLeavesDeferringKeysUnset(t *testing.T) {
	img := readDockerfile(t)
	c, err := Load(img.args, func(k string) string { return img.env[k] }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		key    string
		set    bool
		defers string
	}{
		{"telemetry.trace_sample_ratio", c.Telemetry.TraceSampleRatio != 0, "OTEL_TRACES_SAMPLER_ARG"},
		{"instance_id", c.InstanceID != "", "the hostname"},
		{"tls.redirect_port", c.TLS.RedirectPort != 0, "https_addr's port"},
	} {
		if tc.set {
			t.Errorf("%s is set in the image's config: its unset value defers to %s, which it now overrides", tc.key, tc.defers)
		}
	}
}
