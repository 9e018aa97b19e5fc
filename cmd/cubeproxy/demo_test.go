package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// Settings the demo cannot run with are refused with a message, not a
// panic, and leave no listener behind.
func TestDemoRefusesUnusableSettings(t *testing.T) {
	const routesFile = "routes:\n  box:\n    HostIP: \"127.0.0.1\"\n    \"3000\": \"3000\"\n"
	routes := writeTemp(t, t.TempDir(), "routes.yaml", routesFile)
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		// Its curl commands need the plain HTTP listener.
		{"no http listener", []string{"--http-addr=", "--https-addr=127.0.0.1:0"}, "demo needs http_addr"},
		// Its route goes into the memory store.
		{"redis store", []string{"--store=redis", "--redis-addr=127.0.0.1:1"}, "demo needs store: memory"},
		// Its route, on ports that close with it, must not reach the file.
		{"persisted routes", []string{"--routes", routes, "--persist-routes"}, "demo needs persist_routes off"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// The admin port is picked here, free, and handed to the demo,
			// so that the end can check nothing listens there. Another
			// socket of the machine may take it in between: that check is
			// then tried again on a new port, and a listener the demo
			// left open fails every attempt.
			for attempt := 1; ; attempt++ {
				admin := freeAddr(t)
				args := append([]string{"demo", "--http-addr", "127.0.0.1:0", "--admin-addr", admin, "--routes="}, tc.args...)
				var out, errb bytes.Buffer
				// Bounded: a demo that wrongly starts runs until cancelled.
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				code := run(ctx, args, noEnv, &out, &errb)
				cancel()
				if code != 1 || !strings.Contains(errb.String(), tc.want) {
					t.Fatalf("exit %d, stderr %q; want 1 and %q", code, errb.String(), tc.want)
				}
				ln, err := net.Listen("tcp", admin)
				if errors.Is(err, syscall.EADDRINUSE) && attempt < 3 {
					t.Logf("admin port %s in use after the refusal; trying a new one: %v", admin, err)
					continue
				}
				if err != nil {
					t.Fatalf("admin listener left open (attempt %d): %v", attempt, err)
				}
				ln.Close()
				break
			}
			if b, err := os.ReadFile(routes); err != nil || string(b) != routesFile {
				t.Fatalf("routes file after the demo: %q (%v), want it untouched", b, err)
			}
		})
	}
}

// The printed commands reach the listeners on the addresses they were
// given, not only when those are on 127.0.0.1 or every interface, and
// work under the settings an operator may have exported (an allowed
// domain list, an admin token): they are run here as printed.
func TestDemoPrintsListenerAddresses(t *testing.T) {
	for _, tc := range []struct {
		name, httpAddr, want string
		extra                []string
		env                  map[string]string // the demo's
		shell                map[string]string // the curl's, when not env: as the printed note says
	}{
		{"every interface", ":0", "http://127.0.0.1:", nil, nil, nil},
		{"one loopback address", "127.0.0.2:0", "http://127.0.0.2:", nil, nil, nil},
		{"allowed domains", ":0", "http://127.0.0.1:", []string{"--domains", "*.cube.example.com,other.test"}, nil, nil},
		{"admin token from the environment", ":0", "http://127.0.0.1:", nil, map[string]string{"CUBEPROXY_ADMIN_TOKEN": "s3cret"}, nil},
		// The variable the command names is not in the operator's shell:
		// the demo must say to set it, or the command is a 403.
		{"admin token from a flag", ":0", "http://127.0.0.1:", []string{"--admin-token", "fl4g-token"}, nil,
			map[string]string{"CUBEPROXY_ADMIN_TOKEN": "fl4g-token"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := &syncBuffer{}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan int, 1)
			getenv := func(k string) string { return tc.env[k] }
			go func() {
				args := append([]string{"demo", "--http-addr", tc.httpAddr, "--admin-addr", "127.0.0.1:0", "--routes="}, tc.extra...)
				done <- run(ctx, args, getenv, out, io.Discard)
			}()
			testenv.WaitFor(t, 10*time.Second, "the demo's instructions", func() bool { return strings.Contains(out.String(), "curl -s http") })
			defer func() {
				cancel()
				if code := testenv.Recv(t, done, 10*time.Second, "the demo's exit once cancelled"); code != 0 {
					t.Errorf("demo exit %d", code)
				}
			}()
			shell := tc.shell
			if shell == nil {
				shell = tc.env
			}
			if token := shell["CUBEPROXY_ADMIN_TOKEN"]; token != "" {
				if !strings.Contains(out.String(), "export CUBEPROXY_ADMIN_TOKEN=") {
					t.Errorf("the admin command sends $CUBEPROXY_ADMIN_TOKEN without saying to set it:\n%s", out)
				}
				if strings.Contains(out.String(), token) {
					t.Errorf("the demo printed the admin token")
				}
			}
			var sse, admin string
			for _, line := range strings.Split(out.String(), "\n") {
				switch {
				case strings.HasPrefix(line, "curl -N http") && sse == "":
					sse = line
				case strings.HasPrefix(line, "curl -s http") && strings.Contains(line, "/admin/"):
					admin = line
				}
			}
			if !strings.Contains(sse, tc.want) {
				t.Fatalf("SSE command %q, want it to name %s...", sse, tc.want)
			}
			// The first event of the ticker comes through.
			resp := curlAsPrinted(t, sse, shell)
			br := bufio.NewReader(resp.Body)
			line, err := br.ReadString('\n')
			resp.Body.Close()
			if resp.StatusCode != 200 || err != nil || !strings.HasPrefix(line, "id: ") {
				t.Fatalf("%s: %d, first line %q (%v), want the ticker's first event", sse, resp.StatusCode, line, err)
			}
			resp = curlAsPrinted(t, admin, shell)
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 || !strings.Contains(string(body), `"demo"`) {
				t.Fatalf("%s: %d %s, want the routes with the demo's", admin, resp.StatusCode, body)
			}
		})
	}
}

// curlAsPrinted sends the GET a printed one-line curl command would: its
// URL, and its -H headers (with $VAR expanded from env, as a shell would).
func curlAsPrinted(t *testing.T, cmd string, env map[string]string) *http.Response {
	t.Helper()
	fields := regexp.MustCompile(`'[^']*'|"[^"]*"|\S+`).FindAllString(cmd, -1)
	unquote := func(s string) string {
		if len(s) >= 2 && (s[0] == '\'' || s[0] == '"') {
			q := s[0]
			s = s[1 : len(s)-1]
			if q == '"' {
				s = os.Expand(s, func(k string) string { return env[k] })
			}
		}
		return s
	}
	var req *http.Request
	var hdrs []string
	for i := 1; i < len(fields); i++ {
		f := unquote(fields[i])
		switch {
		case f == "-H" && i+1 < len(fields):
			i++
			hdrs = append(hdrs, unquote(fields[i]))
		case strings.HasPrefix(f, "http://"):
			r, err := http.NewRequest("GET", f, nil)
			if err != nil {
				t.Fatal(err)
			}
			req = r
		}
	}
	if req == nil {
		t.Fatalf("no URL in %q", cmd)
	}
	for _, h := range hdrs {
		k, v, _ := strings.Cut(h, ":")
		if v = strings.TrimSpace(v); strings.EqualFold(k, "Host") {
			req.Host = v
		} else {
			req.Header.Set(k, v)
		}
	}
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
	if err != nil {
		t.Fatalf("%s: %v", cmd, err)
	}
	return resp
}
