package redisstore_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
	"github.com/cube-sandbox/cubeproxy/routing/redisstore"
)

func TestValidate(t *testing.T) {
	tests := []struct {
		name string
		cfg  redisstore.Config
		err  string // substring; empty means valid
	}{
		{"addr", redisstore.Config{Addr: "127.0.0.1:6379"}, ""},
		{"url", redisstore.Config{URL: "redis://127.0.0.1:6379/2"}, ""},
		{"sentinel", redisstore.Config{Sentinel: redisstore.SentinelConfig{MasterName: "m", Addrs: []string{"127.0.0.1:26379"}}}, ""},
		{"cluster", redisstore.Config{Cluster: redisstore.ClusterConfig{Addrs: []string{"127.0.0.1:7000"}}}, ""},
		{"nothing", redisstore.Config{}, "set one of"},
		{"two kinds", redisstore.Config{Addr: "127.0.0.1:6379", URL: "redis://127.0.0.1"}, "mutually exclusive"},
		{"sentinel without addrs", redisstore.Config{Sentinel: redisstore.SentinelConfig{MasterName: "m"}}, "sentinel.addrs"},
		{"cluster db", redisstore.Config{Cluster: redisstore.ClusterConfig{Addrs: []string{"127.0.0.1:7000"}}, DB: 1}, "db 0"},
		{"ca without tls", redisstore.Config{Addr: "127.0.0.1:6379", CAFile: "/x"}, "tls: true"},
		{"negative pool", redisstore.Config{Addr: "127.0.0.1:6379", PoolSize: -1}, "pool_size"},
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

// A URL that does not parse is named in the error without its password:
// the error ends up in the process's log.
func TestBadURLErrorHidesPassword(t *testing.T) {
	for _, raw := range []string{
		"redis://default:hunter2%zz@redis:6379/0", // a raw % in the password
		"redis://default:hunter2@redis:6379/0%zz",
		"redis://:hunter2@[::1:6379/0",
		"redis://default:Zm9v/hunter2@redis.internal:6379/0", // base64 with a "/"
		"redis://default:ab?cdhunter2@redis:6379/0",
		"redis://default:pa#sshunter2@redis:6379/0",
	} {
		_, err := redisstore.NewClient(redisstore.Config{URL: raw})
		if err == nil {
			t.Fatalf("%s: no error", raw)
		}
		if msg := err.Error(); strings.Contains(msg, "hunter2") || strings.Contains(msg, "Zm9v") || strings.Contains(msg, "default") || !strings.Contains(msg, "redis url redis://xxxxx@") {
			t.Errorf("error %q: want the URL with its userinfo masked", msg)
		}
	}
}

// TestLeastPrivilegeACLUser: a user granted only what the proxy uses (the
// README's ACL line: HGETALL on the route keys, SUBSCRIBE and PUBLISH on
// the invalidation channel, the registry writes) reads routes, subscribes
// and publishes, on every connection, the pub/sub one included. The
// client's cosmetic CLIENT SETNAME must not make Redis refuse them.
func TestLeastPrivilegeACLUser(t *testing.T) {
	r := testenv.StartRedis(t)
	acl := []any{"ACL", "SETUSER", "proxy", "on", ">pw", "resetkeys", "resetchannels", "-@all",
		"~cube:v1:shared:sandbox:proxy:*", "~bypass_host_proxy:*", "+hgetall",
		"&cube:v1:shared:cube_proxy:invalidate", "+subscribe", "+publish", "+ping",
		"~cube:v1:shared:cube_proxy:*", "+hset", "+zadd", "+hdel", "+zrem"}
	if err := r.Client().Do(context.Background(), acl...).Err(); err != nil {
		t.Fatal(err)
	}
	hset(t, r, redisstore.DefaultKeyPrefix+"sbx", "HostIP", "10.0.0.1", "50005", "30001")
	for _, cfg := range []redisstore.Config{
		{Addr: r.Addr(), Username: "proxy", Password: "pw"},
		{URL: "redis://proxy:pw@" + r.Addr()},
	} {
		s := openStoreCfg(t, cfg)
		if _, err := s.Lookup(context.Background(), "sbx"); err != nil {
			t.Fatalf("lookup as the least-privileged user: %v", err)
		}
		if err := s.Publish(context.Background(), "sbx"); err != nil {
			t.Fatalf("publish as the least-privileged user: %v", err)
		}
		sub := s.Subscribe(context.Background(), make(recorder, 16), nil)
		select {
		case <-sub.Ready():
		case <-time.After(5 * time.Second):
			t.Fatal("not subscribed 5s after start")
		}
		_ = sub.Close()
	}
	// A user that may name its connections still does, for CLIENT LIST.
	s := openStore(t, r)
	if _, err := s.Lookup(context.Background(), "sbx"); err != nil {
		t.Fatal(err)
	}
	list, err := r.Client().ClientList(context.Background()).Result()
	if err != nil || !strings.Contains(list, "name=cubeproxy ") {
		t.Fatalf("CLIENT LIST has no connection named cubeproxy (%v):\n%s", err, list)
	}
}
