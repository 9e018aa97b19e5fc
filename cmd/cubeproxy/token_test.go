package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/auth"
)

// tokenHex returns n random bytes as hex.
func tokenHex(t *testing.T, n int) string {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

// tokenEnv is a getenv that knows only the given variables.
func tokenEnv(vars map[string]string) func(string) string {
	return func(k string) string { return vars[k] }
}

// tokenSign runs `cubeproxy token sign` with args and returns exit code,
// stdout and stderr.
func tokenSign(getenv func(string) string, args ...string) (int, string, string) {
	var out, errb bytes.Buffer
	code := run(context.Background(), append([]string{"token", "sign"}, args...), getenv, &out, &errb)
	return code, out.String(), errb.String()
}

func TestTokenSign(t *testing.T) {
	k1, k2 := tokenHex(t, 32), tokenHex(t, 20)
	env := tokenEnv(map[string]string{"CUBEPROXY_AUTH_SIGNING_KEYS": k1 + "," + k2})
	before := time.Now()
	code, out, errOut := tokenSign(env, "--sandbox", "box", "--port", "8080", "--ttl", "5m")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	if strings.Count(out, "\n") != 1 || !strings.HasSuffix(out, "\n") {
		t.Fatalf("stdout must be the token on one line, got %q", out)
	}
	tok := strings.TrimSpace(out)
	for _, s := range []string{tok, k1, k2} {
		if strings.Contains(errOut, s) {
			t.Errorf("stderr repeats a secret: %q", errOut)
		}
	}
	if !strings.Contains(errOut, "8080-box.") || !strings.Contains(errOut, auth.QueryParamName+"=") {
		t.Errorf("stderr should say how to use the token: %q", errOut)
	}
	// With domains configured the line names the first one, ready to copy,
	// also when it is written as a wildcard (the URL used to read
	// https://8080-box.*.sbx.example.com/, which reaches nothing).
	for _, domains := range []string{"sbx.example.com,alt.example.com", "*.sbx.example.com", ".sbx.example.com"} {
		env2 := tokenEnv(map[string]string{"CUBEPROXY_AUTH_SIGNING_KEYS": k1, "CUBEPROXY_DOMAINS": domains})
		if code, _, errOut := tokenSign(env2, "--sandbox", "box", "--port", "8080"); code != 0 || !strings.Contains(errOut, "open https://8080-box.sbx.example.com/?"+auth.QueryParamName+"=<token>") {
			t.Errorf("domains %q: exit %d, stderr %q: want the URL on the first configured domain", domains, code, errOut)
		}
	}

	signer := func(keys ...string) *auth.Signer {
		s, err := auth.NewSigner(keys)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	exp, err := signer(k1, k2).Verify(tok, "box", 8080, time.Now())
	if err != nil {
		t.Fatalf("the printed token does not verify for box/8080: %v", err)
	}
	// Rounded up to a whole second: at least the ttl, less than a second more.
	if lo, hi := before.Add(5*time.Minute), time.Now().Add(5*time.Minute+time.Second); exp.Before(lo) || exp.After(hi) {
		t.Errorf("expiry %v, want 5m from now, rounded up to a second", exp)
	}
	if _, err := signer(k1).Verify(tok, "box", 8080, time.Now()); err != nil {
		t.Errorf("the first key must sign: %v", err)
	}
	for _, tc := range []struct {
		name string
		s    *auth.Signer
		id   string
		port uint16
		now  time.Time
		code string
	}{
		{"another port", signer(k1, k2), "box", 8081, time.Now(), auth.CodeSignedTokenWrongTarget},
		{"another sandbox", signer(k1, k2), "boxx", 8080, time.Now(), auth.CodeSignedTokenWrongTarget},
		{"after the ttl", signer(k1, k2), "box", 8080, time.Now().Add(5*time.Minute + time.Second), auth.CodeSignedTokenExpired},
		{"second key only", signer(k2), "box", 8080, time.Now(), auth.CodeSignedTokenInvalid},
	} {
		_, err := tc.s.Verify(tok, tc.id, tc.port, tc.now)
		var rej *auth.Rejection
		if !errors.As(err, &rej) || rej.Code != tc.code {
			t.Errorf("%s: got %v, want %s", tc.name, err, tc.code)
		}
	}

	// A port with leading zeros is the decimal number, as the traffic
	// parser reads a Host's (03000-box is port 3000): flag.Int read it as
	// octal, and signed 03000 for port 1536, the URL printed for it
	// reaching another port.
	code, out, errOut = tokenSign(env, "--sandbox", "box", "--port", "03000")
	if code != 0 || !strings.Contains(errOut, "open https://3000-box.") {
		t.Fatalf("--port 03000: exit %d, stderr %q, want the token for port 3000", code, errOut)
	}
	if _, err := signer(k1).Verify(strings.TrimSpace(out), "box", 3000, time.Now()); err != nil {
		t.Errorf("--port 03000: the token does not verify for port 3000: %v", err)
	}

	// Default TTL 10m; keys from the config file.
	cfgFile := filepath.Join(t.TempDir(), "cubeproxy.yaml")
	if err := os.WriteFile(cfgFile, []byte(fmt.Sprintf("auth:\n  signing_keys: [%q]\n", k2+k1)), 0o600); err != nil {
		t.Fatal(err)
	}
	code, out, errOut = tokenSign(tokenEnv(nil), "--config", cfgFile, "--sandbox", "sb-2", "--port", "49983")
	if code != 0 {
		t.Fatalf("config file keys: exit %d: %s", code, errOut)
	}
	exp, err = signer(k2+k1).Verify(strings.TrimSpace(out), "sb-2", 49983, time.Now())
	if err != nil || time.Until(exp) < 9*time.Minute || time.Until(exp) > 10*time.Minute+time.Second {
		t.Errorf("default ttl: %v %v", exp, err)
	}
}

func TestTokenSignErrors(t *testing.T) {
	short := "short-" + tokenHex(t, 4)
	good := tokenEnv(map[string]string{"CUBEPROXY_AUTH_SIGNING_KEYS": tokenHex(t, 32)})
	for _, tc := range []struct {
		name   string
		getenv func(string) string
		args   []string
		want   string
		code   int // 2 for a command line that says too little, 1 for what it says refused
	}{
		{"no keys", noEnv, []string{"--sandbox", "box", "--port", "8080", "--ttl", "5m"}, "no signing keys", 1},
		{"short key", tokenEnv(map[string]string{"CUBEPROXY_AUTH_SIGNING_KEYS": short}), []string{"--sandbox", "box", "--port", "8080"}, "key 1", 1},
		// What is wrong, said as such: "required" for a value given puzzled.
		{"no sandbox", good, []string{"--port", "8080"}, "--sandbox (a sandbox id) is required", 2},
		{"no port", good, []string{"--sandbox", "box"}, "--port (1-65535) is required", 2},
		{"neither", good, nil, "--sandbox (a sandbox id) is required", 2},
		// The command line is read before the keys: with none configured
		// it is still the usage error (exit 2), not "no signing keys".
		{"no sandbox, no keys", noEnv, []string{"--port", "8080"}, "--sandbox (a sandbox id) is required", 2},
		{"no port, no keys", noEnv, []string{"--sandbox", "box"}, "--port (1-65535) is required", 2},
		{"neither, no keys", noEnv, nil, "--sandbox (a sandbox id) is required", 2},
		{"empty sandbox", good, []string{"--sandbox", "", "--port", "8080"}, `--sandbox "" is not a sandbox id`, 1},
		{"bad sandbox id", good, []string{"--sandbox", "Box!", "--port", "8080"}, `--sandbox "Box!" is not a sandbox id`, 1},
		{"port 0", good, []string{"--sandbox", "box", "--port", "0"}, "--port 0 is not a port (1-65535)", 1},
		{"negative port", good, []string{"--sandbox", "box", "--port", "-1"}, "--port -1 is not a port (1-65535)", 1},
		{"port too big", good, []string{"--sandbox", "box", "--port", "65536"}, "--port 65536 is not a port", 1},
		{"ttl too long", good, []string{"--sandbox", "box", "--port", "8080", "--ttl", "48h"}, "ttl", 1},
		// A lifetime written without --ttl would be dropped for the default.
		{"stray argument", good, []string{"--sandbox", "box", "--port", "8080", "1h"}, `unexpected argument "1h"`, 2},
	} {
		code, out, errOut := tokenSign(tc.getenv, tc.args...)
		if code != tc.code || out != "" || !strings.Contains(errOut, tc.want) || !strings.HasPrefix(errOut, "cubeproxy:") {
			t.Errorf("%s: exit %d, stdout %q, stderr %q; want exit %d with an error naming %q", tc.name, code, out, errOut, tc.code, tc.want)
		}
		if strings.Contains(errOut, short) {
			t.Errorf("%s: the error repeats the key", tc.name)
		}
	}
	// A value not of the flag's kind is a command line the program cannot
	// read (exit 2, the flag package's usage first), as --cache-size=abc
	// is for serve and --timeout 5 for health: decimal only for --port
	// (flag.Int read 0x50 as port 80), a duration with its unit for --ttl
	// (which exited 1, as a lifetime read and refused). One read but out
	// of range (--ttl 48h, above) stays 1.
	for _, tc := range []struct{ flag, value string }{{"port", "0x50"}, {"ttl", "soon"}, {"ttl", "30"}} {
		code, out, errOut := tokenSign(good, "--sandbox", "box", "--port", "8080", "--"+tc.flag, tc.value)
		if want := `invalid value "` + tc.value + `" for flag -` + tc.flag; code != 2 || out != "" || !strings.Contains(errOut, want) {
			t.Errorf("--%s %s: exit %d, stdout %q, stderr %q; want exit 2 refusing the value (%q)", tc.flag, tc.value, code, out, errOut, want)
		}
	}
	var out, errb bytes.Buffer
	if code := run(context.Background(), []string{"token"}, noEnv, &out, &errb); code != 2 || !strings.Contains(errb.String(), "usage: cubeproxy token sign") {
		t.Errorf("token without sign: exit %d %q", code, errb.String())
	}
}

// The whole program: a token from `cubeproxy token sign` and one from
// POST /admin/tokens open a restricted sandbox in a browser flow, with the
// keys, admin token and traffic token coming from the environment, and
// none of those values reaches the logs.
func TestSignedTokenThroughServe(t *testing.T) {
	type seen struct{ uri, cookie string }
	got := make(chan seen, 16)
	port := sandboxServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- seen{r.URL.RequestURI(), r.Header.Get("Cookie")}
		io.WriteString(w, "hi from sandbox")
	}))

	newKey, oldKey := tokenHex(t, 32), tokenHex(t, 32)
	adminTok, traffic := "adm-"+tokenHex(t, 16), tokenHex(t, 32)
	dir := t.TempDir()
	routes := filepath.Join(dir, "routes.yaml")
	os.WriteFile(routes, []byte(fmt.Sprintf("routes:\n  box:\n    HostIP: \"127.0.0.1\"\n    AllowPublicTraffic: \"false\"\n    TrafficAccessToken: %q\n    \"8080\": \"%d\"\n", traffic, port)), 0o600)
	accessPath := filepath.Join(dir, "access.log")
	env := tokenEnv(map[string]string{
		"CUBEPROXY_AUTH_SIGNING_KEYS": newKey + "," + oldKey,
		"CUBEPROXY_ADMIN_TOKEN":       adminTok,
	})
	r := runServe(t, []string{"--http-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0", "--routes", routes,
		"--log-level", "debug", "--access-log-path", accessPath, "--drain-timeout", "1s"}, env)
	a, logs, stop := r.a, r.logs, r.stop

	client := &http.Client{
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		Timeout:       10 * time.Second,
	}
	get := func(uri, cookie string) (*http.Response, string) {
		t.Helper()
		req, _ := http.NewRequest("GET", "http://"+a.httpLn.Addr().String()+uri, nil)
		req.Host = "8080-box.cube.test"
		if cookie != "" {
			req.Header.Set("Cookie", cookie)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, string(b)
	}
	// browse trades tok for the cookie and uses it, as a browser would.
	browse := func(what, tok string) {
		t.Helper()
		resp, body := get("/page?cube_token="+tok+"&y=1", "")
		c := resp.Cookies()
		if resp.StatusCode != 302 || resp.Header.Get("Location") != "/page?y=1" || len(c) != 1 || c[0].Name != auth.CookieName || !strings.HasPrefix(c[0].Value, tok+".") {
			t.Fatalf("%s: got %d %q %q %q, want 302 with the cookie", what, resp.StatusCode, resp.Header.Get("Location"), resp.Header.Values("Set-Cookie"), body)
		}
		resp, body = get("/page?y=1", "lang=en; "+c[0].Name+"="+c[0].Value)
		if resp.StatusCode != 200 || body != "hi from sandbox" {
			t.Fatalf("%s: with the cookie: %d %q", what, resp.StatusCode, body)
		}
		if s := <-got; s.uri != "/page?y=1" || s.cookie != "lang=en" {
			t.Errorf("%s: the sandbox saw %+v, want the URL and cookies without the proxy's token", what, s)
		}
	}

	if resp, body := get("/", ""); resp.StatusCode != 403 || !strings.Contains(body, auth.CodeTrafficTokenMissing) {
		t.Fatalf("restricted sandbox without credentials: %d %q", resp.StatusCode, body)
	}

	code, out, errOut := tokenSign(env, "--sandbox", "box", "--port", "8080", "--ttl", "5m")
	if code != 0 {
		t.Fatalf("token sign: %d %s", code, errOut)
	}
	cliTok := strings.TrimSpace(out)
	browse("cli token", cliTok)

	oldOnly := tokenEnv(map[string]string{"CUBEPROXY_AUTH_SIGNING_KEYS": oldKey})
	code, out, _ = tokenSign(oldOnly, "--sandbox", "box", "--port", "8080")
	if code != 0 {
		t.Fatal("token sign with the old key failed")
	}
	oldTok := strings.TrimSpace(out)
	browse("old key still listed", oldTok)

	adminPost := func(token string) (int, string) {
		req, _ := http.NewRequest("POST", "http://"+a.adminLn.Addr().String()+"/admin/tokens", strings.NewReader(`{"sandbox_id":"box","port":8080,"ttl":"2m"}`))
		if token != "" {
			req.Header.Set(auth.HeaderAdminToken, token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if st, _ := adminPost(""); st != 403 {
		t.Errorf("POST /admin/tokens without the admin token: %d", st)
	}
	if st, _ := adminPost(adminTok[:len(adminTok)-1]); st != 403 {
		t.Errorf("POST /admin/tokens with a wrong admin token: %d", st)
	}
	st, body := adminPost(adminTok)
	var issued struct {
		Token string `json:"token"`
	}
	if st != 200 || json.Unmarshal([]byte(body), &issued) != nil || issued.Token == "" {
		t.Fatalf("POST /admin/tokens: %d %s", st, body)
	}
	browse("admin token", issued.Token)

	// The traffic token still works alongside.
	req, _ := http.NewRequest("GET", "http://"+a.httpLn.Addr().String()+"/t", nil)
	req.Host = "8080-box.cube.test"
	req.Header.Set("E2b-Traffic-Access-Token", traffic)
	if resp, err := client.Do(req); err != nil || resp.StatusCode != 200 {
		t.Fatalf("traffic token: %v %v", err, resp)
	} else {
		resp.Body.Close()
		<-got
	}

	stop()
	access, err := os.ReadFile(accessPath)
	if err != nil {
		t.Fatal(err)
	}
	all := logs.String() + string(access)
	if !strings.Contains(string(access), "cube_token=REDACTED") || !strings.Contains(string(access), auth.CodeTrafficTokenMissing) {
		t.Errorf("access log does not show the token requests:\n%s", access)
	}
	for i, s := range []string{newKey, oldKey, adminTok, traffic, cliTok, oldTok, issued.Token} {
		if strings.Contains(all, s) {
			t.Errorf("secret %d appears in the logs:\n%s", i, all)
		}
	}
}

// A signing key too short for the signer is refused as serve refuses it:
// naming the setting and the variable that set it, never the key.
func TestTokenSignNamesTheKeysOrigin(t *testing.T) {
	const short = "hunter2"
	code, _, errOut := tokenSign(tokenEnv(map[string]string{"CUBEPROXY_AUTH_SIGNING_KEYS": short}), "--sandbox", "box", "--port", "8080")
	want := "cubeproxy: auth.signing_keys: signed tokens: key 1 is 7 bytes, need at least 32 (auth.signing_keys is set by CUBEPROXY_AUTH_SIGNING_KEYS)\n"
	if code != 1 || !strings.HasPrefix(errOut, want) || strings.Contains(errOut, short) {
		t.Fatalf("exit %d, stderr %q; want 1 and %q", code, errOut, want)
	}
}
