package config

import (
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// fuzzSecret marks a secret's value in FuzzSecretValue's input.
const fuzzSecret = "S3CRET"

// secretLayouts put a secret's value, written as the operator wrote it
// (%s), under each secret key but redis.url (FuzzRedisURL's): in a
// configuration that uses it, and as a list entry or a map value where
// the key takes one.
var secretLayouts = []string{
	"admin_token: %s\n",
	"auth:\n  signing_keys: [%s]\n",
	"auth:\n  signing_keys:\n    - %s\n",
	"store: redis\nredis:\n  addr: r:6379\n  password: %s\n",
	"store: redis\nredis:\n  sentinel:\n    master_name: m\n    addrs: ['r:26379']\n    password: %s\n",
	"https_addr: ':8443'\ndomains: [a.test]\ntls:\n  source: acme\n  acme:\n    email: a@b.test\n    dns:\n      provider: rfc2136\n      options:\n        key_secret: %s\n",
	"admin_token: &a %s\nstore: redis\nredis:\n  addr: r:6379\n  password: *a\n",
	"store: redis\nredis:\n  addr: r:6379\n  <<: {password: %s}\n",
}

// FuzzSecretValue writes a secret's value holding S3CRET, on one line,
// under a secret key (secretLayouts): the file loads or is refused, and a
// refusal never shows S3CRET (the decoder quotes what it cannot read,
// and the secret marks *, ! and & made it an alias's name or a tag). A
// value without a comment that loads is kept: S3CRET is in the loaded
// configuration, not taken off as a tag or an anchor would take it.
func FuzzSecretValue(f *testing.F) {
	for i := range secretLayouts {
		for _, v := range []string{fuzzSecret, "*" + fuzzSecret, "!" + fuzzSecret, "&" + fuzzSecret, "!x " + fuzzSecret,
			"!!int " + fuzzSecret, "'" + fuzzSecret, "\"" + fuzzSecret + "\\", "[" + fuzzSecret + "]", "{a: " + fuzzSecret + "}",
			"%" + fuzzSecret, "@" + fuzzSecret, "`" + fuzzSecret, "|" + fuzzSecret, "? " + fuzzSecret, "- " + fuzzSecret,
			"!!binary " + fuzzSecret, "&a *" + fuzzSecret, fuzzSecret + ": x", "$" + fuzzSecret, " " + fuzzSecret} {
			f.Add(uint8(i), v)
		}
	}
	f.Fuzz(func(t *testing.T, layout uint8, value string) {
		if !strings.Contains(value, fuzzSecret) || strings.ContainsAny(value, "\r\n\x00") {
			return
		}
		data := strings.Replace(secretLayouts[int(layout)%len(secretLayouts)], "%s", value, 1)
		cfg, err := loadYAML(t, t.TempDir(), []byte(data))
		if err != nil {
			if strings.Contains(err.Error(), fuzzSecret) {
				t.Fatalf("the refusal of\n%s\nshows the secret: %v", data, err)
			}
			return
		}
		if strings.ContainsAny(value, "#&") {
			// The secret may be in a comment, or be an anchor's name
			// (&name value: YAML's own, which a file may use to give two
			// keys one secret).
			return
		}
		out, err := yaml.Marshal(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(out), fuzzSecret) {
			t.Fatalf("\n%s\nloads without the secret:\n%s", data, out)
		}
	})
}
