package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

func noEnv(string) string { return "" }

func TestVersionAndUsage(t *testing.T) {
	var out, errb bytes.Buffer
	if code := run(context.Background(), []string{"version"}, noEnv, &out, &errb); code != 0 || !strings.HasPrefix(out.String(), "cubeproxy ") {
		t.Fatalf("version: %d %q", code, out.String())
	}
	if code := run(context.Background(), []string{"bogus"}, noEnv, &out, &errb); code != 2 {
		t.Fatalf("unknown command exit %d", code)
	}
	if code := run(context.Background(), []string{"serve", "--admin-addr", "0.0.0.0:0", "--http-addr", "127.0.0.1:0"}, noEnv, &out, &errb); code != 1 ||
		!strings.Contains(errb.String(), `admin_addr "0.0.0.0:0" is not loopback and no admin token`) ||
		!strings.Contains(errb.String(), "(admin_addr is set by --admin-addr)") {
		t.Fatalf("admin on 0.0.0.0 without token must refuse to start: %d %s", code, errb.String())
	}
}

// The top level takes help and version in each spelling Go's flag package
// gives a flag (one dash or two), as every subcommand's flags do:
// `cubeproxy -help` and `cubeproxy -version` exited 2, told that the
// command comes first and its flags after it.
func TestTopLevelHelpAndVersionSpellings(t *testing.T) {
	for _, tc := range []struct {
		arg  string
		want string // the start of stdout
	}{
		{"-h", "cubeproxy - edge proxy"},
		{"-help", "cubeproxy - edge proxy"},
		{"--h", "cubeproxy - edge proxy"},
		{"--help", "cubeproxy - edge proxy"},
		{"-v", "cubeproxy "},
		{"-version", "cubeproxy "},
		{"--version", "cubeproxy "},
	} {
		var out, errb bytes.Buffer
		if code := run(context.Background(), []string{tc.arg}, noEnv, &out, &errb); code != 0 || !strings.HasPrefix(out.String(), tc.want) {
			t.Errorf("cubeproxy %s: exit %d, stdout %.40q, stderr %.120q; want 0 and %q", tc.arg, code, out.String(), errb.String(), tc.want)
		}
	}
	for _, arg := range []string{"-h", "-help", "--h", "--help"} {
		for _, cmd := range []struct{ name, want string }{
			{"version", "usage: cubeproxy version"},
			{"token", "usage: cubeproxy token sign"},
		} {
			var out, errb bytes.Buffer
			if code := run(context.Background(), []string{cmd.name, arg}, noEnv, &out, &errb); code != 0 || !strings.HasPrefix(errb.String(), cmd.want) {
				t.Errorf("cubeproxy %s %s: exit %d, stderr %.80q; want 0 and its usage", cmd.name, arg, code, errb.String())
			}
		}
	}
}

// A command line the program cannot read exits 2, whichever part of it is
// wrong: the subcommand (as it always did) or a flag (which exited 1, as a
// configuration serve refused does). Go's flag.ExitOnError exits 2 alike;
// a wrapper script tells its own mistake from a refused configuration.
func TestUsageExitCodes(t *testing.T) {
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{nil, 2, "Usage:"},
		{[]string{"bogus"}, 2, `unknown command "bogus"`},
		// A command cut short or run past is named, as a flag's typo is.
		{[]string{"serv"}, 2, `unknown command "serv" (did you mean serve?)`},
		{[]string{"Server", "--config", "c.yaml"}, 2, `unknown command "Server" (did you mean serve?)`},
		{[]string{"healthz"}, 2, `(did you mean health?)`},
		{[]string{"chek"}, 2, `unknown command "chek" (did you mean check?)`}, // a typo, as a flag's
		{[]string{"bog"}, 2, "unknown command \"bog\"\n"},                     // like no command: none named
		// serve's flags written before it, as nginx -c takes its file:
		// say where they go rather than take the flag for a command.
		{[]string{"--config", "c.yaml", "serve"}, 2, `unknown command "--config": the command comes first and its flags after it (cubeproxy serve --config FILE)`},
		{[]string{"-config=c.yaml", "check"}, 2, "the command comes first"},
		{[]string{"serve", "--bogus"}, 2, "flag provided but not defined: -bogus"},
		{[]string{"check", "--http_addr=:1"}, 2, "did you mean --http-addr?"},
		{[]string{"check", "--cache-size=abc"}, 2, `invalid value "abc" for flag -cache-size`},
		{[]string{"check", "--registry-enabled=maybe"}, 2, `invalid boolean value "maybe"`},
		{[]string{"check", "--http-addr"}, 2, "flag needs an argument: -http-addr"},
		{[]string{"check", "---x"}, 2, "bad flag syntax: ---x"},
		{[]string{"check", "--routes=", "stray"}, 2, `unexpected argument "stray"`},
		{[]string{"check", "--routes=", "--admin-token=", "s3cret"}, 2, "unexpected argument (not shown"},
		{[]string{"demo", "--bogus"}, 2, "flag provided but not defined"},
		{[]string{"token"}, 2, "usage: cubeproxy token sign"},
		{[]string{"token", "sign", "--bogus"}, 2, "flag provided but not defined: -bogus"},
		{[]string{"token", "sign", "--port=x"}, 2, `invalid value "x" for flag -port`},
		{[]string{"token", "sign", "--sandbx=box"}, 2, "did you mean --sandbox?"},
		{[]string{"health", "--timout=1s"}, 2, "did you mean --timeout?"},
		// Commands without flags take no arguments either.
		{[]string{"version", "--short"}, 2, "version takes no arguments"},
		{[]string{"help", "serve", "extra"}, 2, "help takes one command"},
		{[]string{"help", "token", "verify"}, 2, "help takes one command"},
		// Read, and refused for what it says: a configuration error, 1.
		{[]string{"check", "--routes=", "--access-log-format=csv"}, 1, `access_log.format "csv"`},
		{[]string{"check", "--routes=", "--upstream-connect-timeout=-1s"}, 1, "is negative"},
	} {
		var out, errb bytes.Buffer
		code := run(context.Background(), tc.args, noEnv, &out, &errb)
		if code != tc.code || !strings.Contains(errb.String(), tc.want) {
			t.Errorf("%q: exit %d, stderr %.300q; want %d and %q", tc.args, code, errb.String(), tc.code, tc.want)
		}
	}
}

// Each subcommand's -h describes that subcommand and exits 0: `demo -h`,
// the newcomer's first question, used to be titled "cubeproxy serve", and
// `token -h` failed as a bad invocation.
func TestSubcommandHelp(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"serve", "-h"}, "Usage of cubeproxy serve:"},
		{[]string{"demo", "-h"}, "Usage of cubeproxy demo:"},
		{[]string{"check", "-h"}, "Usage of cubeproxy check:"},
		{[]string{"token", "sign", "-h"}, "Usage of cubeproxy token sign:"},
		{[]string{"token", "-h"}, "usage: cubeproxy token sign"},
		{[]string{"token", "--help"}, "usage: cubeproxy token sign"},
		// As go help build: the command's own usage, not the list again.
		{[]string{"help", "serve"}, "Usage of cubeproxy serve:"},
		{[]string{"help", "check"}, "Usage of cubeproxy check:"},
		// token has one subcommand: its flags, not token -h's one line.
		{[]string{"help", "token"}, "Usage of cubeproxy token sign:"},
		{[]string{"help", "token", "sign"}, "Usage of cubeproxy token sign:"},
		{[]string{"version", "-h"}, "usage: cubeproxy version"},
	} {
		var out, errb bytes.Buffer
		code := run(context.Background(), tc.args, noEnv, &out, &errb)
		if code != 0 || !strings.HasPrefix(errb.String(), tc.want) {
			t.Errorf("%v: exit %d, stderr %.60q; want 0 and %q", tc.args, code, errb.String(), tc.want)
		}
	}
}

// Settings a proxy would start with and then fail on refuse to start, with
// the setting named.
func TestServeRefusesBadSettings(t *testing.T) {
	base := []string{"serve", "--http-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0", "--routes="}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--upstream-connect-timeout=-1s"}, "upstream.connect_timeout: -1s is negative"},
		{[]string{"--admin-addr="}, "admin_addr is empty"},
		{[]string{"--admin-addr=10.0.0.1", "--admin-token=s3cret"}, "missing port"},
		// A token no header can carry: every admin request would be a 403.
		{[]string{"--admin-token=s3cret\n"}, "admin_token"},
		// off is as valid as json and cube: the message must say so.
		{[]string{"--access-log-format=csv"}, `access_log.format "csv": want json, cube or off`},
		// On-demand issuance with no domain to hold names to.
		{[]string{"--https-addr=127.0.0.1:0", "--tls-source=acme", "--tls-acme-skip-wildcard", "--tls-acme-on-demand",
			"--tls-acme-email=ops@cube.test", "--tls-acme-storage-dir=" + t.TempDir()}, "tls.acme.on_demand is on but tls.domain and domains are empty: no name could be told to be a sandbox's; set tls.domain (CUBEPROXY_TLS_DOMAIN) or domains, which say which names may get a certificate (tls.acme.on_demand is set by --tls-acme-on-demand)"},
		// A redirect with no HTTPS listener to send to: plain HTTP would
		// go on reaching the sandboxes the operator meant to close it to.
		{[]string{"--tls-redirect-http"}, "tls.redirect_http needs https_addr"},
		// A redirect with no plain-HTTP listener to answer from: the
		// operator expects http:// to redirect, and nothing listens.
		{[]string{"--https-addr=127.0.0.1:0", "--http-addr=", "--tls-redirect-http"}, "tls.redirect_http is on but http_addr is empty"},
		// A redirect port alone: plain HTTP would go on being proxied
		// where the operator expected a redirect.
		{[]string{"--https-addr=127.0.0.1:0", "--tls-redirect-port=8443"}, "tls.redirect_port is set but tls.redirect_http is off"},
		// A routes file that cannot be rewritten: every admin change
		// would answer 500 (the image's /etc/cubeproxy without a mounted
		// directory, a path mistyped).
		{[]string{"--persist-routes", "--routes=" + filepath.Join(t.TempDir(), "missing", "routes.yaml")}, "persist_routes: routes file"},
		// No file to write: named by both settings, and where each came from.
		{[]string{"--persist-routes"}, "persist_routes is on but routes is empty: admin route changes would be written nowhere; set routes (CUBEPROXY_ROUTES, for example configs/routes.yaml), or remove persist_routes (persist_routes is set by --persist-routes; routes is set by --routes)"},
	} {
		var out, errb bytes.Buffer
		// Bounded: a setting that is wrongly accepted starts a proxy.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		code := run(ctx, append(base, tc.args...), noEnv, &out, &errb)
		cancel()
		if code != 1 || !strings.Contains(errb.String(), tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want 1 and %q", tc.args, code, errb.String(), tc.want)
		}
	}
}

// serve runs the whole program in-process: a request goes through, and
// cancelling the context (what SIGTERM does) drains and returns nil.
func TestServeInProcess(t *testing.T) {
	port := sandboxServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "hi from sandbox") }))

	routes := boxRoutes(t, t.TempDir(), port)

	r := runServe(t, []string{"--http-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0", "--routes", routes, "--drain-timeout", "2s"}, noEnv)
	a := r.a
	req, _ := http.NewRequest("GET", "http://"+a.httpLn.Addr().String()+"/", nil)
	req.Host = fmt.Sprintf("%d-box.cube.test", port)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(body) != "hi from sandbox" {
		t.Fatalf("got %q", body)
	}
	r.stop() // what SIGTERM does: drain, then serve returns nil
}

// A SIGTERM or SIGINT that arrives before the listeners are up (main's
// context already done when build opens them) is a stop, not a failed
// start: exit 0, with the reason logged. A listener address naming a host
// (localhost) used to fail its lookup on the ended context, and the
// process exited 1 blaming the listener ("lookup localhost: operation was
// canceled"), as a SIGTERM during tls.acme.sync's wait blamed the CA.
func TestSignalDuringStartupStopsCleanly(t *testing.T) {
	for _, args := range [][]string{
		{"serve", "--http-addr", "127.0.0.1:0", "--admin-addr", "localhost:0", "--routes="},
		{"serve", "--http-addr", "localhost:0", "--admin-addr", "127.0.0.1:0", "--routes="},
		{"demo", "--http-addr", "127.0.0.1:0", "--admin-addr", "localhost:0", "--routes="},
	} {
		ctx, cancel := context.WithCancel(context.Background())
		cancel() // the signal came first
		var out, errb bytes.Buffer
		code := run(ctx, args, noEnv, &out, &errb)
		// Go's resolver may still answer a lookup raced by the ended
		// context: the proxy then starts and drains at once. Either way
		// the stop is logged and exits 0.
		logs := out.String() + errb.String()
		stopped := strings.Contains(logs, "signal during startup: stopped before serving") || strings.Contains(logs, `"msg":"stopped"`)
		if code != 0 || strings.Contains(errb.String(), "cubeproxy:") || !stopped {
			t.Errorf("%v: exit %d; want 0 and the stop logged, no error\nstdout: %s\nstderr: %s", args, code, out.String(), errb.String())
		}
	}

	// Whatever the start was doing when the signal came is still a stop:
	// libraries do not all keep context.Canceled in their errors
	// (certmagic's wait for the storage lock another replica holds
	// formats it away). What it was doing is kept in the log line. The
	// failure here is the routes file's (a directory), the last step
	// before the listeners, which a signal already in stops from opening.
	dir := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	var out, errb bytes.Buffer
	code := run(ctx, []string{"serve", "--http-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0", "--routes", dir}, noEnv, &out, &errb)
	if code != 0 || !strings.Contains(out.String(), "stopped before serving") || !strings.Contains(out.String(), "directory") {
		t.Errorf("routes a directory, signal first: exit %d; want 0, the stop logged with what it interrupted\nstdout: %s\nstderr: %s", code, out.String(), errb.String())
	}
}

// A start that fails once the server exists (here: the admin port is
// taken) stops what the server started with it: its janitor and hang-up
// watcher, with an epoll descriptor, used to be left running, one pair per
// failed start of run() in a process that goes on.
func TestFailedStartLeavesNoServerGoroutines(t *testing.T) {
	held, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	before := goroutinesIn("proxy.(*Server).janitor") + goroutinesIn("proxy.(*hangups).run")
	for range 3 {
		var out, errb bytes.Buffer
		code := run(context.Background(), []string{"serve", "--http-addr", "127.0.0.1:0", "--admin-addr", held.Addr().String(), "--routes="}, noEnv, &out, &errb)
		if code != 1 || !strings.Contains(errb.String(), "admin_addr") {
			t.Fatalf("exit %d, stderr %q; want 1 and the admin listener's error", code, errb.String())
		}
	}
	testenv.WaitFor(t, 5*time.Second, "the failed starts' server goroutines to end", func() bool {
		return goroutinesIn("proxy.(*Server).janitor")+goroutinesIn("proxy.(*hangups).run") <= before
	})
}

// The real binary: SIGTERM with an SSE stream open ends the stream cleanly
// and the process exits 0 within the drain time.
func TestBinarySIGTERM(t *testing.T) {
	// Parallel: it waits on a child process of its own (signals go to the
	// child), on ports picked by the kernel.
	t.Parallel()
	bin := buildBinary(t)
	port := sandboxServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: one\n\n")
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	}))
	routes := boxRoutes(t, t.TempDir(), port)
	cmd, logs, exited := startBinary(t, bin, "serve", "--http-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0", "--routes", routes, "--drain-timeout", "3s")
	proxyAddr, _ := waitListening(t, logs, exited)
	var resp *http.Response
	deadline := time.Now().Add(10 * time.Second)
	for {
		req, _ := http.NewRequest("GET", "http://"+proxyAddr+"/", nil)
		req.Host = fmt.Sprintf("%d-box.cube.test", port)
		var err error
		if resp, err = http.DefaultClient.Do(req); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("proxy never came up: %v\n%s", err, logs.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	br := bufio.NewReader(resp.Body)
	if line, _ := br.ReadString('\n'); line != "data: one\n" {
		t.Fatalf("first line %q", line)
	}
	start := time.Now()
	cmd.Process.Signal(syscall.SIGTERM)
	_, err := io.Copy(io.Discard, br)
	if err != nil {
		t.Errorf("SSE stream ended with %v, want a clean end", err)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("exit: %v\n%s", err, logs.String())
		}
	case <-time.After(6 * time.Second):
		t.Fatalf("process still running 6s after SIGTERM\n%s", logs.String())
	}
	if d := time.Since(start); d > 4*time.Second {
		t.Errorf("exit took %v", d)
	}
	if !strings.Contains(logs.String(), `"msg":"stopped"`) {
		t.Errorf("no clean stop in logs:\n%s", logs.String())
	}
}

// The registry's admin_url names a host other instances can reach, not the
// wildcard the admin API listens on.
func TestAdminURL(t *testing.T) {
	hostname, _ := os.Hostname()
	for _, tc := range []struct {
		addr   *net.TCPAddr
		nodeIP string
		want   string
	}{
		{&net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 8082}, "10.0.0.5", "http://127.0.0.1:8082"},
		{&net.TCPAddr{IP: net.IPv6unspecified, Port: 8082}, "10.0.0.5", "http://10.0.0.5:8082"},
		{&net.TCPAddr{IP: net.IPv4zero, Port: 8082}, "fd00::5", "http://[fd00::5]:8082"},
		{&net.TCPAddr{IP: net.IPv6unspecified, Port: 8082}, "", "http://" + net.JoinHostPort(hostname, "8082")},
	} {
		if got := adminURL(tc.addr, tc.nodeIP); got != tc.want {
			t.Errorf("adminURL(%s, %q) = %q, want %q", tc.addr, tc.nodeIP, got, tc.want)
		}
	}
}

// accessLogDropped scrapes cubeproxy_accesslog_dropped_total from the admin
// API; -1 when it cannot.
func accessLogDropped(adminAddr string) float64 {
	return scrapeMetric(adminAddr, "cubeproxy_accesslog_dropped_total")
}

// scrapeMetric reads one unlabelled sample from the admin API's /metrics;
// -1 when it cannot.
func scrapeMetric(adminAddr, name string) float64 {
	return scrapeMetricWith(http.DefaultClient, adminAddr, name)
}

// scrapeMetricWith is scrapeMetric through client.
func scrapeMetricWith(client *http.Client, adminAddr, name string) float64 {
	resp, err := client.Get("http://" + adminAddr + "/metrics")
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	samples, err := testenv.ParsePromText(resp.Body)
	if err != nil {
		return -1
	}
	for _, s := range samples {
		if s.Name == name {
			return s.Value
		}
	}
	return -1
}

// The real binary, logging to a pipe whose reader goes away (a log shipper
// that crashed, journald restarting): the access log counts the lost lines
// and the proxy keeps serving. Go's default for a broken pipe on stdout is
// to die of SIGPIPE, which would cut every open stream; the logs write
// through a duplicate descriptor (proclog.Pollable), for which Go raises
// none, so this holds even without main's signal.Ignore.
func TestBinarySurvivesStdoutReaderGone(t *testing.T) {
	// Parallel: it waits on a child process of its own (signals go to the
	// child), on ports picked by the kernel.
	t.Parallel()
	bin := buildBinary(t)
	routes := filepath.Join(t.TempDir(), "routes.yaml")
	os.WriteFile(routes, []byte("routes: {}\n"), 0o600)
	cmd := exec.Command(bin, "serve", "--http-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0", "--routes", routes, "--drain-timeout", "1s")
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr syncBuffer
	cmd.Stdout, cmd.Stderr = w, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	w.Close()
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()

	// The process log goes to stdout too: once it announces the
	// listeners, the reader leaves.
	sc := bufio.NewScanner(r)
	var proxyAddr, adminAddr string
	for ok := false; !ok && sc.Scan(); {
		proxyAddr, adminAddr, ok = listeningAddrs(sc.Text())
	}
	r.Close()
	if proxyAddr == "" {
		t.Fatalf("no listening line before stdout ended\n%s", stderr.String())
	}

	// A client of its own, without keep-alive: http.DefaultClient's pool,
	// shared with the package's other tests, may hold a connection to a
	// server gone from a port the kernel has since given this proxy.
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	req, _ := http.NewRequest("GET", "http://"+proxyAddr+"/", nil)
	req.Host = "80-nobox.cube.test"
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Fatalf("request: %d, want the proxy's 404 for an unknown sandbox", resp.StatusCode)
	}
	// The line for that request is written to the broken pipe and counted
	// as dropped; the admin API still answering afterwards is the proof.
	// The wait only bounds a hang: the drop comes with the line, and the
	// race run on a loaded 2-core machine once took longer than 10 s.
	deadline := time.Now().Add(30 * time.Second)
	for {
		select {
		case err := <-exited:
			t.Fatalf("proxy exited after its stdout reader left: %v\n%s", err, stderr.String())
		default:
		}
		d := scrapeMetricWith(client, adminAddr, "cubeproxy_accesslog_dropped_total")
		if d > 0 {
			break
		}
		if time.Now().After(deadline) {
			// -1: the admin API did not answer with the metric.
			t.Fatalf("no access-log drop counted in 30 s: cubeproxy_accesslog_dropped_total %v\n%s", d, stderr.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	sigtermAndWait(t, cmd, exited, &stderr)
}

// A metrics exporter the proxy does not push to is named at startup, not
// silently ignored, and by check, which notes what serve would warn of.
func TestUnsupportedMetricsExporterWarns(t *testing.T) {
	for _, tc := range []struct {
		value string
		warn  bool
	}{{"otlp", true}, {"none", false}, {"prometheus", false}, {"", false}} {
		t.Run(tc.value, func(t *testing.T) {
			env := func(k string) string {
				if k == "OTEL_METRICS_EXPORTER" {
					return tc.value
				}
				return ""
			}
			r := runServe(t, []string{"--http-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0", "--routes="}, env)
			r.stop()
			if got := strings.Contains(r.logs.String(), "OTEL_METRICS_EXPORTER is not supported"); got != tc.warn {
				t.Fatalf("warning logged: %v, want %v\n%s", got, tc.warn, r.logs)
			}
			var out, errb bytes.Buffer
			if code := run(context.Background(), []string{"check", "--routes="}, env, &out, &errb); code != 0 {
				t.Fatalf("check: exit %d\n%s", code, errb.String())
			}
			if got := strings.Contains(errb.String(), "cubeproxy: note: OTEL_METRICS_EXPORTER is not supported"); got != tc.warn {
				t.Fatalf("check noted it: %v, want %v\n%s", got, tc.warn, errb.String())
			}
		})
	}
}

// A misspelled CUBEPROXY_* variable is named at startup with the setting
// it most likely meant, instead of being ignored without a word.
func TestUnknownEnvWarns(t *testing.T) {
	t.Setenv("CUBEPROXY_ROUTE", "/etc/cubeproxy/routes.yaml")
	r := runServe(t, []string{"--http-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0", "--routes="}, noEnv)
	r.stop()
	logs := r.logs.String()
	if !strings.Contains(logs, `"msg":"unknown CUBEPROXY_ variable ignored","name":"CUBEPROXY_ROUTE","did_you_mean":"CUBEPROXY_ROUTES"`) {
		t.Fatalf("no warning naming CUBEPROXY_ROUTE and CUBEPROXY_ROUTES:\n%s", logs)
	}
}

// A start that fails names the CUBEPROXY_* variables it ignored: a
// misspelled one is often why it failed (the error then asks for the very
// variable the operator believes is set), and the warning serve logs once
// running is never reached.
func TestFailedStartNamesUnknownEnv(t *testing.T) {
	for _, tc := range []struct {
		name         string
		env          [2]string
		args         []string
		want, typoed string
	}{
		// build refuses: the token was set under another name.
		{"serve, admin token", [2]string{"CUBEPROXY_ADMIN_TOKN", "s3cret-token"},
			[]string{"serve", "--http-addr", "127.0.0.1:0", "--admin-addr", "0.0.0.0:0", "--routes="}, "CUBEPROXY_ADMIN_TOKEN", "CUBEPROXY_ADMIN_TOKN"},
		// config.LoadCommand refuses: store stayed memory.
		{"serve, store", [2]string{"CUBEPROXY_STOR", "redis"},
			[]string{"serve", "--http-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0", "--redis-addr", "127.0.0.1:1"}, "CUBEPROXY_STORE", "CUBEPROXY_STOR"},
		{"token sign, keys", [2]string{"CUBEPROXY_AUTH_SIGNING_KEY", strings.Repeat("k", 32)},
			[]string{"token", "sign", "--sandbox", "box", "--port", "8080"}, "CUBEPROXY_AUTH_SIGNING_KEYS", "CUBEPROXY_AUTH_SIGNING_KEY"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv(tc.env[0], tc.env[1])
			var out, errb bytes.Buffer
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			code := run(ctx, tc.args, os.Getenv, &out, &errb)
			note := fmt.Sprintf("%s is not a setting and was ignored; did you mean %s?", tc.typoed, tc.want)
			if code != 1 || !strings.Contains(errb.String(), note) {
				t.Errorf("exit %d, stderr:\n%s\nwant 1 and %q", code, errb.String(), note)
			}
		})
	}
}

// The shipped configuration serves the shipped routes file: the example
// sandbox it documents is in the table, with its MCP port mapped.
func TestShippedConfigAndRoutes(t *testing.T) {
	r := runServe(t, []string{"--config", "../../configs/cubeproxy.yaml", "--routes", "../../configs/routes.yaml",
		"--http-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0", "--access-log-format", "off"}, noEnv)
	route, ok := r.a.routes.Get("example")
	if !ok {
		t.Fatalf("route example not loaded\n%s", r.logs)
	}
	if p, ok := route.HostPort(50005); !ok || p != 50005 {
		t.Fatalf("example: port 50005 maps to %d (%v), want 50005", p, ok)
	}
}

// A second SIGTERM during the drain cuts it short, as nginx's fast
// shutdown does: an operator (or a supervisor) that signals again wants
// the process gone now, and a SIGKILL would lose the answers and the
// access-log lines that the cut still gives. It is logged; before, it was
// swallowed and the drain ran its course.
func TestBinarySecondSigtermCutsDrainShort(t *testing.T) {
	// Parallel: it waits on a child process of its own (signals go to the
	// child), on ports picked by the kernel.
	t.Parallel()
	bin := buildBinary(t)
	// A sandbox that takes the request and never answers.
	sandbox := testenv.StartSilentServer(t)
	_, port, _ := net.SplitHostPort(sandbox.Addr)
	routes := filepath.Join(t.TempDir(), "routes.yaml")
	os.WriteFile(routes, []byte("routes:\n  mute:\n    HostIP: \"127.0.0.1\"\n    \""+port+"\": \""+port+"\"\n"), 0o600)
	const drain = 60 * time.Second
	cmd, logs, exited := startBinary(t, bin, "serve", "--http-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0", "--routes", routes, "--drain-timeout", drain.String())
	proxyAddr, _ := waitListening(t, logs, exited)

	c, err := net.Dial("tcp", proxyAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: %s-mute.cube.test\r\nX-Cube-Request-Id: cut-short\r\n\r\n", port)
	select {
	case <-sandbox.Reached:
	case <-time.After(10 * time.Second):
		t.Fatalf("the request never reached the sandbox\n%s", logs.String())
	}

	_ = cmd.Process.Signal(syscall.SIGTERM)
	testenv.WaitFor(t, 10*time.Second, "drain", func() bool { return strings.Contains(logs.String(), "shutting down: draining") })
	start := time.Now()
	_ = cmd.Process.Signal(syscall.SIGTERM)
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), &http.Request{Method: "GET"})
	if err != nil {
		t.Fatalf("no answer after the second SIGTERM: %v\n%s", err, logs.String())
	}
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 504 || !strings.Contains(string(body), `"drain_timeout"`) {
		t.Errorf("answer %d %s, want 504 drain_timeout", resp.StatusCode, body)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("exit after the second SIGTERM: %v\n%s", err, logs.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("process still draining 10s after the second SIGTERM (drain %v)\n%s", drain, logs.String())
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("exited %v after the second SIGTERM", d)
	}
	out := logs.String()
	if !strings.Contains(out, "cutting the drain short") {
		t.Errorf("the second SIGTERM was not logged\n%s", out)
	}
	if !strings.Contains(out, `"x_cube_request_id":"cut-short"`) {
		t.Errorf("no access-log line for the cut request\n%s", out)
	}
}

// A variable that spells a setting the file alone takes (tls.files, a
// list of sections) says where that setting goes, in serve's warning and
// in check's note: "not a setting" alone left the operator to guess why
// the file's key works and the variable does not.
func TestFileOnlySettingVarNamed(t *testing.T) {
	t.Setenv("CUBEPROXY_TLS_FILES", "/etc/cubeproxy/cert.pem")
	r := runServe(t, []string{"--http-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0", "--routes="}, noEnv)
	r.stop()
	if logs := r.logs.String(); !strings.Contains(logs, `"msg":"unknown CUBEPROXY_ variable ignored","name":"CUBEPROXY_TLS_FILES","file_only":"tls.files"`) {
		t.Errorf("no warning naming tls.files as the file's:\n%s", logs)
	}
	var out, errb bytes.Buffer
	if code := run(context.Background(), []string{"check", "--config=", "--routes="}, os.Getenv, &out, &errb); code != 0 ||
		!strings.Contains(errb.String(), "cubeproxy: note: CUBEPROXY_TLS_FILES is not a setting and was ignored: tls.files is set only in the config file\n") {
		t.Errorf("check: exit %d, stderr:\n%s", code, errb.String())
	}
}
