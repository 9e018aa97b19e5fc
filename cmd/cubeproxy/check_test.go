package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/cube-sandbox/cubeproxy/config"
	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// runCheck runs `cubeproxy check args...` through the entry point.
func runCheck(t *testing.T, getenv func(string) string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	code = run(context.Background(), append([]string{"check"}, args...), getenv, &out, &errb)
	return code, out.String(), errb.String()
}

// writeTemp writes body to name in dir and returns its path.
func writeTemp(t *testing.T, dir, name, body string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// holdAddr is a loopback listener the test keeps open: a check that
// listened on its address, as serve does, would fail.
func holdAddr(t *testing.T) (net.Listener, string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln, ln.Addr().String()
}

// noConnection fails t when anything connected to ln.
func noConnection(t *testing.T, ln net.Listener, what string) {
	t.Helper()
	tcp := ln.(*net.TCPListener)
	if err := tcp.SetDeadline(time.Now()); err != nil {
		t.Fatal(err)
	}
	c, err := tcp.Accept()
	if err == nil {
		c.Close()
		t.Errorf("check connected to %s", what)
	} else if ne, ok := errors.AsType[net.Error](err); !ok || !ne.Timeout() {
		t.Errorf("accept on %s: %v", what, err)
	}
}

const restrictedToken = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

// A good configuration: exit 0, the effective configuration on stdout
// (defaults filled in, loadable again as a config file), what was loaded
// on stderr, and neither listener opened although both addresses are
// taken, nor the TLS files' certificates left unread.
func TestCheckGoodConfig(t *testing.T) {
	dir := t.TempDir()
	_, httpAddr := holdAddr(t)
	_, httpsAddr := holdAddr(t)
	ca := testenv.NewCA(t, "check CA")
	ca.WritePair(t, filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem"), "*.cube.test")
	routes := writeTemp(t, dir, "routes.yaml", "routes:\n  box:\n    HostIP: \"127.0.0.1\"\n    \"3000\": \"3000\"\n")
	cfg := writeTemp(t, dir, "cubeproxy.yaml", "http_addr: "+httpAddr+"\nhttps_addr: "+httpsAddr+"\nadmin_addr: 127.0.0.1:0\nroutes: "+routes+
		"\ndomains: [cube.test]\ninstance_id: node-7\nupstream:\n  connect_timeout: 5s\ntls:\n  source: files\n  cert_file: "+filepath.Join(dir, "cert.pem")+
		"\n  key_file: "+filepath.Join(dir, "key.pem")+"\n")

	code, stdout, stderr := runCheck(t, noEnv, "--config", cfg, "--cache-size", "500")
	if code != 0 {
		t.Fatalf("exit %d\nstderr: %s", code, stderr)
	}
	for _, want := range []string{"configuration ok", "1 routes in", "1 certificate files loaded"} {
		if !strings.Contains(stderr, want) {
			t.Errorf("stderr lacks %q: %s", want, stderr)
		}
	}
	var got struct {
		HTTPAddr   string `yaml:"http_addr"`
		InstanceID string `yaml:"instance_id"`
		HeldBody   int64  `yaml:"max_held_body"`
		HeldBudget int64  `yaml:"held_body_budget"`
		HeldShare  int64  `yaml:"held_body_per_sandbox"`
		LimitWait  string `yaml:"stream_limit_wait"`
		Cache      struct {
			Size int    `yaml:"size"`
			TTL  string `yaml:"ttl_min"`
		} `yaml:"cache"`
		Upstream struct {
			Connect string `yaml:"connect_timeout"`
			Idle    string `yaml:"idle_timeout"`
		} `yaml:"upstream"`
	}
	if err := yaml.Unmarshal([]byte(stdout), &got); err != nil {
		t.Fatalf("stdout is not YAML: %v\n%s", err, stdout)
	}
	if got.HTTPAddr != httpAddr || got.InstanceID != "node-7" || got.Cache.Size != 500 || got.Upstream.Connect != "5s" || // file and flags
		got.Cache.TTL != "500s" || got.Upstream.Idle != "7206s" || // defaults, as serve -h shows them
		got.HeldBody != 4<<20 || got.HeldBudget != 64<<20 || got.HeldShare != 16<<20 || // the share derived from the budget
		got.LimitWait != "100ms" {
		t.Errorf("effective configuration: %+v\n%s", got, stdout)
	}

	// What check prints is a configuration check accepts, and prints again alike.
	again := writeTemp(t, dir, "effective.yaml", stdout)
	code, stdout2, stderr2 := runCheck(t, noEnv, "--config", again)
	if code != 0 || stdout2 != stdout {
		t.Errorf("its own output: exit %d\n%s\nstdout:\n%s\nwant:\n%s", code, stderr2, stdout2, stdout)
	}
}

// A configuration serve would refuse: exit 1 (2 for a flag value the
// flag package cannot read, a usage error), the reason on stderr,
// nothing on stdout. Some of these are refused only where serve would
// open the file or build the component, not by config's validation.
func TestCheckBadConfig(t *testing.T) {
	dir := t.TempDir()
	badRoutes := writeTemp(t, dir, "bad-routes.yaml", "routes:\n  box:\n    HostIP: \"127.0.0.1\"\n    AllowPublicTraffic: \"maybe\"\n")
	foreign := notOnThisMachine(t)
	ca := testenv.NewCA(t, "ca")
	good, goodKey, otherKey := filepath.Join(dir, "good.pem"), filepath.Join(dir, "good.key"), filepath.Join(dir, "other.key")
	ca.WritePair(t, good, goodKey, "cube.test")
	ca.WritePair(t, filepath.Join(dir, "other.pem"), otherKey, "other.test")
	for _, tc := range []struct {
		name string
		yaml string
		args []string
		want string
	}{
		{"unknown key", "http_adr: :8081\n", nil, "http_adr"},
		{"bad duration flag", "", []string{"--upstream-connect-timeout", "3"}, "invalid duration"},
		{"invalid route", "routes: " + badRoutes + "\n", nil, "AllowPublicTraffic"},
		{"missing certificate", "https_addr: 127.0.0.1:0\ntls:\n  source: files\n  cert_file: " + dir + "/none.pem\n  key_file: " + dir + "/none.key\n", nil, "cubeproxy: tls certificates: tls.cert_file: stat " + dir + "/none.pem: no such file"},
		// A listed pair's error names its setting: the path alone did not
		// say which entry of tls.files, nor that it was one.
		{"listed pair, missing key", "https_addr: 127.0.0.1:0\ntls:\n  source: files\n  files:\n    - {cert_file: " + good + ", key_file: " + goodKey + "}\n    - {cert_file: " + good + ", key_file: " + dir + "/none.key}\n", nil,
			"cubeproxy: tls certificates: tls.files[1].key_file: stat " + dir + "/none.key: no such file"},
		{"listed pair, certificate not PEM", "https_addr: 127.0.0.1:0\ntls:\n  source: files\n  files:\n    - {cert_file: " + badRoutes + ", key_file: " + goodKey + "}\n", nil,
			"cubeproxy: tls certificates: tls.files[0].cert_file + tls.files[0].key_file: load " + badRoutes + " + " + goodKey + ": tls: failed to find any PEM data in certificate input"},
		{"listed pair, key of another certificate", "https_addr: 127.0.0.1:0\ntls:\n  source: files\n  files:\n    - {cert_file: " + good + ", key_file: " + goodKey + "}\n    - {cert_file: " + good + ", key_file: " + otherKey + "}\n", nil,
			"cubeproxy: tls certificates: tls.files[1].cert_file + tls.files[1].key_file: load " + good + " + " + otherKey + ": tls: private key does not match public key"},
		{"short signing key", "auth:\n  signing_keys: [short]\n", nil, "auth.signing_keys"},
		{"acme without email", "https_addr: 127.0.0.1:0\ntls:\n  source: acme\n  domain: cube.test\n  acme:\n    storage_dir: " + dir + "\n    dns:\n      provider: rfc2136\n      options: {server: 127.0.0.1:53}\n", nil, "email"},
		{"redis ca_file missing", "store: redis\nredis:\n  addr: 127.0.0.1:1\n  tls: true\n  ca_file: " + dir + "/none-ca.pem\n", nil, "none-ca.pem"},
		{"bad log level", "log_level: loud\n", nil, "log_level"},
		// slog reads it as a level between info and warn: serve started,
		// and its "cubeproxy listening" line was not logged.
		{"log level with an offset", "log_level: info+1\n", nil, `log_level "info+1": want debug, info, warn or error`},
		{"log level with a negative offset", "log_level: DEBUG-4\n", nil, `log_level "DEBUG-4"`},
		// serve would start and dial every route on this node through
		// its host port: HostIP never carries the zone.
		{"node_ip with an IPv6 zone", "node_ip: 'fe80::1%eth0'\n", nil, `node_ip "fe80::1%eth0": an IPv6 zone`},
		{"access log format", "access_log:\n  format: xml\n", nil, "access_log.format"},
		// serve's start refuses a store it does not have: check must not
		// print the configuration as ok.
		{"unknown store", "store: mongo\n", nil, `store "mongo": want memory or redis`},
		// Held bodies that could never be held: a body larger than the
		// budget, or than one sandbox's share of it.
		{"held body above the budget", "max_held_body: 8388608\nheld_body_budget: 4194304\n", nil, "max_held_body (8388608 bytes) is above held_body_budget (4194304 bytes)"},
		{"held body above the default budget", "", []string{"--max-held-body", "104857600"}, "max_held_body (104857600 bytes) is above held_body_budget (67108864 bytes)"},
		{"share below a held body", "held_body_per_sandbox: 1048576\n", nil, "held_body_per_sandbox (1048576 bytes) is below max_held_body (4194304 bytes)"},
		// serve's start would fail to open it: check must not say ok.
		{"access log in a missing directory", "access_log:\n  path: " + dir + "/none/access.log\n", nil, "access.log"},
		// serve's listen would refuse it: check must not say ok.
		{"port-less http address", "", []string{"--http-addr", "localhost"}, `http_addr "localhost"`},
		// serve's second bind would fail (or, with reuse_port, share the
		// traffic port with the admin API): check must not say ok.
		{"traffic and admin on one address", "", []string{"--http-addr", "127.0.0.1:8081", "--admin-addr", "127.0.0.1:8081"}, "are the same address"},
		// serve's bind would fail: foreign (a documentation address) is no
		// address of this machine, as a node's http_addr copied to another
		// node.
		{"http address not on this machine", "", []string{"--http-addr", foreign + ":8081"}, `http_addr "` + foreign + `:8081": ` + foreign + ` cannot be bound on this machine`},
		{"https address not on this machine", "https_addr: " + foreign + ":8443\ntls:\n  source: files\n  cert_file: " + dir + "/none.pem\n  key_file: " + dir + "/none.key\n", nil, `https_addr "` + foreign + `:8443": ` + foreign + ` cannot be bound`},
		{"admin address not on this machine", "admin_token: " + strings.Repeat("a", 32) + "\n", []string{"--admin-addr", foreign + ":8082"}, `admin_addr "` + foreign + `:8082": ` + foreign + ` cannot be bound`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := writeTemp(t, t.TempDir(), "cubeproxy.yaml", "http_addr: 127.0.0.1:0\nadmin_addr: 127.0.0.1:0\n"+tc.yaml)
			code, stdout, stderr := runCheck(t, noEnv, append([]string{"--config", cfg}, tc.args...)...)
			want := 1
			if tc.name == "bad duration flag" {
				want = 2
			}
			if code != want || !strings.Contains(stderr, tc.want) || stdout != "" {
				t.Errorf("exit %d (want %d), stderr %q (want %q in it), stdout %q", code, want, stderr, tc.want, stdout)
			}
		})
	}
}

// Secrets never reach check's output: the admin token, signing keys,
// Redis passwords (the URL's too), the DNS provider's TSIG secret, and the
// routes file's traffic tokens. Redis is named but never contacted.
func TestCheckRedactsSecrets(t *testing.T) {
	redisLn, redisAddr := holdAddr(t)
	const (
		adminToken = "admin-secret-5f1c"
		signingKey = "signing-key-0123456789-0123456789-abcdef"
		redisPass  = "redis-pass-77e2"
		urlPass    = "url-pass-91aa"
		sentPass   = "sentinel-pass-0c3d"
		tsigSecret = "dHNpZy1zZWNyZXQtdmFsdWU="
	)
	dir := t.TempDir()
	tsigFile := writeTemp(t, dir, "tsig.key", tsigSecret+"\n")
	routes := writeTemp(t, dir, "routes.yaml", "routes:\n  box:\n    HostIP: \"127.0.0.1\"\n    AllowPublicTraffic: \"false\"\n    TrafficAccessToken: \""+restrictedToken+"\"\n    \"3000\": \"3000\"\n")
	for _, tc := range []struct {
		name    string
		yaml    string
		secrets []string
		shown   []string // what the redacted output still says
	}{
		{"memory store", "routes: " + routes + "\nadmin_token: " + adminToken + "\nauth:\n  signing_keys: [" + signingKey + "]\n" +
			"https_addr: 127.0.0.1:0\ntls:\n  source: acme\n  domain: cube.test\n  acme:\n    email: ops@cube.test\n    storage_dir: " + dir +
			"\n    dns:\n      provider: rfc2136\n      options: {server: \"127.0.0.1:53\", key_name: tsig.cube.test., key_secret: \"" + tsigSecret + "\"}\n",
			[]string{adminToken, signingKey, tsigSecret, restrictedToken},
			[]string{"admin_token: REDACTED", "- REDACTED", "key_secret: REDACTED", "key_name: tsig.cube.test.", "1 routes in"}},
		// A secret's file is no secret: its path is what an operator
		// checks (is it the mounted one?), and the secret stays in it.
		{"dns secret from a file", "https_addr: 127.0.0.1:0\ntls:\n  source: acme\n  domain: cube.test\n  acme:\n    email: ops@cube.test\n    storage_dir: " + dir +
			"\n    dns:\n      provider: rfc2136\n      options: {server: \"127.0.0.1:53\", key_name: tsig.cube.test., key_secret_file: \"" + tsigFile + "\"}\n",
			[]string{tsigSecret},
			[]string{"key_secret_file: " + tsigFile}},
		// A redis.password next to the URL's would never be sent, and is
		// refused: the sentinel row shows redis.password redacted.
		{"redis store", "store: redis\nredis:\n  url: redis://proxy:" + urlPass + "@" + redisAddr + "/2\n",
			[]string{urlPass},
			[]string{"redis://proxy:REDACTED@" + redisAddr + "/2", "redis store (not contacted)"}},
		// redis-cli -u reads a lone name as the password: it is hidden too.
		{"redis url with a lone name", "store: redis\nredis:\n  url: redis://" + urlPass + "@" + redisAddr + "/2\n",
			[]string{urlPass},
			[]string{"redis://REDACTED@" + redisAddr + "/2", "redis store (not contacted)"}},
		// A sentinel password is read only with a master name.
		{"redis sentinel store", "store: redis\nredis:\n  password: " + redisPass +
			"\n  sentinel:\n    master_name: m\n    addrs: [\"" + redisAddr + "\"]\n    password: " + sentPass + "\n",
			[]string{redisPass, sentPass},
			[]string{"password: REDACTED", "redis store (not contacted)"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := writeTemp(t, t.TempDir(), "cubeproxy.yaml", "http_addr: 127.0.0.1:0\nadmin_addr: 127.0.0.1:0\n"+tc.yaml)
			code, stdout, stderr := runCheck(t, noEnv, "--config", cfg)
			if code != 0 {
				t.Fatalf("exit %d\n%s", code, stderr)
			}
			for _, s := range tc.secrets {
				if strings.Contains(stdout+stderr, s) {
					t.Errorf("secret %q in the output:\n%s\n%s", s, stdout, stderr)
				}
			}
			for _, s := range tc.shown {
				if !strings.Contains(stdout+stderr, s) {
					t.Errorf("output lacks %q:\n%s\n%s", s, stdout, stderr)
				}
			}
		})
	}
	noConnection(t, redisLn, "Redis")
}

// check judges the OTEL_* tracing variables as serve does: it refuses
// what serve's start refuses (an exporter, protocol or sampler the proxy
// does not support), and passes what serve starts with (a bad sampler
// argument while tracing is off, which nothing reads). It used to check
// the sample ratio alone, in both cases.
func TestCheckJudgesTelemetryAsServe(t *testing.T) {
	vars := []string{"OTEL_SDK_DISABLED", "OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_TRACES_SAMPLER", "OTEL_TRACES_SAMPLER_ARG",
		"OTEL_EXPORTER_OTLP_ENDPOINT"}
	for _, tc := range []struct {
		name   string
		env    map[string]string
		refuse string // in both errors; "" when both accept
	}{
		{"tracing off", nil, ""},
		{"unsupported exporter", map[string]string{"OTEL_TRACES_EXPORTER": "zipkin"}, `OTEL_TRACES_EXPORTER="zipkin"`},
		{"unsupported sampler", map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_TRACES_SAMPLER": "jaeger_remote"}, `OTEL_TRACES_SAMPLER="jaeger_remote"`},
		{"unsupported protocol", map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, `"http/json"`},
		{"sampler argument out of range", map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_TRACES_SAMPLER_ARG": "2"}, `OTEL_TRACES_SAMPLER_ARG="2"`},
		{"sampler argument unread while tracing is off", map[string]string{"OTEL_TRACES_SAMPLER_ARG": "2"}, ""},
		{"SDK disabled", map[string]string{"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "zipkin"}, ""},
		// Both used to start, and every export failed: "no Host in request URL".
		{"endpoint without its scheme", map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_ENDPOINT": "collector:4318"}, `OTEL_EXPORTER_OTLP_ENDPOINT="collector:4318"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, k := range vars {
				t.Setenv(k, tc.env[k]) // serve's telemetry reads the process environment
			}
			args := []string{"--http-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0", "--routes="}
			cfg, err := config.LoadCommand("cubeproxy serve", nil, args, os.Getenv, io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			a, serveErr := build(context.Background(), cfg, io.Discard, io.Discard)
			if serveErr == nil {
				a.close()
			}
			code, _, stderr := runCheck(t, os.Getenv, args...)
			if tc.refuse == "" {
				if serveErr != nil || code != 0 {
					t.Errorf("serve: %v; check: exit %d %s; want both to accept", serveErr, code, stderr)
				}
				return
			}
			if serveErr == nil || !strings.Contains(serveErr.Error(), tc.refuse) || code != 1 || !strings.Contains(stderr, tc.refuse) {
				t.Errorf("serve: %v; check: exit %d %s; want both to refuse, naming %s", serveErr, code, stderr, tc.refuse)
			}
		})
	}
}

// check prints the certificate source serve resolves an unset tls.source
// to (files when certificate files are named, else self_signed), not an
// empty one that leaves the operator to know the rule; without an HTTPS
// listener there is no source to resolve. The output loads again.
func TestCheckPrintsTheTLSSourceInEffect(t *testing.T) {
	dir := t.TempDir()
	ca := testenv.NewCA(t, "check CA")
	ca.WritePair(t, filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem"), "*.cube.test")
	files := "\n  cert_file: " + filepath.Join(dir, "cert.pem") + "\n  key_file: " + filepath.Join(dir, "key.pem")
	for _, tc := range []struct{ name, yaml, want string }{
		{"no files", "https_addr: 127.0.0.1:0\ntls:\n  domain: cube.test\n", "self_signed"},
		{"files named", "https_addr: 127.0.0.1:0\ntls:" + files + "\n", "files"},
		{"set", "https_addr: 127.0.0.1:0\ntls:\n  source: files" + files + "\n", "files"},
		{"no HTTPS listener", "tls:\n  domain: cube.test\n", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := writeTemp(t, t.TempDir(), "cubeproxy.yaml", "http_addr: 127.0.0.1:0\nadmin_addr: 127.0.0.1:0\n"+tc.yaml)
			code, stdout, stderr := runCheck(t, noEnv, "--config", cfg)
			if code != 0 {
				t.Fatalf("exit %d\nstderr: %s", code, stderr)
			}
			var got struct {
				TLS struct {
					Source string `yaml:"source"`
				} `yaml:"tls"`
			}
			if err := yaml.Unmarshal([]byte(stdout), &got); err != nil {
				t.Fatalf("stdout is not YAML: %v\n%s", err, stdout)
			}
			if got.TLS.Source != tc.want {
				t.Errorf("tls.source %q, want %q", got.TLS.Source, tc.want)
			}
			// Its defaults are the source's own: what check prints loads
			// again (config refuses a setting the source leaves unread).
			again := writeTemp(t, t.TempDir(), "effective.yaml", stdout)
			if code, _, stderr := runCheck(t, noEnv, "--config", again); code != 0 {
				t.Errorf("its own output: exit %d\n%s\n%s", code, stderr, stdout)
			}
		})
	}
}

// notOnThisMachine returns a documentation address (RFC 5737) that no
// interface of this machine has: the test's own VM may own one of them
// (this one had 192.0.2.2), and a bind to an owned address succeeds.
func notOnThisMachine(t *testing.T) string {
	t.Helper()
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatalf("interface addresses: %v", err)
	}
	owned := map[string]bool{}
	for _, a := range addrs {
		if p, ok := a.(*net.IPNet); ok {
			owned[p.IP.String()] = true
		}
	}
	for _, c := range []string{"192.0.2.1", "198.51.100.1", "203.0.113.1", "192.0.2.201"} {
		if !owned[c] {
			return c
		}
	}
	t.Fatal("this machine owns every documentation address the test could use")
	return ""
}

// A bad percent escape in OTEL_RESOURCE_ATTRIBUTES is kept as sent, with a
// warning (README, Traces): check says it as its other notes, where the
// OTel SDK's default handler printed a bare time-stamped line on the
// process's own stderr.
func TestCheckNotesOTelWarnings(t *testing.T) {
	t.Setenv("OTEL_RESOURCE_ATTRIBUTES", "team=a%zz")
	routes := writeTemp(t, t.TempDir(), "routes.yaml", "routes: {}\n")
	code, _, stderr := runCheck(t, noEnv, "--routes", routes)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	if want := `cubeproxy: note: telemetry: invalid URL escape "%zz" (serve logs this as a warning and starts)`; !strings.Contains(stderr, want) {
		t.Errorf("check's stderr has no %q:\n%s", want, stderr)
	}
}

// A check that passes still names a misspelled CUBEPROXY_* variable, as
// serve's start warns of it: a check run before a restart is where an
// operator learns that the setting meant was never read.
func TestCheckNamesUnknownEnv(t *testing.T) {
	t.Setenv("CUBEPROXY_ROUTE", "/etc/cubeproxy/routes.yaml")
	code, _, stderr := runCheck(t, noEnv, "--http-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0", "--routes=")
	const note = "cubeproxy: note: CUBEPROXY_ROUTE is not a setting and was ignored; did you mean CUBEPROXY_ROUTES?"
	if code != 0 || !strings.Contains(stderr, note) {
		t.Errorf("exit %d, stderr:\n%s\nwant 0 and %q", code, stderr, note)
	}
}

// Without instance_id, check prints the name serve takes instead, the
// hostname, which the registry and telemetry carry: an empty
// instance_id said nothing of what this node would be called.
func TestCheckPrintsTheInstanceIDInEffect(t *testing.T) {
	host, err := os.Hostname()
	if err != nil || host == "" {
		t.Skipf("no hostname: %v", err)
	}
	code, stdout, stderr := runCheck(t, noEnv, "--http-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0", "--routes=")
	var eff struct {
		InstanceID string `yaml:"instance_id"`
	}
	if code != 0 || yaml.Unmarshal([]byte(stdout), &eff) != nil || eff.InstanceID != host {
		t.Errorf("exit %d, instance_id %q, want %q\n%s\n%s", code, eff.InstanceID, host, stdout, stderr)
	}
}

// Where traces are off, check says beside telemetry.trace_sample_ratio
// that it is not used, and which variable turns them off: it printed 0.01
// under OTEL_TRACES_SAMPLER=always_off as if 1 % of requests were traced.
// With traces on the line is bare, and the output loads again either way.
func TestCheckSaysTheSampleRatioIsUnusedWhenTracesAreOff(t *testing.T) {
	for _, tc := range []struct {
		name string
		env  map[string]string
		line string // telemetry.trace_sample_ratio's line
	}{
		{"no exporter", nil, "  trace_sample_ratio: 0.01 # not used: traces are off (OTEL_TRACES_EXPORTER unset)"},
		{"sampler always_off", map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_TRACES_SAMPLER": "always_off"},
			"  trace_sample_ratio: 0.01 # not used: traces are off (OTEL_TRACES_SAMPLER=always_off)"},
		{"sampler parentbased_always_off", map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_TRACES_SAMPLER": "parentbased_always_off"},
			"  trace_sample_ratio: 0.01 # not used: traces are off (OTEL_TRACES_SAMPLER=parentbased_always_off)"},
		{"SDK disabled", map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_SDK_DISABLED": "true"},
			"  trace_sample_ratio: 0.01 # not used: traces are off (OTEL_SDK_DISABLED=true)"},
		{"traces on", map[string]string{"OTEL_TRACES_EXPORTER": "otlp"}, "  trace_sample_ratio: 0.01"},
		{"traces on, argument", map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_TRACES_SAMPLER_ARG": "0.25"}, "  trace_sample_ratio: 0.25"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			getenv := func(k string) string { return tc.env[k] }
			code, out, stderr := runCheck(t, getenv, "--routes=")
			if code != 0 {
				t.Fatalf("exit %d: %s", code, stderr)
			}
			if !strings.Contains(out, "\n"+tc.line+"\n") {
				t.Errorf("output %s\nwant the line %q", out, tc.line)
			}
			file := writeTemp(t, t.TempDir(), "printed.yaml", out)
			if code, again, stderr := runCheck(t, getenv, "--config", file); code != 0 || again != out {
				t.Errorf("printed output: exit %d, %s; output again\n%s\nwant 0 and\n%s", code, stderr, again, out)
			}
		})
	}
}
