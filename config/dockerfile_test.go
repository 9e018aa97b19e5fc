package config

import (
	"bufio"
	"encoding/json"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// dockerImage is what the Dockerfile sets up for a container: the CMD
// arguments after the subcommand, the ENV variables, and the final stage's
// USER and EXPOSEd ports.
type dockerImage struct {
	args   []string
	env    map[string]string
	user   string
	expose []string
}

// readDockerfile parses the CMD (exec form), ENV KEY=VALUE, USER and
// EXPOSE lines of ../Dockerfile, with the image's config path mapped to the
// file it copies. USER and EXPOSE are the final stage's: a FROM resets them.
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
		case strings.HasPrefix(line, "FROM "):
			img.user, img.expose = "", nil
		case strings.HasPrefix(line, "USER "):
			img.user = strings.TrimSpace(strings.TrimPrefix(line, "USER "))
		case strings.HasPrefix(line, "EXPOSE "):
			img.expose = append(img.expose, strings.Fields(strings.TrimPrefix(line, "EXPOSE "))...)
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

// The image runs as a numeric non-root user, and EXPOSEs exactly the
// ports its default configuration serves to the container's network.
// Kubernetes' runAsNonRoot (the restricted Pod Security Standard) cannot
// map a user name to a uid, so it refused `USER nonroot:nonroot` before
// starting the container: "container has runAsNonRoot and image has
// non-numeric user (nonroot), cannot verify user is non-root". And an
// EXPOSEd port nothing listens on (8080, https_addr, unset by default)
// was published by `docker run -P` to a port that refused every
// connection.
func TestDockerImageUserAndPorts(t *testing.T) {
	img := readDockerfile(t)
	c, err := Load(img.args, func(k string) string { return img.env[k] }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	// What the default configuration listens on outside the container's
	// loopback (the admin API stays on 127.0.0.1 until configured).
	var served []string
	for _, addr := range []string{c.HTTPAddr, c.HTTPSAddr, c.AdminAddr} {
		if addr == "" {
			continue
		}
		host, port, err := net.SplitHostPort(addr)
		if err != nil {
			t.Fatalf("listener %q: %v", addr, err)
		}
		if ip, err := netip.ParseAddr(host); host == "localhost" || err == nil && ip.IsLoopback() {
			continue
		}
		served = append(served, port)
	}
	slices.Sort(served)
	exposed := slices.Clone(img.expose)
	for i, p := range exposed {
		exposed[i] = strings.TrimSuffix(p, "/tcp")
	}
	slices.Sort(exposed)

	uid, gid, _ := strings.Cut(img.user, ":")
	for _, tc := range []struct {
		what string
		ok   bool
		got  string
		want string
	}{
		{"USER's uid", isNonRootID(uid), img.user, "a numeric uid other than 0 (uid:gid)"},
		{"USER's gid", gid == "" || isNonRootID(gid), img.user, "a numeric gid other than 0"},
		{"EXPOSE", slices.Equal(exposed, served), strings.Join(img.expose, " "), "the default listeners' ports " + strings.Join(served, " ")},
	} {
		if !tc.ok {
			t.Errorf("%s: %q, want %s", tc.what, tc.got, tc.want)
		}
	}
}

// isNonRootID reports whether s is a decimal user or group id other than 0.
func isNonRootID(s string) bool {
	n, err := strconv.ParseUint(s, 10, 32)
	return err == nil && n != 0
}

// The image keeps the Go runtime's sysmon out of its deep sleep with a
// schedtrace interval (README, Performance). The runtime reads the value
// with strconv.ParseInt(v, 10, 32) and ignores one that does not parse,
// so a typo or an interval past int32 would drop the saving without a
// word. bench/compare.sh and bench/profile.sh take the line as written
// (sed 's/^ENV GODEBUG=//'), so it must be one unquoted KEY=VALUE list.
func TestDockerImageGODEBUGKeepsSysmonAwake(t *testing.T) {
	raw, err := os.ReadFile("../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for _, l := range strings.Split(string(raw), "\n") {
		if strings.HasPrefix(l, "ENV GODEBUG=") {
			lines = append(lines, strings.TrimPrefix(l, "ENV GODEBUG="))
		}
	}
	if len(lines) != 1 {
		t.Fatalf("%d `ENV GODEBUG=` lines, want 1 (the bench scripts read it)", len(lines))
	}
	var interval int64 = -1
	for _, kv := range strings.Split(lines[0], ",") {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || strings.ContainsAny(kv, "\"' ") {
			t.Fatalf("GODEBUG entry %q: want key=value, unquoted", kv)
		}
		if k == "schedtrace" {
			if interval, err = strconv.ParseInt(v, 10, 32); err != nil {
				t.Fatalf("schedtrace=%s: the runtime ignores it (%v)", v, err)
			}
		}
	}
	if interval <= 0 {
		t.Fatalf("GODEBUG %q sets no schedtrace interval above 0", lines[0])
	}
	if interval < 24*3600*1000 {
		t.Errorf("schedtrace=%d prints a SCHED line to stderr every %v: want the largest interval", interval, time.Duration(interval)*time.Millisecond)
	}
}
