package config

import (
	"io"
	"strings"
	"testing"
)

// A refusal never prints a secret's value, not even one shaped like a
// variable reference ($NAME): it may be the real secret that merely
// looks like one, and refusals land in terminals, CI logs and the
// journal. The refusal names the key (and the line or the variable)
// instead.
func TestRefusalsHideSecrets(t *testing.T) {
	for _, tc := range []struct {
		name   string
		args   []string
		env    map[string]string
		secret string // must not appear, nor its first 7 bytes
		want   string // must appear
	}{
		{"admin token $NAME in yaml", []string{"--config", writeFile(t, "admin_token: $Tok3nLooksLikeAVar\n")}, nil,
			"$Tok3nLooksLikeAVar", "admin_token has the shape of a reference to an environment variable"},
		{"admin token ${NAME} in yaml", []string{"--config", writeFile(t, "admin_token: ${Tok3nLooksLikeAVar}\n")}, nil,
			"Tok3nLooksLikeAVar", "admin_token has the shape of a reference"},
		{"admin token $(NAME) from the environment", nil, map[string]string{"CUBEPROXY_ADMIN_TOKEN": "$(Tok3nLooksLikeAVar)"},
			"Tok3nLooksLikeAVar", "admin_token has the shape of a reference"},
		{"admin token $NAME from a flag", []string{"--admin-token=$Tok3nLooksLikeAVar"}, nil,
			"Tok3nLooksLikeAVar", "admin_token has the shape of a reference"},
		{"second signing key $NAME", []string{"--config", writeFile(t, "auth:\n  signing_keys: [0123456789abcdef0123456789abcdef, $Sign1ngKeyLooksLikeAVar]\n")}, nil,
			"Sign1ngKeyLooksLikeAVar", "auth.signing_keys: entry 2 has the shape of a reference"},
		// A scalar for the list: the decoder quotes its first bytes.
		{"signing key written as a string", []string{"--config", writeFile(t, "auth:\n  signing_keys: Sign1ngKeyS3cretValue0123456789abcdef\n")}, nil,
			"Sign1ngKeyS3cretValue0123456789abcdef", "line 2: auth.signing_keys: want a list of strings ([a, b], or one - line each), got a string (not shown: a secret)"},
		{"short signing key written as a string", []string{"--config", writeFile(t, "auth:\n  signing_keys: s3cr3t\n")}, nil,
			"s3cr3t", "line 2: auth.signing_keys: want a list of strings"},
		// Through an alias the decoder's own line stays; its quote goes.
		{"signing key through an alias", []string{"--config", writeFile(t, "x: &k Sign1ngKeyS3cretValue0123456789abcdef\nauth:\n  signing_keys: *k\n")}, nil,
			"Sign1ngKeyS3cretValue0123456789abcdef", "line 1: "},
		{"redis password written as a list", []string{"--config", writeFile(t, "store: redis\nredis:\n  addr: r:6379\n  password: [Passw0rdS3cret]\n")}, nil,
			"Passw0rdS3cret", "line 4: redis.password: want a string, got a list"},
		// A generated secret may start with a character YAML reads as an
		// alias (*), a tag (!) or an anchor (&) when it starts a plain
		// value: the alias's refusal quoted the rest of the secret, and
		// the tag or the anchor left the secret empty (or its rest).
		{"redis password starting with '*'", []string{"--config", writeFile(t, "store: redis\nredis:\n  addr: r:6379\n  password: *Passw0rdS3cret\n")}, nil,
			"Passw0rdS3cret", "line 4: redis.password: its value starts with '*'"},
		// YAML ends an alias's name at ':', '?', '%', '@' or '`' too:
		// the alias was not found on its line, and the refusal quoted the
		// secret up to that character.
		{"redis password starting with '*', with a ':'", []string{"--config", writeFile(t, "store: redis\nredis:\n  addr: r:6379\n  password: *Passw0rdS3cret:rest\n")}, nil,
			"Passw0rdS3cret", "line 4: redis.password: its value starts with '*'"},
		{"redis password starting with '*', with a '?', in a flow mapping", []string{"--config", writeFile(t, "store: redis\nredis: {addr: 'r:6379', password: *Passw0rdS3cret?rest}\n")}, nil,
			"Passw0rdS3cret", "line 2: redis.password: its value starts with '*'"},
		// Two secrets on the alias's line (a flow mapping): the refusal
		// names the one the alias is written for, whichever comes first.
		{"redis password starting with '*', the sentinel's on its line", []string{"--config", writeFile(t, "store: redis\nredis: {addr: 'r:6379', password: *Passw0rdS3cret, sentinel: {password: x}}\n")}, nil,
			"Passw0rdS3cret", "line 2: redis.password: its value starts with '*'"},
		{"sentinel password starting with '*', redis's before it on its line", []string{"--config", writeFile(t, "store: redis\nredis: {addr: 'r:6379', password: x, sentinel: {password: *Passw0rdS3cret}}\n")}, nil,
			"Passw0rdS3cret", "line 2: redis.sentinel.password: its value starts with '*'"},
		// A byte-order mark is no character to the decoder: the column
		// does not match, and the first secret on the line is named.
		{"admin token starting with '*' after a byte-order mark", []string{"--config", writeFile(t, "\ufeffadmin_token: *Tok3nS3cretValue\n")}, nil,
			"Tok3nS3cretValue", "line 1: admin_token: its value starts with '*'"},
		{"sentinel password starting with '*', after multi-byte text", []string{"--config", writeFile(t, "store: redis\nredis: {addr: 'r:6379', password: 'pässwörd', sentinel: {password: *Passw0rdS3cret}}\n")}, nil,
			"Passw0rdS3cret", "line 2: redis.sentinel.password: its value starts with '*'"},
		{"signing key starting with '*'", []string{"--config", writeFile(t, "auth:\n  signing_keys:\n    - *Sign1ngKeyS3cretValue0123456789abcdef\n")}, nil,
			"Sign1ngKeyS3cretValue0123456789abcdef", "line 3: auth.signing_keys: its value starts with '*'"},
		{"admin token starting with '!'", []string{"--config", writeFile(t, "admin_token: !Tok3nS3cretValue\n")}, nil,
			"Tok3nS3cretValue", "line 1: admin_token: its value starts with a YAML tag"},
		{"sentinel password starting with '!', with a space", []string{"--config", writeFile(t, "store: redis\nredis:\n  sentinel:\n    master_name: m\n    addrs: ['r:26379']\n    password: !Passw0rdS3cret and more\n")}, nil,
			"Passw0rdS3cret", "line 6: redis.sentinel.password: its value starts with a YAML tag"},
		{"redis password starting with '&'", []string{"--config", writeFile(t, "store: redis\nredis:\n  addr: r:6379\n  password: &Passw0rdS3cret\n")}, nil,
			"Passw0rdS3cret", "line 4: redis.password: its value is a YAML anchor (&…) and nothing after it"},
		{"redis password tagged as a number", []string{"--config", writeFile(t, "store: redis\nredis:\n  addr: r:6379\n  password: !!int Passw0rdS3cret\n")}, nil,
			"Passw0rdS3cret", "line 4: redis.password: its value, tagged !!int, is not one (not shown: a secret)"},
		// A Secret made from a file keeps its last newline, and Redis
		// took it as part of the password (WRONGPASS, nothing more).
		{"redis password from the environment with a newline", nil, map[string]string{"CUBEPROXY_STORE": "redis", "CUBEPROXY_REDIS_ADDR": "r:6379", "CUBEPROXY_REDIS_PASSWORD": "Passw0rdS3cret\n"},
			"Passw0rdS3cret", "redis.password has blanks around it (not shown: a secret)"},
		{"sentinel password in the file with a space", []string{"--config", writeFile(t, "store: redis\nredis:\n  sentinel:\n    master_name: m\n    addrs: ['r:26379']\n    password: ' Passw0rdS3cret'\n")}, nil,
			"Passw0rdS3cret", "redis.sentinel.password has blanks around it"},
		// Kubernetes leaves $(NAME) as written when NAME is undefined or
		// defined later in the list: it was sent as the password.
		{"redis password $(NAME) from the environment", nil, map[string]string{"CUBEPROXY_STORE": "redis", "CUBEPROXY_REDIS_ADDR": "r:6379", "CUBEPROXY_REDIS_PASSWORD": "$(Passw0rdLooksLikeAVar)"},
			"Passw0rdLooksLikeAVar", "redis.password has the shape of a reference to an environment variable"},
		{"sentinel password ${NAME} in yaml", []string{"--config", writeFile(t, "store: redis\nredis:\n  sentinel:\n    master_name: m\n    addrs: ['r:26379']\n    password: ${Passw0rdLooksLikeAVar}\n")}, nil,
			"Passw0rdLooksLikeAVar", "set CUBEPROXY_REDIS_SENTINEL_PASSWORD to the password's value"},
		// In a flow mapping a ',' ends a value: the rest of a secret with
		// a comma was read as a key, which the refusal named.
		{"redis password with a comma in a flow mapping", []string{"--config", writeFile(t, "store: redis\nredis: {addr: 'r:6379', password: Xy9k,Pq7S3cretRest}\n")}, nil,
			"Pq7S3cretRest", "line 2: a key that names no setting, on a line that holds a secret's value (not shown"},
		{"admin token with two commas in a flow mapping", []string{"--config", writeFile(t, "{admin_token: a,Tok3nS3cretRest, Tok3nS3cretRest}\n")}, nil,
			"Tok3nS3cretRest", "line 1: a key that is written twice, on a line that holds a secret's value"},
		{"dns option secret given a section", []string{"--config", writeFile(t, "tls:\n  acme:\n    dns:\n      options: K3ySecretValueAbcdef\n")}, nil,
			"K3ySecretValueAbcdef", "line 4: tls.acme.dns.options: want a map of name: value lines, got a string (not shown: a secret)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Load(tc.args, env(tc.env), io.Discard)
			if err == nil {
				t.Fatal("loaded")
			}
			msg := err.Error()
			for _, s := range []string{tc.secret, tc.secret[:min(7, len(tc.secret))]} {
				if strings.Contains(msg, s) {
					t.Errorf("error %q\nshows the secret (%q)", msg, s)
				}
			}
			if !strings.Contains(msg, tc.want) {
				t.Errorf("error %q\ndoes not say %q", msg, tc.want)
			}
		})
	}
}

// An argument left over after a secret's flag is likely part of the
// secret (--admin-token= s3cret, or a value with a space given unquoted),
// and so is one that sets a secret by name (a variable written as an
// argument): the refusal does not quote it.
func TestStrayArgumentHidesSecrets(t *testing.T) {
	for _, args := range [][]string{
		{"--admin-token=", "Str4ySecretValue"},
		{"--admin-token", "first", "Str4ySecretValue"},
		{"--auth-signing-keys=k1", "Str4ySecretValue"},
		{"CUBEPROXY_ADMIN_TOKEN=Str4ySecretValue"},
		{"--http-addr=:1", "admin_token=Str4ySecretValue"},
	} {
		_, err := Load(args, env(nil), io.Discard)
		if err == nil || !strings.Contains(err.Error(), "unexpected argument") || strings.Contains(err.Error(), "Str4y") {
			t.Errorf("%q: %v; want an unexpected argument not shown", args, err)
		}
	}
	// Any other is quoted, as before: one after a secret's flag that
	// carried its value (--admin-token=t0ken) and another flag is not
	// the secret's.
	if _, err := Load([]string{"--admin-token=t0ken", "--http-addr=:1", "extra"}, env(nil), io.Discard); err == nil || !strings.Contains(err.Error(), `unexpected argument "extra"`) {
		t.Errorf("extra after a secret given whole: %v", err)
	}
	if _, err := Load([]string{"--http-addr=:1", "extra"}, env(nil), io.Discard); err == nil || !strings.Contains(err.Error(), `unexpected argument "extra"`) {
		t.Errorf("extra: %v", err)
	}
}
