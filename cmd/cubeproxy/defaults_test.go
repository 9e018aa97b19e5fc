package main

import (
	"bytes"
	"context"
	"io"
	"os"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/cube-sandbox/cubeproxy/certs"
	"github.com/cube-sandbox/cubeproxy/config"
	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// helpLine is a flag's first line in -h: its name and the kind it takes.
var helpLine = regexp.MustCompile(`^  -([a-z0-9-]+) (\S+)$`)

// serveHelp runs `serve -h` through the entry point and returns each
// flag's shown default ("" when none). Every flag must name its kind.
func serveHelp(t *testing.T) map[string]string {
	t.Helper()
	var out, errb bytes.Buffer
	if code := run(context.Background(), []string{"serve", "-h"}, noEnv, &out, &errb); code != 0 {
		t.Fatalf("serve -h: exit %d\n%s", code, errb.String())
	}
	defaults := map[string]string{}
	lines := strings.Split(errb.String(), "\n")
	for i, l := range lines {
		m := helpLine.FindStringSubmatch(l)
		if m == nil || i+1 == len(lines) {
			continue
		}
		if m[2] == "value" {
			t.Errorf("-%s shows no kind (%q)", m[1], l)
		}
		defaults[m[1]] = ""
		if _, d, ok := strings.Cut(lines[i+1], " (default "); ok {
			defaults[m[1]] = strings.TrimSuffix(d, ")")
		}
	}
	if len(defaults) < 50 {
		t.Fatalf("serve -h lists %d flags:\n%s", len(defaults), errb.String())
	}
	return defaults
}

// parseShown reads a default as -h shows it into want's type; "" is the
// zero value (-h shows no default for it).
func parseShown(t *testing.T, shown string, want any) any {
	t.Helper()
	if shown == "" {
		return reflect.Zero(reflect.TypeOf(want)).Interface()
	}
	var v any
	var err error
	switch want.(type) {
	case time.Duration:
		v, err = time.ParseDuration(shown)
	case int:
		v, err = strconv.Atoi(shown)
	case int64:
		v, err = strconv.ParseInt(shown, 10, 64)
	case string:
		v, err = strconv.Unquote(shown)
	default:
		t.Fatalf("no parser for %T", want)
	}
	if err != nil {
		t.Fatalf("shown default %q: %v", shown, err)
	}
	return v
}

// Each default serve -h shows is the value a proxy started without that
// setting runs with, read from the running components (proxy, server,
// route cache, access log, Redis store). The defaults live in those
// packages; -h used to show none, and a copy of them kept for -h could
// drift from what the proxy does.
func TestShownDefaultsAreTheRunningProxys(t *testing.T) {
	shown := serveHelp(t)
	r := testenv.StartRedis(t)
	stores := map[string]*app{
		"memory": runServe(t, []string{"--http-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0", "--routes="}, noEnv).a,
		"redis": runServe(t, []string{"--http-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0",
			"--store", "redis", "--redis-addr", r.Addr()}, noEnv).a,
	}
	for _, tc := range []struct {
		flag  string
		store string
		got   func(a *app) any
	}{
		{"max-request-body", "memory", func(a *app) any { return a.proxy.Config().MaxRequestBodySize }},
		{"upstream-connect-timeout", "memory", func(a *app) any { return a.proxy.Config().ConnectTimeout }},
		{"upstream-response-header-timeout", "memory", func(a *app) any { return a.proxy.Config().ResponseHeaderTimeout }},
		{"upstream-idle-timeout", "memory", func(a *app) any { return a.proxy.Config().IdleStreamTimeout }},
		{"upstream-heartbeat-interval", "memory", func(a *app) any { return a.proxy.Config().HeartbeatInterval }},
		{"upstream-max-conns", "memory", func(a *app) any { return a.proxy.Config().MaxConnsPerUpstream }},
		{"upstream-idle-conn-timeout", "memory", func(a *app) any { return a.proxy.Config().UpstreamIdleConnTimeout }},
		{"upstream-max-header-size", "memory", func(a *app) any { return a.proxy.Config().UpstreamReadBufferSize }},
		{"max-streams-per-sandbox", "memory", func(a *app) any { return a.proxy.Config().MaxStreamsPerSandbox }},
		{"stream-limit-wait", "memory", func(a *app) any { return a.proxy.Config().StreamLimitWait }},
		{"max-held-body", "memory", func(a *app) any { return a.proxy.Config().MaxHeldBody }},
		{"held-body-budget", "memory", func(a *app) any { return a.proxy.Config().HeldBodyBudget }},
		{"held-body-per-sandbox", "memory", func(a *app) any { return a.proxy.Config().HeldBodyPerSandbox }},
		{"lifecycle-resume-timeout", "memory", func(a *app) any { return a.proxy.Config().ResumeTimeout }},
		{"client-read-timeout", "memory", func(a *app) any { return a.server.Config().ClientReadTimeout }},
		{"client-body-timeout", "memory", func(a *app) any { return a.server.Config().ClientBodyTimeout }},
		{"client-write-timeout", "memory", func(a *app) any { return a.server.Config().ClientWriteTimeout }},
		{"client-idle-timeout", "memory", func(a *app) any { return a.server.Config().ClientIdleTimeout }},
		{"client-max-header-size", "memory", func(a *app) any { return a.server.Config().MaxRequestHeaderSize }},
		{"client-max-conns", "memory", func(a *app) any { return a.server.Config().MaxClientConns }},
		{"drain-timeout", "memory", func(a *app) any { return a.server.Config().DrainTimeout }},
		{"cache-size", "memory", func(a *app) any { return a.cache.Config().Size }},
		{"cache-negative-size", "memory", func(a *app) any { return a.cache.Config().NegativeSize }},
		{"cache-ttl-min", "memory", func(a *app) any { return a.cache.Config().TTLMin }},
		{"cache-ttl-max", "memory", func(a *app) any { return a.cache.Config().TTLMax }},
		{"cache-negative-ttl", "memory", func(a *app) any { return a.cache.Config().NegativeTTL }},
		{"access-log-buffer-lines", "memory", func(a *app) any { return a.access.BufferLines() }},
		{"store", "memory", func(a *app) any { return a.cfg.Store }},
		{"redis-key-prefix", "redis", func(a *app) any { return a.redis.Config().KeyPrefix }},
		{"redis-legacy-key-prefix", "redis", func(a *app) any { return a.redis.Config().LegacyKeyPrefix }},
		{"redis-invalidate-channel", "redis", func(a *app) any { return a.redis.Config().InvalidateChannel }},
		{"redis-command-timeout", "redis", func(a *app) any { return a.redis.Config().CommandTimeout }},
		{"registry-interval", "redis", func(a *app) any { return a.redis.Config().Registry.Interval }},
		{"registry-hash", "redis", func(a *app) any { return a.redis.Config().Registry.Hash }},
		{"cache-size", "redis", func(a *app) any { return a.cache.Config().Size }},
	} {
		t.Run(tc.store+"/"+tc.flag, func(t *testing.T) {
			s, ok := shown[tc.flag]
			if !ok {
				t.Fatalf("serve -h has no -%s", tc.flag)
			}
			running := tc.got(stores[tc.store])
			if want := parseShown(t, s, running); want != running {
				t.Errorf("-%s: -h shows %q, the running proxy uses %v", tc.flag, s, running)
			}
		})
	}
}

// The shipped configs/cubeproxy.yaml, which the README says documents the
// common keys with their defaults, runs the proxy exactly as no file does:
// a default changed in code (or a value changed in the file) would leave
// operators copying a number the proxy no longer uses. tls.source is the
// one key it sets on purpose: unset picks files when files are given, and
// the file spells out the source it then gets.
func TestShippedConfigIsTheDefaults(t *testing.T) {
	cfg, err := config.LoadCommand("cubeproxy serve", nil, []string{"--config", "../../configs/cubeproxy.yaml"}, noEnv, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	file := flatYAML(t, effective(cfg, noEnv))
	none := flatYAML(t, shownDefaults())
	for k, want := range none {
		if got := file[k]; got != want && k != "tls.source" {
			t.Errorf("configs/cubeproxy.yaml: %s is %q, the default is %q", k, got, want)
		}
	}
}

// readmeRow is a row of the README's settings table: its key, then its
// default.
var readmeRow = regexp.MustCompile("^\\| `([a-z_.]+)`[^|]*\\| ([^|]+) \\|")

// Each default the README's settings table gives is the one serve -h
// shows (and TestShownDefaultsAreTheRunningProxys ties those to the
// running proxy): the table is what operators read first.
func TestReadmeTableDefaultsAreServes(t *testing.T) {
	raw, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	help := serveHelp(t)
	// The table's words for "nothing set", which -h shows as no default.
	unset := map[string]bool{"empty": true, "any": true, "none": true, "false": true, "0 (off)": true}
	_, section, _ := strings.Cut(string(raw), "\n## Configuration\n")
	section, _, _ = strings.Cut(section, "\n## ")
	rows := 0
	for _, line := range strings.Split(section, "\n") {
		m := readmeRow.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		key, doc := m[1], strings.Trim(m[2], "` ")
		shown, ok := help[strings.NewReplacer(".", "-", "_", "-").Replace(key)]
		if !ok {
			t.Errorf("README table: %s is no setting", key)
			continue
		}
		rows++
		if s, err := strconv.Unquote(shown); err == nil {
			shown = s
		}
		want := doc
		switch {
		case unset[doc]:
			want = ""
		case strings.HasSuffix(doc, " MiB"):
			n, err := strconv.Atoi(strings.TrimSuffix(doc, " MiB"))
			if err != nil {
				t.Fatalf("README %s: default %q", key, doc)
			}
			want = strconv.Itoa(n << 20)
		}
		if shown != want {
			t.Errorf("README table: %s default %q, serve -h shows %q", key, doc, shown)
		}
	}
	if rows < 15 {
		t.Fatalf("found %d rows of the README's settings table", rows)
	}
}

// flatYAML is every setting of c as check prints it, by dotted path
// (lists joined with commas).
func flatYAML(t *testing.T, c *config.Config) map[string]string {
	t.Helper()
	raw, err := c.YAML()
	if err != nil {
		t.Fatal(err)
	}
	var n yaml.Node
	if err := yaml.Unmarshal(raw, &n); err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	var walk func(n *yaml.Node, path string)
	walk = func(n *yaml.Node, path string) {
		switch n.Kind {
		case yaml.DocumentNode:
			walk(n.Content[0], path)
		case yaml.MappingNode:
			for i := 0; i+1 < len(n.Content); i += 2 {
				walk(n.Content[i+1], strings.TrimPrefix(path+"."+n.Content[i].Value, "."))
			}
		case yaml.SequenceNode:
			var vals []string
			for _, e := range n.Content {
				vals = append(vals, e.Value)
			}
			out[path] = strings.Join(vals, ",")
		default:
			out[path] = n.Value
		}
	}
	walk(&n, "")
	return out
}

// The two settings whose default -h cannot show, because it holds only
// under one certificate source (config refuses them under another, so no
// default is filled in without it), name it in their text, as the README
// promises for every flag -h shows no default for: without it an
// operator reads "how often certificate files are re-read" and no number.
// The numbers come from certs, which applies them.
func TestHelpNamesSourceDependentDefaults(t *testing.T) {
	var out, errb bytes.Buffer
	if code := run(context.Background(), []string{"serve", "-h"}, noEnv, &out, &errb); code != 0 {
		t.Fatalf("serve -h: exit %d\n%s", code, errb.String())
	}
	text := map[string]string{}
	lines := strings.Split(errb.String(), "\n")
	for i, l := range lines {
		if m := helpLine.FindStringSubmatch(l); m != nil && i+1 < len(lines) {
			text[m[1]] = lines[i+1]
		}
	}
	for _, tc := range []struct{ flag, want string }{
		{"tls-reload-interval", "unset: " + certs.DefaultReloadInterval.String()},
		{"tls-acme-on-demand-rate", "unset: " + strconv.Itoa(certs.DefaultOnDemandRate)},
	} {
		if !strings.Contains(text[tc.flag], tc.want) {
			t.Errorf("-%s: %q, want it to say %q", tc.flag, text[tc.flag], tc.want)
		}
	}
}

// The held-body settings reach the running proxy as set, and a share left
// unset follows the budget set (a quarter of it), as -h says.
func TestHeldBodySettingsReachTheProxy(t *testing.T) {
	a := runServe(t, []string{"--http-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0", "--routes=",
		"--max-held-body=1048576", "--held-body-budget=33554432"}, noEnv).a
	if c := a.proxy.Config(); c.MaxHeldBody != 1<<20 || c.HeldBodyBudget != 32<<20 || c.HeldBodyPerSandbox != 8<<20 {
		t.Errorf("max_held_body %d, held_body_budget %d, held_body_per_sandbox %d; want 1 MiB, 32 MiB, 8 MiB", c.MaxHeldBody, c.HeldBodyBudget, c.HeldBodyPerSandbox)
	}
	a = runServe(t, []string{"--http-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0", "--routes=",
		"--max-held-body=-1", "--held-body-per-sandbox=-1"}, noEnv).a
	if c := a.proxy.Config(); c.MaxHeldBody != -1 || c.HeldBodyPerSandbox != -1 {
		t.Errorf("max_held_body %d, held_body_per_sandbox %d; want -1 (off) each", c.MaxHeldBody, c.HeldBodyPerSandbox)
	}
}

// stream_limit_wait reaches the running proxy as set, negative (no wait)
// included.
func TestStreamLimitWaitReachesTheProxy(t *testing.T) {
	for _, tc := range []struct {
		flag string
		want time.Duration
	}{
		{"--stream-limit-wait=2s", 2 * time.Second},
		{"--stream-limit-wait=-1ms", -time.Millisecond},
	} {
		a := runServe(t, []string{"--http-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0", "--routes=", tc.flag}, noEnv).a
		if got := a.proxy.Config().StreamLimitWait; got != tc.want {
			t.Errorf("%s: the proxy waits %v, want %v", tc.flag, got, tc.want)
		}
	}
}

// lifecycle.sidecar_addr and resume_timeout reach the running proxy as
// set; unset, nothing is dialed (no resumer).
func TestLifecycleSettingsReachTheProxy(t *testing.T) {
	env := func(k string) string {
		if k == "CUBEPROXY_LIFECYCLE_SIDECAR_ADDR" {
			return "127.0.0.1:8083"
		}
		return ""
	}
	a := runServe(t, []string{"--http-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0", "--routes=",
		"--lifecycle-resume-timeout=4s"}, env).a
	if c := a.proxy.Config(); c.ResumeAddr != "127.0.0.1:8083" || c.ResumeTimeout != 4*time.Second {
		t.Errorf("the proxy resumes through %q within %v, want 127.0.0.1:8083 within 4s", c.ResumeAddr, c.ResumeTimeout)
	}
	a = runServe(t, []string{"--http-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0", "--routes="}, noEnv).a
	if c := a.proxy.Config(); c.ResumeAddr != "" || c.ResumeTimeout != 30*time.Second {
		t.Errorf("by default the proxy resumes through %q within %v, want off and 30s", c.ResumeAddr, c.ResumeTimeout)
	}
}
