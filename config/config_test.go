package config

import (
	"errors"
	"flag"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

// Load is LoadCommand for serve, with -h showing Default's values: the
// tests' shorthand.
func Load(args []string, getenv func(string) string, out io.Writer) (*Config, error) {
	return LoadCommand("cubeproxy serve", nil, args, getenv, out)
}

func writeFile(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "cubeproxy.yaml")
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func env(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

// loadWants loads a config file of yaml and wants it to load (want "") or
// to fail with an error containing want.
func loadWants(t *testing.T, yaml, want string) {
	t.Helper()
	_, err := Load([]string{"--config", writeFile(t, yaml)}, env(nil), io.Discard)
	if want == "" {
		if err != nil {
			t.Fatalf("Load: %v", err)
		}
		return
	}
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("Load = %v; want an error containing %q", err, want)
	}
}

func TestPrecedenceFlagsOverEnvOverFile(t *testing.T) {
	file := writeFile(t, "http_addr: ':1001'\nadmin_addr: '127.0.0.1:2001'\nnode_ip: 10.0.0.1\nupstream:\n  connect_timeout: 5s\ndomains: [a.test]\n")
	for _, tc := range []struct {
		name  string
		args  []string
		env   map[string]string
		check func(*Config) bool
	}{
		{"file", []string{"--config", file}, nil, func(c *Config) bool {
			return c.HTTPAddr == ":1001" && c.NodeIP == "10.0.0.1" && c.Upstream.ConnectTimeout == 5*time.Second && reflect.DeepEqual(c.Domains, []string{"a.test"})
		}},
		{"env over file", []string{"--config", file}, map[string]string{"CUBEPROXY_HTTP_ADDR": ":1002", "CUBEPROXY_UPSTREAM_CONNECT_TIMEOUT": "7s", "CUBEPROXY_DOMAINS": "b.test, c.test"}, func(c *Config) bool {
			return c.HTTPAddr == ":1002" && c.Upstream.ConnectTimeout == 7*time.Second && reflect.DeepEqual(c.Domains, []string{"b.test", "c.test"}) && c.NodeIP == "10.0.0.1"
		}},
		{"flag over env", []string{"--config", file, "--http-addr", ":1003", "--upstream-connect-timeout=9s"}, map[string]string{"CUBEPROXY_HTTP_ADDR": ":1002"}, func(c *Config) bool {
			return c.HTTPAddr == ":1003" && c.Upstream.ConnectTimeout == 9*time.Second
		}},
		{"config path from env", nil, map[string]string{"CUBEPROXY_CONFIG": file}, func(c *Config) bool { return c.HTTPAddr == ":1001" }},
		{"defaults", nil, nil, func(c *Config) bool {
			return c.HTTPAddr == ":8081" && c.AdminAddr == "127.0.0.1:8082" && c.Store == "memory" && c.LogFormat == "json" &&
				c.Routes == "configs/routes.yaml"
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Load(tc.args, env(tc.env), io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			if !tc.check(c) {
				t.Fatalf("unexpected config: %+v", c)
			}
		})
	}
}

// A word after a boolean flag that is no boolean value is a stray
// argument like any other: the "=" hint would suggest --reuse-port=extra,
// which the flag refuses.
func TestStrayArgumentAfterBooleanFlag(t *testing.T) {
	for _, args := range [][]string{
		{"--reuse-port", "extra"},
		{"--reuse-port=true", "false"},
	} {
		_, err := Load(args, env(nil), io.Discard)
		if err == nil || err.Error() != `unexpected argument "`+args[1]+`"` {
			t.Errorf("Load(%q) = %v, want only %q named", args, err, args[1])
		}
	}
}

func TestLoadErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		env  map[string]string
		want string
	}{
		{"unknown yaml key", []string{"--config", writeFile(t, "http_adr: ':1'\n")}, nil, "line 1: unknown key http_adr (did you mean http_addr?)"},
		// Only the first document was read: the rest was ignored.
		{"second yaml document", []string{"--config", writeFile(t, "http_addr: ':1'\n---\nhttp_addr: ':2'\n")}, nil, "line 3: another YAML document"},
		{"third yaml document", []string{"--config", writeFile(t, "http_addr: ':1'\n---\n---\nstore: redis\n")}, nil, "line 4: another YAML document"},
		{"bad yaml duration", []string{"--config", writeFile(t, "drain_timeout: soon\n")}, nil, "line 1: drain_timeout: want a duration with its unit (30s, 5m, 2h), got `soon`"},
		{"bad env duration", nil, map[string]string{"CUBEPROXY_DRAIN_TIMEOUT": "soon"}, "CUBEPROXY_DRAIN_TIMEOUT"},
		// A number without its unit says what is missing, as the file's error does.
		{"flag duration without unit", []string{"--drain-timeout", "30"}, nil,
			`invalid value "30" for flag -drain-timeout: invalid duration "30": want a duration with its unit (30s, 5m, 2h)`},
		{"env duration without unit", nil, map[string]string{"CUBEPROXY_UPSTREAM_CONNECT_TIMEOUT": "3"},
			`CUBEPROXY_UPSTREAM_CONNECT_TIMEOUT: invalid duration "3": want a duration with its unit (30s, 5m, 2h)`},
		{"bad flag int", []string{"--max-request-body", "big"}, nil, "invalid integer"},
		// Each says what would do, as the file's errors do.
		{"env size with a unit", nil, map[string]string{"CUBEPROXY_MAX_REQUEST_BODY": "256MiB"}, `CUBEPROXY_MAX_REQUEST_BODY: invalid integer "256MiB": want a whole number in decimal digits`},
		{"env port list entry", nil, map[string]string{"CUBEPROXY_AUTH_EXEMPT_PORTS": "80,https"}, `CUBEPROXY_AUTH_EXEMPT_PORTS: invalid integer "https": want whole numbers, comma-separated (80,443)`},
		{"flag ratio", []string{"--telemetry-trace-sample-ratio=half"}, nil, `invalid number "half": want a number such as 0.25`},
		{"unknown flag", []string{"--nope"}, nil, "flag provided but not defined"},
		// The YAML key's spelling, or a typo: the flag meant is named.
		{"flag spelled as its key", []string{"--http_addr", ":1"}, nil, "flag provided but not defined: -http_addr (did you mean --http-addr?)"},
		{"flag with a typo", []string{"--upstream-conect-timeout=1s"}, nil, "(did you mean --upstream-connect-timeout?)"},
		{"missing file", []string{"--config", "/nonexistent/cubeproxy.yaml"}, nil, "read config"},
		// Named by a variable (the image sets it), not by a flag typed: say which.
		{"missing file named by the environment", nil, map[string]string{"CUBEPROXY_CONFIG": "/nonexistent/cubeproxy.yaml"},
			"CUBEPROXY_CONFIG: read config: stat /nonexistent/cubeproxy.yaml"},
		{"bad file named by the environment", nil, map[string]string{"CUBEPROXY_CONFIG": writeFile(t, "http_adr: ':1'\n")},
			"CUBEPROXY_CONFIG: config "},
		{"stray argument", []string{"extra"}, nil, "unexpected argument"},
		// A boolean flag's value given after a space is a stray argument:
		// say how to give it.
		{"boolean flag value after a space", []string{"--reuse-port", "false"}, nil,
			`unexpected argument "false": --reuse-port is a boolean flag and takes its value after "=" (--reuse-port=false)`},
		{"boolean flag value after a space, single dash", []string{"-registry-enabled", "on", "--store", "redis"}, nil,
			`--registry-enabled is a boolean flag and takes its value after "=" (--registry-enabled=on)`},
		// Values that would start a proxy failing every request.
		{"negative connect timeout", []string{"--upstream-connect-timeout=-1s"}, nil, "upstream.connect_timeout: -1s is negative"},
		{"negative max conns", nil, map[string]string{"CUBEPROXY_UPSTREAM_MAX_CONNS": "-1"}, "upstream.max_conns: -1 is negative"},
		{"negative body limit in yaml", []string{"--config", writeFile(t, "max_request_body: -1\n")}, nil, "max_request_body: -1 is negative"},
		// Only max_held_body and held_body_per_sandbox have an "off", and
		// the refusal says so: -1 is how an operator writes "none".
		{"negative held body budget", []string{"--held-body-budget=-1"}, nil, "held_body_budget: -1 is negative; to hold no body, set max_held_body to -1"},
		{"negative client timeout", []string{"--client-read-timeout=-5s"}, nil, "client.read_timeout: -5s is negative"},
		{"negative redis pool", []string{"--redis-pool-size=-2"}, nil, "redis.pool_size: -2 is negative"},
		// now+ttl would wrap: the cache would store every route expired.
		{"cache ttl beyond a year", []string{"--cache-ttl-min=2562047h", "--cache-ttl-max=2562047h"}, nil, "cache.ttl_min: 2562047h0m0s is above 8760h0m0s"},
		// A unit slip: every request would fail (504, 408, a closed
		// connection), or an interval spin.
		{"connect timeout below a millisecond", []string{"--config", writeFile(t, "upstream:\n  connect_timeout: 3us\n")}, nil, "upstream.connect_timeout: 3µs is below 1ms, the shortest duration the proxy takes (0 means the default)"},
		{"heartbeat below a millisecond", nil, map[string]string{"CUBEPROXY_UPSTREAM_HEARTBEAT_INTERVAL": "1ns"}, "upstream.heartbeat_interval: 1ns is below 1ms"},
		{"client read timeout below a millisecond", []string{"--client-read-timeout=999us"}, nil, "client.read_timeout: 999µs is below 1ms"},
		// Shown in healthz, the registry and traces as a name.
		{"blank instance id", []string{"--config", writeFile(t, "instance_id: ' '\n")}, nil, `instance_id " " is blank`},
		{"instance id with a newline", []string{"--config", writeFile(t, "instance_id: \"proxy-1\\n\"\n")}, nil, `instance_id "proxy-1\n" has blanks around it or a control character`},
		{"instance id with a control character", []string{"--instance-id=a\x01b"}, nil, `instance_id "a\x01b" has blanks around it`},
		{"instance id starting with a control character", []string{"--instance-id=\x1bb"}, nil, `instance_id "\x1bb" has blanks around it`},
		// Paths and Redis names are taken with their blanks: the routes
		// file was not found, and the proxy started with an empty table.
		{"routes path with a trailing blank", []string{"--config", writeFile(t, "routes: 'configs/routes.yaml '\n")}, nil, `routes "configs/routes.yaml " has blanks around it`},
		{"access log path with a newline", nil, map[string]string{"CUBEPROXY_ACCESS_LOG_PATH": "/var/log/access.log\n"}, `access_log.path "/var/log/access.log\n" has blanks around it`},
		{"redis key prefix with a leading blank", []string{"--store=redis", "--redis-addr=r:6379", "--redis-key-prefix= cube:"}, nil, `redis.key_prefix " cube:" has blanks around it`},
		{"tls file list entry with a trailing blank", []string{"--config", writeFile(t, "https_addr: ':8443'\ntls:\n  files:\n    - cert_file: 'a.pem '\n      key_file: a-key.pem\n")}, nil, `tls.files[0].cert_file "a.pem " has blanks around it`},
		// The options map is read as written: a server with a blank was
		// dialed, and a key name with one sent, only at the first order,
		// after the proxy listened, and every issuance failed. Not quoted:
		// the options may hold a secret.
		{"dns server option with a leading blank", []string{"--config", writeFile(t, acmeDNSOptions("server: ' 127.0.0.1:53'"))}, nil,
			"tls.acme.dns.options.server has blanks around it (not shown: the options may hold a secret)"},
		{"dns key name option with a trailing blank", []string{"--config", writeFile(t, acmeDNSOptions("server: 127.0.0.1:53\n        key_name: 'tsig.cube.test. '"))}, nil,
			"tls.acme.dns.options.key_name has blanks around it"},
		{"redis command timeout beyond a year", nil, map[string]string{"CUBEPROXY_REDIS_COMMAND_TIMEOUT": "1000000h"}, "redis.command_timeout: 1000000h0m0s is above 8760h0m0s"},
		{"sample ratio above 1", []string{"--telemetry-trace-sample-ratio=2"}, nil, "telemetry.trace_sample_ratio: 2 is not a fraction"},
		{"sample ratio NaN", []string{"--telemetry-trace-sample-ratio=NaN"}, nil, "telemetry.trace_sample_ratio: NaN is not a fraction"},
		{"empty admin address", []string{"--admin-addr="}, nil, "admin_addr is empty"},
		{"misspelled tls source without https", []string{"--tls-source=acm"}, nil, `tls.source "acm": want self_signed, files or acme`},
		// A secret left as a reference nothing expanded would work, and
		// be a string anyone can guess.
		{"admin token as ${VAR} in yaml", []string{"--config", writeFile(t, "admin_token: ${CUBEPROXY_ADMIN_TOKEN}\n")}, nil,
			"admin_token has the shape of a reference to an environment variable"},
		{"admin token as unresolved kubernetes $(VAR)", nil, map[string]string{"CUBEPROXY_ADMIN_TOKEN": "$(ADMIN_TOKEN)"},
			"admin_token has the shape of a reference to an environment variable"},
		{"signing key as $VAR", []string{"--config", writeFile(t, "auth:\n  signing_keys: [$CUBEPROXY_SIGNING_KEY_NUMBER_ONE_X]\n")}, nil,
			"auth.signing_keys: entry 1 has the shape of a reference to an environment variable"},
		{"signing key with a trailing newline", []string{"--config", writeFile(t, "auth:\n  signing_keys: [\"0123456789abcdef0123456789abcdef\\n\"]\n")}, nil,
			"auth.signing_keys: entry 1 has blanks around it (not shown: a secret)"},
		// Only the admin API would listen: ready, and no sandbox reachable.
		{"no traffic listener", []string{"--http-addr="}, nil, "http_addr and https_addr are both empty"},
		{"no traffic listener in yaml", []string{"--config", writeFile(t, "http_addr: ''\nhttps_addr: ''\n")}, nil, "http_addr and https_addr are both empty"},
		// Listener addresses serve's net.Listen refuses for their form
		// alone, naming no setting (and check passed them).
		{"port-less http address", []string{"--http-addr=abc"}, nil, `http_addr "abc": address abc: missing port in address`},
		{"https port out of range", nil, map[string]string{"CUBEPROXY_HTTPS_ADDR": ":99999"}, `https_addr ":99999": port 99999 is above 65535`},
		{"admin port out of range with a token", []string{"--admin-addr=0.0.0.0:70000", "--admin-token=t0ken"}, nil, `admin_addr "0.0.0.0:70000": port 70000 is above 65535`},
		{"port-less metrics address", nil, map[string]string{"CUBEPROXY_METRICS_ADDR": "127.0.0.1"}, `metrics_addr "127.0.0.1": address 127.0.0.1: missing port in address; want host:port, for example 127.0.0.1:18082`},
		{"metrics address on the admin port", []string{"--metrics-addr=:8082"}, nil, `admin_addr "127.0.0.1:8082" and metrics_addr ":8082" are the same address`},
		// The lifecycle manager appends its paths to the announced URL.
		{"registry admin URL without a scheme", []string{"--store=redis", "--redis-addr=r:6379", "--registry-enabled", "--registry-admin-url=10.0.0.7:8082"}, nil, `registry.admin_url "10.0.0.7:8082": want an http:// or https:// URL`},
		{"registry admin URL with a query", []string{"--store=redis", "--redis-addr=r:6379", "--registry-enabled", "--registry-admin-url=http://10.0.0.7:8082/?x=1"}, nil, "may not end in a query or a fragment"},
		// url.Parse keeps no query for a bare '?' nor a fragment for a bare
		// '#': "http://h:8082/?" + "/admin/state" is a query, not a path.
		{"registry admin URL ending in a bare '?'", []string{"--store=redis", "--redis-addr=r:6379", "--registry-enabled", "--registry-admin-url=http://10.0.0.7:8082/?"}, nil, "may not end in a query or a fragment"},
		{"registry admin URL ending in a bare '#'", []string{"--store=redis", "--redis-addr=r:6379", "--registry-enabled", "--registry-admin-url=http://10.0.0.7:8082#"}, nil, "may not end in a query or a fragment"},
		{"registry admin URL with a port and no host", []string{"--store=redis", "--redis-addr=r:6379", "--registry-enabled", "--registry-admin-url=http://:8082"}, nil, "the URL names no host"},
		{"registry admin URL with credentials", []string{"--store=redis", "--redis-addr=r:6379", "--registry-enabled", "--registry-admin-url=http://u:p@10.0.0.7:8082"}, nil, "the URL carries credentials"},
		{"registry admin URL without a host", []string{"--store=redis", "--redis-addr=r:6379", "--registry-enabled", "--registry-admin-url=http:///admin"}, nil, "the URL names no host"},
		{"registry admin URL with the registry off", []string{"--store=redis", "--redis-addr=r:6379", "--registry-admin-url=http://10.0.0.7:18082"}, nil, "registry.admin_url is set but registry.enabled is off"},
		{"unknown service as port", []string{"--config", writeFile(t, "http_addr: 127.0.0.1:no-such-service\n")}, nil, `http_addr "127.0.0.1:no-such-service": port "no-such-service" is no number`},
		{"tiny client header limit", []string{"--client-max-header-size=10"}, nil, "client.max_header_size: 10 is below 1024 bytes, too small for real headers (0 means the 32 KiB default)"},
		{"tiny upstream header limit", []string{"--upstream-max-header-size=512"}, nil, "upstream.max_header_size: 512 is below 1024 bytes, too small for real headers (0 means the 16 KiB default)"},
		// Sizes whose buffer is allocated whole: the process would die
		// out of memory (at the first request, or at once).
		{"huge client header limit", []string{"--client-max-header-size=999999999999"}, nil, "client.max_header_size: 999999999999 is above 1048576 bytes"},
		{"huge upstream header limit", nil, map[string]string{"CUBEPROXY_UPSTREAM_MAX_HEADER_SIZE": "99999999999"}, "upstream.max_header_size: 99999999999 is above 1048576 bytes"},
		{"huge access log queue", []string{"--config", writeFile(t, "access_log:\n  buffer_lines: 99999999999\n")}, nil, "access_log.buffer_lines: 99999999999 is above 1048576"},
		// A Redis named for a proxy that would read the (empty) memory store.
		{"redis addr with memory store", nil, map[string]string{"CUBEPROXY_REDIS_ADDR": "10.0.0.2:6379"}, "redis.addr is set but store is memory"},
		{"redis url with memory store", []string{"--store=memory", "--redis-url=redis://r:6379/0"}, nil, "redis.url is set but store is memory"},
		{"sentinel with memory store", []string{"--config", writeFile(t, "redis:\n  sentinel:\n    master_name: m\n    addrs: [s:26379]\n")}, nil, "redis.sentinel.master_name is set but store is memory"},
		{"cluster with memory store", []string{"--redis-cluster-addrs=c1:6379,c2:6379"}, nil, "redis.cluster.addrs is set but store is memory"},
		{"registry with memory store", []string{"--registry-enabled"}, nil, "registry.enabled is set but store is memory"},
		// Certificate files the source would never read: the image's
		// config says self_signed, so HTTPS served a self-signed one.
		{"cert files with self_signed source", []string{"--config", "../configs/cubeproxy.yaml"}, map[string]string{
			"CUBEPROXY_HTTPS_ADDR": ":8080", "CUBEPROXY_TLS_CERT_FILE": "/tls/tls.crt", "CUBEPROXY_TLS_KEY_FILE": "/tls/tls.key",
		}, "tls.cert_file is set but tls.source is self_signed: set tls.source: files"},
		{"key file alone with acme source", []string{"--tls-source=acme", "--tls-key-file=/tls/tls.key"}, nil, "tls.key_file is set but tls.source is acme"},
		// Certificates with no HTTPS listener to serve them.
		{"files source without https_addr", nil, map[string]string{
			"CUBEPROXY_TLS_SOURCE": "files", "CUBEPROXY_TLS_CERT_FILE": "/tls/tls.crt", "CUBEPROXY_TLS_KEY_FILE": "/tls/tls.key",
		}, "tls.source is files but https_addr is empty"},
		{"acme source without https_addr", []string{"--config", "../configs/cubeproxy.yaml", "--tls-source=acme", "--tls-domain=sb.example.com"}, nil, "tls.source is acme but https_addr is empty"},
		{"file list with self_signed source", []string{"--config", writeFile(t, "tls:\n  source: self_signed\n  files:\n    - cert_file: a.pem\n      key_file: a-key.pem\n")}, nil, "tls.files is set but tls.source is self_signed"},
		// A pair with one half: the start failed on "open : no such file
		// or directory", naming no setting.
		{"cert file without key file", []string{"--https-addr=:8443", "--tls-cert-file=/tls/tls.crt"}, nil, "tls.cert_file is set but tls.key_file is empty"},
		{"key file without cert file", nil, map[string]string{"CUBEPROXY_HTTPS_ADDR": ":8443", "CUBEPROXY_TLS_KEY_FILE": "/tls/tls.key"}, "tls.key_file is set but tls.cert_file is empty"},
		{"file list entry without key", []string{"--config", writeFile(t, "https_addr: ':8443'\ntls:\n  files:\n    - cert_file: a.pem\n      key_file: a-key.pem\n    - cert_file: b.pem\n")}, nil, "tls.files[1].cert_file is set but tls.files[1].key_file is empty"},
		{"empty file list entry", []string{"--config", writeFile(t, "https_addr: ':8443'\ntls:\n  files:\n    - {}\n")}, nil, "tls.files[0].cert_file and tls.files[0].key_file are empty"},
		// Names that would match no Host header.
		{"shared host with port", []string{"--shared-hosts=gw.example.com:8081"}, nil, `shared_hosts: "gw.example.com:8081" is not a bare host name`},
		{"domain with scheme", []string{"--config", writeFile(t, "domains: ['https://sb.example.com']\n")}, nil, `domains: "https://sb.example.com"`},
		{"domain with empty label", []string{"--domains=sb..example.com"}, nil, `domains: "sb..example.com"`},
		{"tls domain with path", nil, map[string]string{"CUBEPROXY_TLS_DOMAIN": "sb.example.com/x"}, `tls.domain: "sb.example.com/x"`},
		// ttl_min left at its default (500s) is above this ttl_max.
		{"cache ttl max alone below default min", []string{"--cache-ttl-max=60s"}, nil, "cache.ttl_max (1m0s) is below cache.ttl_min's default (8m20s): set cache.ttl_min too"},
		{"redirect port out of range", []string{"--tls-redirect-port=70000"}, nil, "tls.redirect_port: 70000 is not a port"},
		{"cache ttl range reversed", []string{"--cache-ttl-min=700s", "--cache-ttl-max=500s"}, nil, "cache.ttl_min (11m40s) is above cache.ttl_max (8m20s)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Load(tc.args, env(tc.env), io.Discard)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want it to mention %q", err, tc.want)
			}
		})
	}
	if _, err := Load([]string{"-h"}, env(nil), io.Discard); !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("-h: %v", err)
	}
}

// Every address form net.Listen takes passes: a port of 0 or none (the
// system's choice), a service name, a bracketed IPv6 host, a name.
func TestLoadListenAddresses(t *testing.T) {
	for _, addr := range []string{":8081", "127.0.0.1:", "[::1]:0", ":http", "localhost:65535", "0.0.0.0:443"} {
		// In each key in turn: the others on ports the system chooses,
		// since one address for two listeners is refused.
		for _, key := range []string{"--http-addr", "--https-addr", "--admin-addr"} {
			args := []string{"--http-addr", ":0", "--https-addr", ":0", "--admin-addr", ":0", "--admin-token", "t0ken", key, addr}
			if _, err := Load(args, env(nil), io.Discard); err != nil {
				t.Errorf("%s %s: %v", key, addr, err)
			}
		}
	}
}

// Two listeners on one port of overlapping addresses are refused, naming
// both: with reuse_port both would bind and the kernel would hand sandbox
// traffic to the admin API (or plain HTTP to the TLS listener); without it
// the second bind failed after check had passed the file. Listeners that
// only look alike (port 0, other hosts, other ports) start.
func TestLoadListenersOverlap(t *testing.T) {
	for _, tc := range []struct {
		http, https, admin string
		want               string // "" = loads
	}{
		{"127.0.0.1:8081", "", "127.0.0.1:8081", `http_addr "127.0.0.1:8081" and admin_addr "127.0.0.1:8081" are the same address`},
		{":8081", "", "127.0.0.1:8081", `http_addr ":8081" and admin_addr "127.0.0.1:8081"`},
		{"0.0.0.0:8081", "", "[::1]:8081", `http_addr "0.0.0.0:8081" and admin_addr "[::1]:8081"`},
		{"[::]:8081", "", "127.0.0.1:8081", `http_addr "[::]:8081" and admin_addr "127.0.0.1:8081"`},
		{"127.0.0.1:8081", "", "LOCALHOST.:8081", `http_addr "127.0.0.1:8081" and admin_addr "LOCALHOST.:8081"`},
		{"[::ffff:127.0.0.1]:8081", "", "127.0.0.1:08081", `http_addr "[::ffff:127.0.0.1]:8081" and admin_addr "127.0.0.1:08081"`},
		// The IPv4 wildcard written IPv4-mapped: Go binds it as [::], and
		// with reuse_port sandbox requests to 127.0.0.1 reached the admin API.
		{"[::ffff:0.0.0.0]:8081", "", "127.0.0.1:8081", `http_addr "[::ffff:0.0.0.0]:8081" and admin_addr "127.0.0.1:8081"`},
		{":80", ":8443", "127.0.0.1:http", `http_addr ":80" and admin_addr "127.0.0.1:http"`},
		{":8080", ":8080", "127.0.0.1:8082", `http_addr ":8080" and https_addr ":8080"`},
		{"", "10.0.0.1:8443", ":8443", `https_addr "10.0.0.1:8443" and admin_addr ":8443"`},
		{"gw.example:8081", "", "gw.example:8081", `http_addr "gw.example:8081" and admin_addr "gw.example:8081"`},
		{"GW.example.:8081", "", "gw.example:8081", `http_addr "GW.example.:8081" and admin_addr "gw.example:8081"`},

		{"127.0.0.1:0", ":0", "127.0.0.1:0", ""},
		{"127.0.0.1:8081", ":8443", "127.0.0.2:8081", ""},
		{"127.0.0.1:8081", "", "[::1]:8081", ""},
		{"[::1]:8081", "", "localhost:8081", ""},
		{"gw.example:8081", "", "admin.example:8081", ""},
		{":8081", ":8080", "127.0.0.1:8082", ""},
	} {
		t.Run(tc.http+","+tc.https+","+tc.admin, func(t *testing.T) {
			args := []string{"--http-addr", tc.http, "--https-addr", tc.https, "--admin-addr", tc.admin, "--admin-token", "t0ken"}
			_, err := Load(args, env(nil), io.Discard)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("err %v, want it to mention %q", err, tc.want)
			}
		})
	}
}

// A document marker before the only document, or after it with nothing
// following, is not a second document.
func TestLoadDocumentMarkers(t *testing.T) {
	for _, body := range []string{"---\nhttp_addr: ':1'\n", "http_addr: ':1'\n---\n", "---\nhttp_addr: ':1'\n...\n", "http_addr: ':1'\n---\n# nothing more\n", "http_addr: ':1'\n---\n---\n"} {
		c, err := Load([]string{"--config", writeFile(t, body)}, env(nil), io.Discard)
		if err != nil {
			t.Fatalf("%q: %v", body, err)
		}
		if c.HTTPAddr != ":1" {
			t.Fatalf("%q: http_addr %q", body, c.HTTPAddr)
		}
	}
}

// Every spelling the parser accepts for a name still loads.
func TestLoadHostNames(t *testing.T) {
	c, err := Load([]string{"--domains=*.sb.example.com,.b.test,c.test.,x_y.test", "--shared-hosts=GW.example.com,10.0.0.5,"}, env(nil), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Domains) != 4 || len(c.SharedHosts) < 2 {
		t.Fatalf("domains %q, shared_hosts %q", c.Domains, c.SharedHosts)
	}
}

// Negative values stay allowed where they are documented to mean off.
func TestLoadNegativeMeansOff(t *testing.T) {
	c, err := Load([]string{"--upstream-heartbeat-interval=-1s", "--https-addr=:8443", "--tls-source=acme", "--tls-acme-dns-provider=rfc2136", "--tls-acme-dns-propagation-timeout=-1s",
		"--max-held-body=-1", "--held-body-per-sandbox=-1", "--stream-limit-wait=-1ms"}, env(nil), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.Upstream.HeartbeatInterval != -time.Second || c.TLS.ACME.DNS.PropagationTimeout != -time.Second {
		t.Fatalf("got %v and %v", c.Upstream.HeartbeatInterval, c.TLS.ACME.DNS.PropagationTimeout)
	}
	if c.MaxHeldBody != -1 || c.HeldBodyPerSandbox != -1 {
		t.Fatalf("max_held_body %d, held_body_per_sandbox %d; want -1 (off) each", c.MaxHeldBody, c.HeldBodyPerSandbox)
	}
	if c.StreamLimitWait != -time.Millisecond {
		t.Fatalf("stream_limit_wait %v, want -1ms (no wait)", c.StreamLimitWait)
	}
}

// Every setting is reachable by flag and env, named from its YAML path.
func TestEverySettingHasFlagAndEnv(t *testing.T) {
	var b strings.Builder
	Load([]string{"-h"}, env(nil), &b)
	usage := b.String()
	for _, s := range collect(reflect.ValueOf(Default()).Elem()) {
		if !strings.Contains(usage, "-"+s.flagName()+" ") && !strings.Contains(usage, "-"+s.flagName()+"\n") {
			t.Errorf("no flag --%s", s.flagName())
		}
		if !strings.Contains(usage, s.envName()) {
			t.Errorf("no env %s in usage", s.envName())
		}
	}
	if !strings.Contains(usage, "CUBEPROXY_UPSTREAM_HEARTBEAT_INTERVAL") {
		t.Error("nested settings must be named by their path")
	}
}

// The shipped example configuration loads.
func TestShippedConfigLoads(t *testing.T) {
	c, err := Load([]string{"--config", "../configs/cubeproxy.yaml"}, env(nil), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.Routes != "configs/routes.yaml" || c.Upstream.IdleTimeout != 7206*time.Second {
		t.Fatalf("%+v", c)
	}
}

// A key written with no value (YAML null) is left at its default by the
// decoder. Where that default is not what an empty value means, the file
// is refused, naming the key and its line: `http_addr:`, written to turn
// plain HTTP off, kept a plain-HTTP listener on :8081 without a word, and
// `routes:` went on reading configs/routes.yaml. Where both readings agree
// (an empty default, or "" read as the default) it loads as before.
func TestLoadNullValues(t *testing.T) {
	for _, tc := range []struct {
		body, want string // want: "" loads, else the error names it
	}{
		{"http_addr:\nhttps_addr: ':8080'\n", "line 1: http_addr has no value"},
		{"http_addr: ~\n", "line 1: http_addr has no value"},
		{"admin_addr: null\n", "line 1: admin_addr has no value"},
		{"log_level:\n", "line 1: log_level has no value"},
		{"store: memory\nroutes:\n", "line 2: routes has no value"},
		{"base: &none\n", "unknown key base"}, // unknown keys still come first
		{"access_log: &al\n  format: json\n", ""},
		{"http_addr: ''\nhttps_addr: ':8080'\n", ""},
		{"instance_id:\ndrain_timeout:\ndomains:\nadmin_token:\n", ""},
		{"log_format:\nstore:\naccess_log:\n  format:\n  path:\n", ""},
		{"access_log:\ntls:\n  files:\n", ""},
		{"defaults: &d\n", "unknown key defaults"},
		{"<<: [{http_addr: }]\nhttps_addr: ':8080'\n", "line 1: http_addr has no value"},
		{"cache: &c\n  size: 5\nupstream:\n  <<: [{max_conns: 3}]\n", ""},
		{"access_log:\n  <<: [{format: json}, {buffer_lines: 8}]\nhttp_addr: ':1'\ntls:\n  <<: {domain: }\n", ""},
	} {
		c, err := Load([]string{"--config", writeFile(t, tc.body)}, env(nil), io.Discard)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%q: %v", tc.body, err)
		case tc.want != "" && err == nil:
			t.Errorf("%q loaded (http_addr %q, routes %q); want an error naming %q", tc.body, c.HTTPAddr, c.Routes, tc.want)
		case tc.want != "" && !strings.Contains(err.Error(), tc.want):
			t.Errorf("%q: error %v; want one naming %q", tc.body, err, tc.want)
		}
	}
}

// --config= given empty means no file, as --routes= empties the routes
// setting: the image's CUBEPROXY_CONFIG is not read then, so that the
// environment and flags alone can configure a container.
func TestEmptyConfigFlagReadsNoFile(t *testing.T) {
	vars := map[string]string{"CUBEPROXY_CONFIG": "/nonexistent/cubeproxy.yaml", "CUBEPROXY_HTTP_ADDR": ":1234"}
	cfg, err := Load([]string{"--config="}, env(vars), io.Discard)
	if err != nil || cfg.HTTPAddr != ":1234" {
		t.Fatalf("Load --config= = %+v, %v; want the environment alone", cfg, err)
	}
	if _, err := Load(nil, env(vars), io.Discard); err == nil || !strings.Contains(err.Error(), "CUBEPROXY_CONFIG: read config") {
		t.Fatalf("Load without --config = %v; want CUBEPROXY_CONFIG's file read", err)
	}
}

// acmeDNSOptions is a configuration with an ACME source, its rfc2136
// provider given options (lines indented under options:).
func acmeDNSOptions(options string) string {
	return "https_addr: ':8443'\ntls:\n  source: acme\n  domain: cube.test\n  acme:\n    dns:\n      provider: rfc2136\n      options:\n        " + options + "\n"
}

// A key_secret keeps its line end, as a secret file's content has it:
// base64 decoding skips it, so the key worked, and refusing it would stop
// a proxy that issues certificates.
func TestDNSKeySecretWithLineEndLoads(t *testing.T) {
	loadWants(t, acmeDNSOptions("server: 127.0.0.1:53\n        key_name: tsig.cube.test.\n        key_secret: \"c2VjcmV0c2VjcmV0\\n\""), "")
}
