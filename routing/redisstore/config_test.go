package redisstore_test

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.yaml.in/yaml/v3"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
	"github.com/cube-sandbox/cubeproxy/routing/redisstore"
)

func TestValidate(t *testing.T) {
	testenv.ParallelRedis(t)
	tests := []struct {
		name string
		cfg  redisstore.Config
		err  string // substring; empty means valid
	}{
		{"addr", redisstore.Config{Addr: "127.0.0.1:6379"}, ""},
		{"url", redisstore.Config{URL: "redis://127.0.0.1:6379/2"}, ""},
		{"sentinel", redisstore.Config{Sentinel: redisstore.SentinelConfig{MasterName: "m", Addrs: []string{"127.0.0.1:26379"}}}, ""},
		{"cluster", redisstore.Config{Cluster: redisstore.ClusterConfig{Addrs: []string{"127.0.0.1:7000"}}}, ""},
		{"nothing", redisstore.Config{}, "set redis.addr"},
		{"two kinds", redisstore.Config{Addr: "127.0.0.1:6379", URL: "redis://127.0.0.1"}, "redis.addr and redis.url are both set"},
		{"sentinel without addrs", redisstore.Config{Sentinel: redisstore.SentinelConfig{MasterName: "m"}}, "redis.sentinel.addrs is empty"},
		{"cluster db", redisstore.Config{Cluster: redisstore.ClusterConfig{Addrs: []string{"127.0.0.1:7000"}}, DB: 1}, "redis.db: 1, but a Redis Cluster has only db 0"},
		{"ca without tls", redisstore.Config{Addr: "127.0.0.1:6379", CAFile: "/x"}, "redis.ca_file is set but TLS to Redis is off"},
		{"client certificate without tls", redisstore.Config{Addr: "127.0.0.1:6379", CertFile: "/c", KeyFile: "/k"}, "redis.cert_file is set but TLS to Redis is off"},
		{"client certificate without key", redisstore.Config{Addr: "127.0.0.1:6379", TLS: true, CertFile: "/c"}, "redis.cert_file is set but redis.key_file is empty"},
		{"client key without certificate", redisstore.Config{Addr: "127.0.0.1:6379", TLS: true, KeyFile: "/k"}, "redis.key_file is set but redis.cert_file is empty"},
		{"negative pool", redisstore.Config{Addr: "127.0.0.1:6379", PoolSize: -1}, "redis.pool_size: -1 is negative"},
		// go-redis panicked on it in NewClient: check and serve died.
		{"huge pool", redisstore.Config{Addr: "127.0.0.1:6379", PoolSize: 1 << 40}, "redis.pool_size: 1099511627776 is above 1000000"},
		{"largest pool", redisstore.Config{Addr: "127.0.0.1:6379", PoolSize: redisstore.MaxPoolSize}, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.Validate()
			if tc.err == "" && err != nil || tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)) {
				t.Fatalf("Validate = %v, want %q", err, tc.err)
			}
			if _, err := redisstore.NewClient(tc.cfg); (err == nil) != (tc.err == "") {
				t.Fatalf("NewClient err = %v, want error %v", err, tc.err != "")
			}
		})
	}
}

func TestConfigYAML(t *testing.T) {
	testenv.ParallelRedis(t)
	const doc = `
addr: 127.0.0.1:6379
password: pw
db: 3
tls: true
ca_file: /etc/ca.pem
sentinel: {master_name: m, addrs: [127.0.0.1:26379], password: spw}
cluster: {addrs: [127.0.0.1:7000]}
pool_size: 64
key_prefix: "k:"
legacy_key_prefix: "l:"
disable_legacy: true
invalidate_channel: ch
command_timeout: 500ms
`
	var cfg redisstore.Config
	if err := yaml.Unmarshal([]byte(doc), &cfg); err != nil {
		t.Fatal(err)
	}
	want := redisstore.Config{
		Addr: "127.0.0.1:6379", Password: "pw", DB: 3, TLS: true, CAFile: "/etc/ca.pem",
		Sentinel: redisstore.SentinelConfig{MasterName: "m", Addrs: []string{"127.0.0.1:26379"}, Password: "spw"},
		Cluster:  redisstore.ClusterConfig{Addrs: []string{"127.0.0.1:7000"}},
		PoolSize: 64, KeyPrefix: "k:", LegacyKeyPrefix: "l:", DisableLegacy: true, InvalidateChannel: "ch",
		CommandTimeout: 500 * time.Millisecond,
	}
	if got, _ := yaml.Marshal(cfg); string(got) != string(must(yaml.Marshal(want))) {
		t.Fatalf("decoded\n%s\nwant\n%s", got, must(yaml.Marshal(want)))
	}
	d := redisstore.Config{}.WithDefaults()
	if d.KeyPrefix != redisstore.DefaultKeyPrefix || d.CommandTimeout != time.Second || d.Registry.Interval != 5*time.Second || d.Registry.Enabled {
		t.Fatalf("defaults: %+v", d)
	}
}

func must(b []byte, err error) []byte {
	if err != nil {
		panic(err)
	}
	return b
}

// TestAuthAndDB: password and db index reach the server, from fields and from a URL.
func TestAuthAndDB(t *testing.T) {
	testenv.ParallelRedis(t)
	r := testenv.StartRedis(t, "--requirepass", "s3cret")
	admin := redisstore.Config{Addr: r.Addr(), Password: "s3cret", DB: 5}
	seed, err := redisstore.NewClient(admin)
	if err != nil {
		t.Fatal(err)
	}
	defer seed.Close()
	if err := seed.HSet(context.Background(), redisstore.DefaultKeyPrefix+"sbx", "HostIP", "10.0.0.1").Err(); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		cfg  redisstore.Config
		ok   bool
	}{
		{"fields", admin, true},
		{"url", redisstore.Config{URL: "redis://:s3cret@" + r.Addr() + "/5"}, true},
		{"url plus password field", redisstore.Config{URL: "redis://" + r.Addr() + "/5", Password: "s3cret"}, true},
		{"wrong db", redisstore.Config{Addr: r.Addr(), Password: "s3cret"}, false},
		{"wrong password", redisstore.Config{Addr: r.Addr(), Password: "nope", DB: 5}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := openStoreCfg(t, tc.cfg).Lookup(context.Background(), "sbx")
			if (err == nil) != tc.ok {
				t.Fatalf("lookup err = %v, want ok=%v", err, tc.ok)
			}
		})
	}
}

// TestURLWithALoneName: redis-cli -u reads redis://NAME@host as the
// password NAME, the store as the ACL user NAME with an empty password. A
// URL that worked with redis-cli failed every lookup with "NOAUTH
// Authentication required" (now WRONGPASS, see onConnect) and nothing
// pointed at the URL's form; the store now says so once when it opens,
// without quoting the name.
func TestURLWithALoneName(t *testing.T) {
	testenv.ParallelRedis(t)
	r := testenv.StartRedis(t, "--requirepass", "s3cret-lone")
	for _, tc := range []struct {
		name string
		cfg  redisstore.Config
		warn bool
	}{
		{"lone name", redisstore.Config{URL: "redis://s3cret-lone@" + r.Addr()}, true},
		{"name and password field", redisstore.Config{URL: "redis://default@" + r.Addr(), Password: "s3cret-lone"}, false},
		{"password alone", redisstore.Config{URL: "redis://:s3cret-lone@" + r.Addr()}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var logs testenv.LogBuffer
			tc.cfg.Logger = slog.New(slog.NewJSONHandler(&logs, nil))
			_, err := openStoreCfg(t, tc.cfg).Lookup(context.Background(), "sbx")
			if refused := err != nil && strings.Contains(err.Error(), "WRONGPASS"); refused != tc.warn {
				t.Fatalf("lookup err = %v, want WRONGPASS %v", err, tc.warn)
			}
			if err != nil && strings.Contains(err.Error(), "s3cret") {
				t.Fatalf("the error quotes the URL's name: %v", err)
			}
			if warned := strings.Contains(logs.String(), "redis.url names a user and no password"); warned != tc.warn {
				t.Fatalf("warned %v, want %v: %s", warned, tc.warn, logs.String())
			}
			if strings.Contains(logs.String(), "s3cret") {
				t.Fatalf("the log quotes the URL's name: %s", logs.String())
			}
		})
	}
}

// A URL that does not parse is named in the error without its password,
// nor the values of its query options (where an operator may have put
// one): the error ends up in the process's log.
func TestBadURLErrorHidesPassword(t *testing.T) {
	testenv.ParallelRedis(t)
	for _, raw := range []string{
		"redis://default:hunter2%zz@redis:6379/0", // a raw % in the password
		"redis://default:hunter2@redis:6379/0%zz",
		"redis://:hunter2@[::1:6379/0",
		"redis://default:Zm9v/hunter2@redis.internal:6379/0", // base64 with a "/"
		"redis://default:ab?cdhunter2@redis:6379/0",
		"redis://default:pa#sshunter2@redis:6379/0",
		// A raw '/', '?' or '#' first, or after a number: the authority
		// ends there, and go-redis quoted the rest as the db or an option
		// (or, after a '#', took the URL for localhost without a password).
		"redis://default:/hunter2@redis:6379/0",
		"redis://default:12/hunter2@redis:6379/0",
		"redis://default:?hunter2@redis:6379/0",
		"redis://default:#hunter2@redis:6379/0",
		"redis://default:/a/b/hunter2@redis:6379/0",
		// A password put in the query, which go-redis refuses by name.
		"redis://default@redis:6379/0?password=hunter2",
		"redis://default@redis:6379/0?db=1&password=hunter2&x",
	} {
		_, err := redisstore.NewClient(redisstore.Config{URL: raw})
		if err == nil {
			t.Fatalf("%s: no error", raw)
		}
		if msg := err.Error(); strings.Contains(msg, "hunter2") || strings.Contains(msg, "Zm9v") || strings.Contains(msg, "default") || !strings.Contains(msg, "redis.url redis://xxxxx@") {
			t.Errorf("error %q: want the URL with its userinfo masked", msg)
		}
	}
}

// A URL whose '@' is in its authority, or a unix socket's path, is not
// taken for a password cut by a raw '/', '?' or '#' (CheckURL).
func TestURLWithAtOutsideAPassword(t *testing.T) {
	testenv.ParallelRedis(t)
	for _, tc := range []struct {
		raw, addr, password string
	}{
		{"redis://u:p%2Fw@redis:6379/0", "redis:6379", "p/w"},
		{"redis://u:p@ss@redis:6379", "redis:6379", "p@ss"},
		{"unix:///run/redis/redis@main.sock", "/run/redis/redis@main.sock", ""},
		{"unix://u:pw@/run/redis/redis@main.sock?db=1", "/run/redis/redis@main.sock", "pw"},
	} {
		c, err := redisstore.NewClient(redisstore.Config{URL: tc.raw})
		if err != nil {
			t.Errorf("%s: %v", tc.raw, err)
			continue
		}
		opt := c.(*redis.Client).Options()
		if opt.Addr != tc.addr || opt.Password != tc.password {
			t.Errorf("%s: addr %q password %q, want %q %q", tc.raw, opt.Addr, opt.Password, tc.addr, tc.password)
		}
		_ = c.Close()
	}
	// A unix URL whose authority is cut short of its '@' is refused.
	if _, err := redisstore.NewClient(redisstore.Config{URL: "unix://u:p/hunter2@/run/redis.sock"}); err == nil || strings.Contains(err.Error(), "hunter2") {
		t.Errorf("unix URL with a raw '/' in the password: %v", err)
	}
}

// TestLeastPrivilegeACLUser: a user granted only what the README's ACL
// line grants (read from the README itself, so the line cannot fall behind
// the client) reads routes, subscribes, publishes and keeps the registry,
// on every connection, the pub/sub one included, against a standalone
// server, a Sentinel-managed one and a Cluster. The client's cosmetic
// CLIENT SETNAME must not make Redis refuse them.
func TestLeastPrivilegeACLUser(t *testing.T) {
	testenv.ParallelRedis(t)
	ctx := context.Background()
	rules := readmeACLRules(t)
	d := aclDeployments(t, rules...)
	standalone := d["standalone"].r
	for _, dep := range d {
		hset(t, dep.r, redisstore.DefaultKeyPrefix+"sbx", "HostIP", "10.0.0.1", "50005", "30001")
	}
	// Another database than 0: every connection starts with a SELECT.
	db3 := redis.NewClient(&redis.Options{Addr: standalone.Addr(), DB: 3, Protocol: 2, DisableIdentity: true})
	t.Cleanup(func() { _ = db3.Close() })
	if err := db3.HSet(ctx, redisstore.DefaultKeyPrefix+"sbx", "HostIP", "10.0.0.1", "50005", "30001").Err(); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		r      *testenv.Redis
		cfg    redisstore.Config
		client *redis.Client // of the database the store uses; nil: r's
	}{
		{"addr", standalone, redisstore.Config{Addr: standalone.Addr(), Username: "proxy", Password: "pw"}, nil},
		{"db 3", standalone, redisstore.Config{Addr: standalone.Addr(), Username: "proxy", Password: "pw", DB: 3}, db3},
		{"url", standalone, redisstore.Config{URL: "redis://proxy:pw@" + standalone.Addr()}, nil},
		{"sentinel", d["sentinel"].r, d["sentinel"].cfg, nil},
		{"cluster", d["cluster"].r, d["cluster"].cfg, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tc.cfg.Registry = redisstore.RegistryConfig{Enabled: true}
			s := openStoreCfg(t, tc.cfg)
			if _, err := s.Lookup(ctx, "sbx"); err != nil {
				t.Fatalf("lookup as the least-privileged user: %v", err)
			}
			if err := s.Publish(ctx, "sbx"); err != nil {
				t.Fatalf("publish as the least-privileged user: %v", err)
			}
			sub := s.Subscribe(ctx, make(recorder, 16), nil)
			select {
			case <-sub.Ready():
			case <-time.After(5 * time.Second):
				t.Fatal("not subscribed 5s after start")
			}
			_ = sub.Close()
			reg, err := s.StartRegistry(redisstore.Instance{ProxyID: "acl-" + tc.name}, nil)
			if err != nil {
				t.Fatal(err)
			}
			client := tc.client
			if client == nil {
				client = tc.r.Client()
			}
			testenv.WaitFor(t, 5*time.Second, "registry entry written", func() bool {
				n, err := client.HExists(ctx, redisstore.DefaultRegistryHash, "acl-"+tc.name).Result()
				return err == nil && n
			})
			if err := reg.Stop(ctx); err != nil {
				t.Fatalf("registry removal as the least-privileged user: %v", err)
			}
		})
	}
	// A user that may name its connections still does, for CLIENT LIST.
	s := openStore(t, standalone)
	if _, err := s.Lookup(ctx, "sbx"); err != nil {
		t.Fatal(err)
	}
	list, err := standalone.Client().ClientList(ctx).Result()
	if err != nil || !strings.Contains(list, "name=cubeproxy ") {
		t.Fatalf("CLIENT LIST has no connection named cubeproxy (%v):\n%s", err, list)
	}
}

// readmeACLRules returns the ACL rules the README's Redis section grants
// the proxy's user: every rule in the code spans of the sentence that
// starts "An ACL user".
func readmeACLRules(t *testing.T) []any {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	text := string(b)
	i := strings.Index(text, "An ACL user")
	j := strings.Index(text[max(i, 0):], "Each connection is")
	if i < 0 || j < 0 {
		t.Fatal("README: no ACL sentence in the Redis section")
	}
	var rules []any
	spans := strings.Split(text[i:i+j], "`")
	for k := 1; k < len(spans); k += 2 {
		for _, f := range strings.Fields(spans[k]) {
			if strings.ContainsAny(f[:1], "~&+-%") {
				rules = append(rules, f)
			}
		}
	}
	if len(rules) == 0 {
		t.Fatal("README: the ACL sentence names no rule")
	}
	return rules
}

// TestURLOptionsTheProxySets: a redis.url query option the proxy sets
// itself on every connection (the pool's size, the timeouts and retries it
// derives from redis.command_timeout, TLS verification, the protocol, the
// connection's name) was taken by go-redis and then replaced without a
// word: `?pool_size=100` served on go-redis's default pool. Such an option
// is refused, by its name and the setting to use, its value not shown;
// the options the proxy leaves to go-redis still work.
func TestURLOptionsTheProxySets(t *testing.T) {
	testenv.ParallelRedis(t)
	for _, tc := range []struct {
		query, instead string
	}{
		{"pool_size=100", "redis.pool_size"},
		{"dial_timeout=5s", "redis.command_timeout"},
		{"read_timeout=5s", "redis.command_timeout"},
		{"write_timeout=5s", "redis.command_timeout"},
		{"pool_timeout=5s", "redis.command_timeout"},
		{"max_retries=5", "redis.command_timeout"},
		{"min_retry_backoff=1ms", "redis.command_timeout"},
		{"max_retry_backoff=1s", "redis.command_timeout"},
		{"skip_verify=true", "redis.insecure_skip_verify"},
		{"protocol=3", "RESP2"},
		{"client_name=edge", "cubeproxy"},
		{"pipeline_pool_size=4", "main pool"},
		// go-redis v9.24 takes these, v9.23 refused them.
		{"dialer_retries=5", "redis.command_timeout"},
		{"dialer_retry_timeout=1s", "redis.command_timeout"},
		{"context_timeout_enabled=false", "redis.command_timeout"},
		{"disable_identity=false", "CLIENT SETINFO"},
		{"identity_suffix=edge", "CLIENT SETINFO"},
		{"pipeline_min_idle_conns=2", "main pool"},
		{"db=2&pool_size=100", "redis.pool_size"},
	} {
		for _, raw := range []string{
			"redis://u:hunter2@127.0.0.1:6379/1?" + tc.query,
			"rediss://u:hunter2@redis.internal:6380?" + tc.query,
			"unix://u:hunter2@/run/redis/redis@main.sock?" + tc.query,
		} {
			name, _, _ := strings.Cut(strings.TrimPrefix(tc.query, "db=2&"), "=")
			err := redisstore.Config{URL: raw}.Validate()
			if err == nil || !strings.Contains(err.Error(), "option "+name+" is not applied") || !strings.Contains(err.Error(), tc.instead) {
				t.Errorf("%s: Validate = %v, want option %s refused, naming %s", raw, err, name, tc.instead)
				continue
			}
			if msg := err.Error(); strings.Contains(msg, "hunter2") || strings.Contains(msg, "="+strings.SplitN(tc.query, "=", 2)[1]) && !strings.HasPrefix(tc.query, "db=") {
				t.Errorf("%s: error %q quotes the password or the option's value", raw, msg)
			}
			if _, err := redisstore.NewClient(redisstore.Config{URL: raw}); err == nil {
				t.Errorf("%s: NewClient took it", raw)
			}
		}
	}
	// What the proxy leaves to go-redis is go-redis's, as before.
	c, err := redisstore.NewClient(redisstore.Config{URL: "redis://127.0.0.1:6379?db=3&min_idle_conns=2&conn_max_idle_time=1m&pool_fifo=true"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if opt := c.(*redis.Client).Options(); opt.DB != 3 || opt.MinIdleConns != 2 || opt.ConnMaxIdleTime != time.Minute || !opt.PoolFIFO {
		t.Fatalf("options left to go-redis: db %d min_idle_conns %d conn_max_idle_time %s pool_fifo %v", opt.DB, opt.MinIdleConns, opt.ConnMaxIdleTime, opt.PoolFIFO)
	}
}
