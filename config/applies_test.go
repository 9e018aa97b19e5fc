package config

import (
	"io"
	"strings"
	"testing"
)

// A setting that the configuration around it leaves unread is refused,
// naming it and the setting that decides: an operator who typed it
// expects it to act. A switch that is off keeps its settings (turning a
// feature off for a while is one line), and under the memory store a
// Redis setting left at its default (as the shipped cubeproxy.yaml lists
// them) is no choice.
func TestSettingsThatWouldNotActAreRefused(t *testing.T) {
	const https = "https_addr: :8443\n"
	for _, tc := range []struct {
		name string
		yaml string
		want string // "" loads
	}{
		// tls.acme under another source.
		{"acme email with self_signed", https + "tls:\n  source: self_signed\n  acme:\n    email: ops@cube.test\n",
			"tls.acme.email is set but tls.source is self_signed: only the acme source reads tls.acme; set tls.source: acme"},
		{"acme storage with files", https + "tls:\n  source: files\n  cert_file: c.pem\n  key_file: k.pem\n  acme:\n    storage_dir: /var/lib/acme\n",
			"tls.acme.storage_dir is set but tls.source is files"},
		{"acme with source unset, files named", https + "tls:\n  cert_file: c.pem\n  key_file: k.pem\n  acme:\n    on_demand: true\n",
			"tls.acme.on_demand is set but tls.source is unset (files, as certificate files are named)"},
		{"acme dns options with source unset", https + "tls:\n  acme:\n    dns:\n      options: {server: 127.0.0.1:53}\n",
			"tls.acme.dns.options is set but tls.source is unset (self_signed)"},
		{"acme with acme", https + "tls:\n  source: acme\n  acme:\n    email: ops@cube.test\n    dns:\n      provider: rfc2136\n", ""},
		// files settings under another source (cert_file and files were
		// refused before).
		{"reload_interval with acme", https + "tls:\n  source: acme\n  reload_interval: 1m\n",
			"tls.reload_interval is set but tls.source is acme: only certificate files are re-read"},
		{"reload_interval with self_signed", https + "tls:\n  reload_interval: 1m\n",
			"tls.reload_interval is set but tls.source is unset (self_signed)"},
		{"reload_interval with files", https + "tls:\n  cert_file: c.pem\n  key_file: k.pem\n  reload_interval: 1m\n", ""},
		{"reload_interval with a files list", https + "tls:\n  files:\n    - {cert_file: c.pem, key_file: k.pem}\n  reload_interval: 1m\n", ""},
		{"acme with source unset, a files list", https + "tls:\n  files:\n    - {cert_file: c.pem, key_file: k.pem}\n  acme:\n    email: ops@cube.test\n",
			"tls.acme.email is set but tls.source is unset (files, as certificate files are named)"},
		// DNS settings with no provider to use them.
		{"dns resolvers without a provider", https + "tls:\n  source: acme\n  acme:\n    skip_wildcard: true\n    on_demand: true\n    dns:\n      resolvers: [1.1.1.1]\n",
			"tls.acme.dns.resolvers is set but tls.acme.dns.provider is empty"},
		// The files source with no file to read: the start failed naming
		// no setting.
		{"files source without a pair", https + "tls:\n  source: files\n",
			"tls.source is files but no certificate file is named: set tls.cert_file and tls.key_file (CUBEPROXY_TLS_CERT_FILE, CUBEPROXY_TLS_KEY_FILE), or list pairs under tls.files"},
		// Listeners.
		{"certificate files without https_addr", "tls:\n  cert_file: c.pem\n  key_file: k.pem\n",
			"tls certificate files are named but https_addr is empty"},
		{"a certificate files list without https_addr", "tls:\n  files:\n    - {cert_file: c.pem, key_file: k.pem}\n",
			"tls certificate files are named but https_addr is empty"},
		// Redis settings under the memory store.
		{"redis password with memory", "redis:\n  password: secret\n",
			"redis.password is set but store is memory: only the Redis store reads it"},
		{"redis db with memory", "redis:\n  db: 3\n", "redis.db is set but store is memory"},
		{"redis tls with memory", "redis:\n  tls: true\n", "redis.tls is set but store is memory"},
		{"redis key_prefix changed with memory", "redis:\n  key_prefix: 'x:'\n", "redis.key_prefix is set but store is memory"},
		{"sentinel addrs with memory", "redis:\n  sentinel:\n    addrs: [10.0.0.1:26379]\n", "redis.sentinel.addrs is set but store is memory"},
		{"redis defaults with memory", "redis:\n  addr: ''\n  command_timeout: 1s\n  key_prefix: 'cube:v1:shared:sandbox:proxy:'\n  sentinel:\n    addrs: []\n", ""},
		{"registry settings with the registry off", "registry:\n  enabled: false\n  interval: 10s\n", ""},
		// Redis settings another Redis setting leaves unread.
		{"sentinel addrs without master_name", "store: redis\nredis:\n  addr: 10.0.0.2:6379\n  sentinel:\n    addrs: [10.0.0.1:26379]\n",
			"redis.sentinel.addrs is set but redis.sentinel.master_name is empty: the sentinels would never be asked"},
		{"sentinel password without master_name", "store: redis\nredis:\n  addr: 10.0.0.2:6379\n  sentinel:\n    password: s\n",
			"redis.sentinel.password is set but redis.sentinel.master_name is empty"},
		{"sentinel with master_name", "store: redis\nredis:\n  sentinel:\n    master_name: m\n    addrs: [10.0.0.1:26379]\n    password: s\n", ""},
		{"persist_routes with redis", "store: redis\nredis:\n  addr: 10.0.0.2:6379\npersist_routes: true\n",
			"persist_routes is on but store is redis: only the memory store writes its routes file"},
		// What redis.url says wins over the fields, except a db 0 it
		// names, which redis.db overrode: a field that says otherwise
		// was read by neither, or the URL's part was not.
		{"redis db with a url naming another db", "store: redis\nredis:\n  url: redis://10.0.0.2:6379/2\n  db: 3\n",
			"redis.db (3) and the db redis.url names (2) differ"},
		{"redis db with a url naming db 0", "store: redis\nredis:\n  url: redis://10.0.0.2:6379/0\n  db: 3\n",
			"redis.db (3) and the db redis.url names (0) differ"},
		{"redis db with a unix url naming another db", "store: redis\nredis:\n  url: unix:///run/redis.sock?db=2\n  db: 3\n",
			"redis.db (3) and the db redis.url names (2) differ"},
		{"redis db with a url naming none", "store: redis\nredis:\n  url: redis://10.0.0.2:6379\n  db: 3\n", ""},
		{"redis db the url names too", "store: redis\nredis:\n  url: redis://10.0.0.2:6379/3\n  db: 3\n", ""},
		{"redis password with a url carrying another", "store: redis\nredis:\n  url: redis://:p1@10.0.0.2:6379\n  password: p2\n",
			"redis.password is set and redis.url carries another password"},
		{"redis password with a url carrying none", "store: redis\nredis:\n  url: redis://10.0.0.2:6379\n  password: p2\n", ""},
		{"redis password the url carries too", "store: redis\nredis:\n  url: redis://:p1@10.0.0.2:6379\n  password: p1\n", ""},
		{"redis username with a url naming another", "store: redis\nredis:\n  url: redis://u1:p@10.0.0.2:6379\n  username: u2\n",
			"redis.username is set and redis.url names another user"},
		{"redis username with a url naming none", "store: redis\nredis:\n  url: redis://:p@10.0.0.2:6379\n  username: u2\n", ""},
		// store: '' is the memory store, as the binary reads it.
		{"persist_routes with store empty", "store: ''\npersist_routes: true\n", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			loadWants(t, tc.yaml, tc.want)
		})
	}
}

// The environment and flags are judged as the file: the check runs on the
// configuration they build together.
func TestSettingsThatWouldNotActFromEnvAndFlags(t *testing.T) {
	_, err := Load([]string{"--https-addr", ":8443"}, env(map[string]string{"CUBEPROXY_TLS_ACME_EMAIL": "ops@cube.test"}), io.Discard)
	if err == nil || !strings.Contains(err.Error(), "tls.acme.email is set but tls.source is unset (self_signed)") {
		t.Fatalf("Load = %v; want tls.acme.email refused", err)
	}
	_, err = Load([]string{"--redis-password", "secret"}, env(nil), io.Discard)
	if err == nil || !strings.Contains(err.Error(), "redis.password is set but store is memory") {
		t.Fatalf("Load = %v; want redis.password refused", err)
	}
}
