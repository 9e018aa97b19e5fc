package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"
)

// `cubeproxy health` (the image's HEALTHCHECK) asks the admin listener
// the configuration names, the running proxy's own: exit 0 and the
// answer on a 200, exit 1 and the answer on anything else or no answer,
// exit 2 for a command line it cannot read.
func TestHealthAsksTheAdminListener(t *testing.T) {
	r := runServe(t, []string{"--http-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0", "--routes="}, noEnv)
	admin := r.a.adminLn.Addr().String()

	// A listener that answers 503, as /readyz does while the proxy drains.
	notReady := listen503(t)
	// Something else on the port that sends the probe elsewhere: to the
	// proxy's own listener here, which answers 200.
	redirect := listenRedirect(t, "http://"+admin+"/readyz")
	// Something else that answers with terminal escape sequences.
	escapes := listenAnswer(t, 200, "\x1b]0;owned\a{\"ready\":true}\x1b[2J\xff")
	// Something else that answers a success other than 200: the probe
	// succeeds on a 200 alone (usage: "exit 0 on 200"), as /readyz sends.
	noContent := listenAnswer(t, 204, "")
	// A port no one listens on.
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gone := closed.Addr().String()
	closed.Close()

	for _, tc := range []struct {
		name string
		addr string
		args []string
		code int
		out  string // in stdout (code 0) or stderr
	}{
		{"the image's HEALTHCHECK", admin, imageHealthcheck(t), 0, "GET /readyz: 200 OK"},
		{"ready", admin, nil, 0, "GET /readyz: 200 OK"},
		{"live", admin, []string{"--live"}, 0, "GET /admin/healthz: 200 OK"},
		{"not ready", notReady, nil, 1, "GET /readyz: 503 Service Unavailable"},
		{"other success", noContent, nil, 1, "GET /readyz: 204 No Content"},
		{"redirected", redirect, nil, 1, "GET /readyz: 302 Found (to http://" + admin + "/readyz, not followed)"},
		{"control characters", escapes, nil, 0, `GET /readyz: 200 OK \x1b]0;owned\a{"ready":true}\x1b[2J\xff` + "\n"},
		{"no listener", gone, []string{"--timeout", "2s"}, 1, "connection refused"},
		{"stray argument", admin, []string{"now"}, 2, `unexpected argument "now"`},
		{"bad timeout", admin, []string{"--timeout", "0s"}, 2, "--timeout 0s"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := func(k string) string {
				if k == "CUBEPROXY_ADMIN_ADDR" {
					return tc.addr
				}
				return ""
			}
			var stdout, stderr bytes.Buffer
			code := run(context.Background(), append([]string{"health"}, tc.args...), env, &stdout, &stderr)
			out := stdout.String()
			if code != 0 {
				out = stderr.String()
			}
			if code != tc.code || !strings.Contains(out, tc.out) {
				t.Fatalf("exit %d, output %q (stderr %q); want exit %d with %q", code, out, stderr.String(), tc.code, tc.out)
			}
		})
	}
}

// imageHealthcheck returns the arguments the Dockerfile's HEALTHCHECK
// gives `cubeproxy health` (exec form, the image's binary).
func imageHealthcheck(t *testing.T) []string {
	t.Helper()
	raw, err := os.ReadFile("../../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(string(raw), "\n") {
		if !strings.HasPrefix(line, "HEALTHCHECK ") {
			continue
		}
		_, cmd, ok := strings.Cut(line, " CMD ")
		var args []string
		if !ok || json.Unmarshal([]byte(cmd), &args) != nil || len(args) < 2 || args[0] != "/cubeproxy" || args[1] != "health" {
			t.Fatalf("Dockerfile %q: want HEALTHCHECK ... CMD [\"/cubeproxy\", \"health\", ...]", line)
		}
		return args[2:]
	}
	t.Fatal("the Dockerfile has no HEALTHCHECK")
	return nil
}

// listen503 serves 503 on a loopback port and returns its address.
func listen503(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, `{"ready":false,"reason":"draining"}`, http.StatusServiceUnavailable)
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().String()
}

// listenAnswer serves status with body on a loopback port and returns
// its address.
func listenAnswer(t *testing.T, status int, body string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(status)
		io.WriteString(w, body)
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().String()
}

// The admin listener serve opens on "[::]" takes IPv4 connections, so
// probeAddr's 127.0.0.1 reaches it.
func TestHealthReachesDualStackWildcard(t *testing.T) {
	ln, err := listenTCP(context.Background(), "[::]:0", false)
	if err != nil {
		t.Skipf("no IPv6 wildcard listener here: %v", err)
	}
	defer ln.Close()
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	addr, err := probeAddr(net.JoinHostPort("::", port))
	if err != nil {
		t.Fatal(err)
	}
	c, err := net.DialTimeout("tcp", addr, 3*time.Second)
	if err != nil {
		t.Fatalf("dial %s, the probe of [::]:%s: %v", addr, port, err)
	}
	c.Close()
}

// listenRedirect serves a 302 to location on a loopback port and returns
// its address.
func listenRedirect(t *testing.T, location string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.RedirectHandler(location, http.StatusFound)}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().String()
}

// A wildcard admin listener is asked through loopback: IPv4's, "[::]"
// included, which Go listens on dual-stack. Asked at ::1, the image's
// HEALTHCHECK failed for good in a container whose loopback has no IPv6
// (disable_ipv6=1, as Docker sets it on networks without IPv6): `connect:
// cannot assign requested address`, while the proxy listened and answered
// 127.0.0.1.
func TestHealthProbeAddr(t *testing.T) {
	for _, tc := range []struct{ in, want, err string }{
		{":8082", "127.0.0.1:8082", ""},
		{"0.0.0.0:8082", "127.0.0.1:8082", ""},
		{"[::]:8082", "127.0.0.1:8082", ""},
		{"127.0.0.1:8082", "127.0.0.1:8082", ""},
		{"10.0.0.5:8082", "10.0.0.5:8082", ""},
		{"[fd00::2]:8082", "[fd00::2]:8082", ""},
		// A service name, which serve listens on: a URL takes numbers only.
		{"127.0.0.1:http", "127.0.0.1:80", ""},
		{":https", "127.0.0.1:443", ""},
		{"", "", "admin_addr is empty"},
		{"8082", "", "missing port"},
	} {
		got, err := probeAddr(tc.in)
		if got != tc.want || (err == nil) != (tc.err == "") || err != nil && !strings.Contains(err.Error(), tc.err) {
			t.Errorf("probeAddr(%q) = %q, %v; want %q, %q", tc.in, got, err, tc.want, tc.err)
		}
	}
}

// A configuration file edited since the proxy started into one that no
// longer loads (a ConfigMap update with a typo) does not fail the probe of
// the running proxy: its admin_addr is asked and the error is said on
// stderr. The probe failed, and an orchestrator restarted the healthy
// proxy into a start that failed on that file. A file whose admin_addr
// cannot be read still fails it.
func TestHealthOfARunningProxyWhoseFileNoLongerLoads(t *testing.T) {
	r := runServe(t, []string{"--http-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0", "--routes="}, noEnv)
	admin := r.a.adminLn.Addr().String()
	for _, tc := range []struct {
		name, file string
		code       int
		stdout     string
		stderr     []string
		unsaid     []string // not in stderr
	}{
		{"a bad value elsewhere", "admin_addr: " + admin + "\ndrain_timeout: soon\n", 0, "GET /readyz: 200 OK",
			[]string{"the configuration no longer loads, asking its admin_addr " + admin, "drain_timeout"}, nil},
		{"an unknown key", "admin_addr: " + admin + "\nno_such_setting: 1\n", 0, "GET /readyz: 200 OK",
			[]string{"no longer loads", "no_such_setting"}, nil},
		{"no YAML", "admin_addr: [" + admin + "\n", 1, "", []string{"config "}, nil},
		// An admin_addr no client can reach is not asked: the file's own
		// error is said, not a probe of "http:///readyz".
		{"an admin_addr without a port", "admin_addr: localhost\nno_such_setting: 1\n", 1, "",
			[]string{"no_such_setting"}, []string{"asking its admin_addr", "GET http"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := t.TempDir() + "/cubeproxy.yaml"
			if err := os.WriteFile(path, []byte(tc.file), 0o600); err != nil {
				t.Fatal(err)
			}
			var stdout, stderr bytes.Buffer
			code := run(context.Background(), []string{"health", "--config", path}, noEnv, &stdout, &stderr)
			if code != tc.code || !strings.Contains(stdout.String(), tc.stdout) {
				t.Fatalf("exit %d, stdout %q, stderr %q; want exit %d with %q", code, stdout.String(), stderr.String(), tc.code, tc.stdout)
			}
			for _, want := range tc.stderr {
				if !strings.Contains(stderr.String(), want) {
					t.Errorf("stderr %q lacks %q", stderr.String(), want)
				}
			}
			for _, not := range tc.unsaid {
				if strings.Contains(stderr.String(), not) {
					t.Errorf("stderr %q says %q", stderr.String(), not)
				}
			}
		})
	}
}

// --config= reads no file, not even the one CUBEPROXY_CONFIG names (the
// image sets it), in health and token sign as in serve: a container run
// on the environment alone, whose probe mirrors serve's arguments, had
// health fail on a file serve never read, and an orchestrator restart
// the healthy proxy.
func TestEmptyConfigFlagReadsNoFileInEveryCommand(t *testing.T) {
	missing := t.TempDir() + "/missing.yaml"
	key := strings.Repeat("k", 32)
	var admin string
	env := func(k string) string {
		switch k {
		case "CUBEPROXY_CONFIG":
			return missing
		case "CUBEPROXY_ADMIN_ADDR":
			return admin
		case "CUBEPROXY_AUTH_SIGNING_KEYS":
			return key
		}
		return ""
	}
	admin = "127.0.0.1:0"
	r := runServe(t, []string{"--config=", "--http-addr", "127.0.0.1:0", "--routes="}, env)
	admin = r.a.adminLn.Addr().String()
	for _, args := range [][]string{
		{"health", "--config="},
		{"token", "sign", "--sandbox", "a", "--port", "1", "--config="},
	} {
		var stdout, stderr bytes.Buffer
		if code := run(context.Background(), args, env, &stdout, &stderr); code != 0 {
			t.Errorf("%q: exit %d, stderr %q; want 0, the file CUBEPROXY_CONFIG names unread", args, code, stderr.String())
		}
	}
}

// health's own flags take values as serve's do and say what they want
// when refused: Go's "parse error" left `--timeout 5` to guess that the
// unit was missing, and --live=on, a boolean as serve's flags take it,
// was refused.
func TestHealthFlagValues(t *testing.T) {
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gone := closed.Addr().String()
	closed.Close()
	env := func(k string) string {
		if k == "CUBEPROXY_ADMIN_ADDR" {
			return gone
		}
		return ""
	}
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"--timeout", "5"}, 2, `invalid value "5" for flag -timeout: want a duration with its unit (3s, 500ms)`},
		{[]string{"--live=maybe"}, 2, `invalid boolean "maybe": want true or false`},
		{[]string{"--live=on", "--timeout", "2s"}, 1, "/admin/healthz"},
		{[]string{"--live=off", "--timeout", "2s"}, 1, "/readyz"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := run(context.Background(), append([]string{"health"}, tc.args...), env, &stdout, &stderr)
			if code != tc.code || !strings.Contains(stderr.String(), tc.want) || strings.Contains(stderr.String(), "parse error") {
				t.Fatalf("exit %d, stderr %q; want exit %d with %q", code, stderr.String(), tc.code, tc.want)
			}
		})
	}
	var stdout, stderr bytes.Buffer
	if code := run(context.Background(), []string{"health", "-h"}, env, &stdout, &stderr); code != 0 ||
		!strings.Contains(stderr.String(), "-timeout duration") || !strings.Contains(stderr.String(), "(default 3s)") ||
		!strings.Contains(stderr.String(), "\n  -live\n") {
		t.Errorf("health -h: exit %d\n%s", code, stderr.String())
	}
}

// A probe that got no answer says so in one line that names the URL once,
// and a timeout as the time waited: net/http's error repeated the URL
// (`GET http://…/readyz: Get "http://…/readyz": dial tcp …`) and named a
// timeout "context deadline exceeded".
func TestHealthNoAnswerSaidOnce(t *testing.T) {
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gone := closed.Addr().String()
	closed.Close()
	// A listener that accepts and never answers.
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	go func() {
		for {
			c, err := silent.Accept()
			if err != nil {
				return
			}
			defer c.Close()
		}
	}()
	for _, tc := range []struct {
		addr string
		args []string
		want string
	}{
		{gone, nil, "cubeproxy: health: GET http://" + gone + "/readyz: dial tcp " + gone + ": connect: connection refused\n"},
		{silent.Addr().String(), []string{"--timeout", "200ms"}, "cubeproxy: health: GET http://" + silent.Addr().String() + "/readyz: no answer within 200ms\n"},
	} {
		env := func(k string) string {
			if k == "CUBEPROXY_ADMIN_ADDR" {
				return tc.addr
			}
			return ""
		}
		var stdout, stderr bytes.Buffer
		if code := run(context.Background(), append([]string{"health"}, tc.args...), env, &stdout, &stderr); code != 1 || stderr.String() != tc.want {
			t.Errorf("exit %d, stderr %q; want exit 1 with %q", code, stderr.String(), tc.want)
		}
	}
}
