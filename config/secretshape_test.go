package config

import (
	"io"
	"testing"
)

// Secrets that only look like a variable reference load: "$1…" is no
// variable's name (a shell reads $1 as a positional parameter), and Redis
// sets its own password, which a generated one may start with '$' and a
// name. Refused, a working secret would stop the proxy starting.
func TestSecretShapesThatLoad(t *testing.T) {
	for _, tc := range []struct {
		name string
		env  map[string]string
	}{
		{"admin token starting with $ and a digit", map[string]string{"CUBEPROXY_ADMIN_TOKEN": "$1Tok3nValue"}},
		{"admin token ${digit…}", map[string]string{"CUBEPROXY_ADMIN_TOKEN": "${1Tok3nValue}"}},
		{"redis password $NAME", map[string]string{"CUBEPROXY_STORE": "redis", "CUBEPROXY_REDIS_ADDR": "r:6379", "CUBEPROXY_REDIS_PASSWORD": "$Passw0rdLooksLikeAVar"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := Load(nil, env(tc.env), io.Discard); err != nil {
				t.Fatalf("refused: %v", err)
			}
		})
	}
}

// A secret's YAML tag is refused, for YAML takes it off the value, unless
// it is !!str, which reads the value as written; and the check follows an
// alias to the value it names.
func TestSecretTags(t *testing.T) {
	for _, tc := range []struct{ name, yaml, want string }{
		{"!!str", "admin_token: !!str Tok3nValue\n", ""},
		{"another tag", "admin_token: !Tok3nValue\n", "line 1: admin_token: its value starts with a YAML tag"},
		{"a tag through an alias", "instance_id: &k !Tok3nValue\nadmin_token: *k\n", "line 1: admin_token: its value starts with a YAML tag"},
	} {
		t.Run(tc.name, func(t *testing.T) { loadWants(t, tc.yaml, tc.want) })
	}
}
