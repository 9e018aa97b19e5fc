package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// serveStart starts serve with args and env as the binary would and
// returns its start's error, or nil once it listened (it is then stopped).
func serveStart(t *testing.T, args []string, getenv func(string) string) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var logs bytes.Buffer
	listened := false
	err := serve(ctx, args, getenv, &logs, &logs, func(*app) { listened = true; cancel() })
	if err == nil && !listened {
		t.Fatalf("serve %v neither listened nor failed in 60s\n%s", args, logs.String())
	}
	return err
}

// check and serve agree on every shipped configuration: each is taken
// as an operator would first run it (secrets from the environment, a
// listener moved to a free port), and check refuses exactly what serve's
// start refuses, with the message serve exits with, and passes what serve
// starts with. check is the proxy's nginx -t: a check that passes before
// a restart that then fails is worse than none.
func TestCheckAgreesWithServeOnShippedConfigs(t *testing.T) {
	dir := t.TempDir()
	redis := testenv.StartRedis(t)
	sentinel := testenv.StartSentinel(t, "cube-routes", redis.Addr())
	// The TLS example names its certificate files relative to the
	// working directory, as run from the repository's root.
	ca := testenv.NewCA(t, "shipped configs CA")
	os.MkdirAll(filepath.Join(dir, "certs"), 0o755)
	ca.WritePair(t, filepath.Join(dir, "certs", "cube.test.pem"), filepath.Join(dir, "certs", "cube.test-key.pem"), "*.cube.test")
	configs, err := filepath.Abs("../../configs")
	if err != nil {
		t.Fatal(err)
	}
	local := []string{"--http-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0"}
	admin := map[string]string{"CUBEPROXY_ADMIN_TOKEN": strings.Repeat("a", 32)}
	with := func(base map[string]string, kv ...string) map[string]string {
		m := map[string]string{}
		for k, v := range base {
			m[k] = v
		}
		for i := 0; i+1 < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return m
	}
	accessLog := filepath.Join(dir, "access.log")
	for _, tc := range []struct {
		name   string
		config string
		args   []string
		env    map[string]string // CUBEPROXY_* (getenv) and OTEL_* (process environment)
		wd     string            // working directory; "" the package's
		refuse string            // in both errors; "" when both start
	}{
		{"cubeproxy.yaml", "cubeproxy.yaml", append(local, "--routes", filepath.Join(configs, "routes.yaml")), nil, "", ""},
		// serve builds the telemetry resource, and refuses to start on
		// it, whether tracing is on or off; check used to pass it.
		{"cubeproxy.yaml, malformed OTEL_RESOURCE_ATTRIBUTES", "cubeproxy.yaml", local,
			map[string]string{"OTEL_RESOURCE_ATTRIBUTES": "team"}, "", "OTEL_RESOURCE_ATTRIBUTES"},
		// A bad percent escape is no refusal: the SDK keeps the value as
		// sent and reports it (a warning), as the README says.
		{"cubeproxy.yaml, OTEL_RESOURCE_ATTRIBUTES with a bad escape", "cubeproxy.yaml", append(local, "--routes", filepath.Join(configs, "routes.yaml")),
			map[string]string{"OTEL_RESOURCE_ATTRIBUTES": "team=a%zz"}, "", ""},
		// The probe file's random name was in the message: check's
		// never matched serve's.
		{"cubeproxy.yaml, persist_routes into a missing directory", "cubeproxy.yaml",
			append(local, "--persist-routes", "--routes", filepath.Join(dir, "none", "routes.yaml")), nil, "",
			"persist_routes: routes file " + filepath.Join(dir, "none", "routes.yaml") + " cannot be rewritten: cannot create a file in " + filepath.Join(dir, "none") + ": no such file or directory"},
		// A value from the environment is named with its variable, in
		// the binary's own checks as in config's.
		{"cubeproxy.yaml, log_level from the environment", "cubeproxy.yaml", local,
			map[string]string{"CUBEPROXY_LOG_LEVEL": "loud"}, "", `log_level "loud": want debug, info, warn or error (slog: level string "loud": unknown name) (log_level is set by CUBEPROXY_LOG_LEVEL)`},
		{"cubeproxy.redis.yaml as shipped: no admin token", "cubeproxy.redis.yaml", nil, nil, "", "no admin token is configured"},
		// Its access log's directory does not exist here (a container
		// without the volume): both refuse, naming the path.
		{"cubeproxy.redis.yaml, access log directory missing", "cubeproxy.redis.yaml", append(local, "--redis-addr", redis.Addr()),
			with(admin, "CUBEPROXY_ACCESS_LOG_PATH", filepath.Join(dir, "none", "access.log")), "", `open access log ` + filepath.Join(dir, "none", "access.log") + `: `},
		{"cubeproxy.redis.yaml", "cubeproxy.redis.yaml", append(local, "--redis-addr", redis.Addr()),
			with(admin, "CUBEPROXY_ACCESS_LOG_PATH", accessLog), "", ""},
		{"cubeproxy.sentinel.yaml as shipped: no admin token", "cubeproxy.sentinel.yaml", nil, nil, "", "no admin token is configured"},
		{"cubeproxy.sentinel.yaml", "cubeproxy.sentinel.yaml", local,
			with(admin, "CUBEPROXY_REDIS_SENTINEL_ADDRS", sentinel.Addr()), "", ""},
		{"cubeproxy.tls.yaml without its certificate files", "cubeproxy.tls.yaml", append(local, "--https-addr", "127.0.0.1:0"), nil, "",
			"tls certificates: tls.files[0].cert_file: stat certs/cube.test.pem: no such file or directory"},
		{"cubeproxy.tls.yaml", "cubeproxy.tls.yaml", append(local, "--https-addr", "127.0.0.1:0"), nil, dir, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.wd != "" {
				t.Chdir(tc.wd)
			}
			for _, k := range []string{"OTEL_RESOURCE_ATTRIBUTES"} {
				t.Setenv(k, tc.env[k]) // telemetry reads the process environment
			}
			getenv := func(k string) string { return tc.env[k] }
			args := append([]string{"--config", filepath.Join(configs, tc.config)}, tc.args...)

			serveErr := serveStart(t, args, getenv)
			code, _, stderr := runCheck(t, getenv, args...)
			if tc.refuse == "" {
				if serveErr != nil || code != 0 {
					t.Fatalf("serve: %v; check: exit %d %s; want both to start", serveErr, code, stderr)
				}
				return
			}
			if serveErr == nil || !strings.Contains(serveErr.Error(), tc.refuse) {
				t.Fatalf("serve: %v; want it to refuse, naming %q", serveErr, tc.refuse)
			}
			if code != 1 || !strings.Contains(stderr, "cubeproxy: "+serveErr.Error()+"\n") {
				t.Errorf("check: exit %d, stderr:\n%s\nwant 1 and serve's message: cubeproxy: %v", code, stderr, serveErr)
			}
		})
	}
}

// A listener that cannot open names the flag that set its address, as a
// refused setting does: the port is only found taken by serve.
func TestServeNamesTheOriginOfAnAddressInUse(t *testing.T) {
	_, taken := holdAddr(t)
	err := serveStart(t, []string{"--admin-addr", "127.0.0.1:0", "--routes", "", "--http-addr", taken}, func(string) string { return "" })
	if err == nil || !strings.HasSuffix(err.Error(), "address already in use (another process listens there: stop it, or choose another address with --http-addr or CUBEPROXY_HTTP_ADDR) (http_addr is set by --http-addr)") {
		t.Fatalf("serve: %v; want the address's flag named", err)
	}
}
