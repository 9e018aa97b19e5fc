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
