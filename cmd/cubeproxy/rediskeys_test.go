package main

import (
	"strings"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// A refusal of the Redis store's settings names them as the file does
// (redis.addr, not addr), so that an operator finds them, and a value set
// by the environment says so: CUBEPROXY_REDIS_DB=2 next to a Cluster was
// "redis: cluster supports only db 0, got 2", naming neither.
func TestCheckRedisRefusalsNameKeys(t *testing.T) {
	dir := t.TempDir()
	ca := testenv.NewCA(t, "redis client CA")
	pairA, _ := ca.IssueClient(t, time.Now().Add(-time.Hour), time.Now().Add(time.Hour), "a")
	_, keyB := ca.IssueClient(t, time.Now().Add(-time.Hour), time.Now().Add(time.Hour), "b")
	for _, tc := range []struct {
		name string
		yaml string
		env  map[string]string
		want []string
		not  []string // in no message: a setting the value did not come from, a secret
	}{
		{"no redis named", "store: redis\n", nil,
			[]string{"store is redis but no Redis is named: set redis.addr (CUBEPROXY_REDIS_ADDR"}, nil},
		{"two named", "store: redis\nredis:\n  addr: 127.0.0.1:6379\n", map[string]string{"CUBEPROXY_REDIS_URL": "redis://127.0.0.1:6380/0"},
			[]string{"redis.addr and redis.url are both set", "(redis.url is set by CUBEPROXY_REDIS_URL)"}, nil},
		{"sentinel without addresses", "store: redis\nredis:\n  sentinel:\n    master_name: m\n", nil,
			[]string{"redis.sentinel.master_name is set but redis.sentinel.addrs is empty", "CUBEPROXY_REDIS_SENTINEL_ADDRS"}, nil},
		{"db with a cluster", "store: redis\nredis:\n  cluster:\n    addrs: ['127.0.0.1:7000']\n", map[string]string{"CUBEPROXY_REDIS_DB": "2"},
			[]string{"redis.db: 2, but a Redis Cluster", "(redis.db is set by CUBEPROXY_REDIS_DB)"}, nil},
		{"ca_file without tls", "store: redis\nredis:\n  addr: 127.0.0.1:6379\n  ca_file: " + dir + "/ca.pem\n", nil,
			[]string{"redis.ca_file is set but TLS to Redis is off: set redis.tls: true (CUBEPROXY_REDIS_TLS=true)"}, nil},
		// The URL go-redis refuses: named as a key, with the variable it
		// came from; the store the container also sets by variable is not
		// what is wrong ("open route store:" read as the store's refusal).
		{"url refused, from the environment", "", map[string]string{"CUBEPROXY_STORE": "redis", "CUBEPROXY_REDIS_URL": "redis://u:hunter2@127.0.0.1:6379/notadb"},
			[]string{"redis.url redis://xxxxx@127.0.0.1:6379/notadb", "(redis.url is set by CUBEPROXY_REDIS_URL)"}, []string{"store is set by", "hunter2"}},
		{"ca_file not PEM, from the environment", "store: redis\nredis:\n  addr: 127.0.0.1:6379\n  tls: true\n", map[string]string{"CUBEPROXY_REDIS_CA_FILE": writeTemp(t, dir, "junk.pem", "not a certificate\n")},
			[]string{"redis.ca_file " + dir + "/junk.pem: no PEM certificates", "(redis.ca_file is set by CUBEPROXY_REDIS_CA_FILE)"}, nil},
		{"client key missing, from the environment", "store: redis\nredis:\n  addr: 127.0.0.1:6379\n  tls: true\n  cert_file: " + writeTemp(t, dir, "client.pem", string(pairA)) + "\n",
			map[string]string{"CUBEPROXY_REDIS_KEY_FILE": dir + "/none.key"},
			[]string{"redis.key_file: ", dir + "/none.key", "(redis.key_file is set by CUBEPROXY_REDIS_KEY_FILE)"}, nil},
		{"client certificate without its key", "store: redis\nredis:\n  addr: 127.0.0.1:6379\n  tls: true\n  cert_file: " + dir + "/client.pem\n", nil,
			[]string{"redis.cert_file is set but redis.key_file is empty"}, nil},
		{"client key of another certificate", "store: redis\nredis:\n  addr: 127.0.0.1:6379\n  tls: true\n", map[string]string{
			"CUBEPROXY_REDIS_CERT_FILE": writeTemp(t, dir, "a.pem", string(pairA)), "CUBEPROXY_REDIS_KEY_FILE": writeTemp(t, dir, "b.key", string(keyB))},
			[]string{"redis.cert_file " + dir + "/a.pem with redis.key_file " + dir + "/b.key: tls: private key does not match public key"}, []string{"PRIVATE KEY"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := writeTemp(t, t.TempDir(), "cubeproxy.yaml", "http_addr: 127.0.0.1:0\nadmin_addr: 127.0.0.1:0\n"+tc.yaml)
			code, stdout, stderr := runCheck(t, func(k string) string { return tc.env[k] }, "--config", cfg)
			if code != 1 || stdout != "" {
				t.Fatalf("exit %d (want 1), stdout %q, stderr %q", code, stdout, stderr)
			}
			for _, w := range tc.want {
				if !strings.Contains(stderr, w) {
					t.Errorf("stderr %q\ndoes not say %q", stderr, w)
				}
			}
			for _, w := range tc.not {
				if strings.Contains(stderr, w) {
					t.Errorf("stderr %q\nsays %q", stderr, w)
				}
			}
		})
	}
}
