package main

import (
	"strings"
	"testing"
)

// An ACME refusal names the settings the operator writes (tls.acme.email,
// not "email (ACME account contact)"), says how to set a missing one
// (with its variable, as config's refusals do), and, for a value that
// came from the environment, where it came from: the operator looks for
// it in the file, and the pod spec set it.
func TestCheckACMERefusalsNameKeys(t *testing.T) {
	dir := t.TempDir()
	notPEM := writeTemp(t, dir, "roots.pem", "not a certificate\n")
	for _, tc := range []struct {
		name string
		drop string // a line of the acme section left out
		opts string // tls.acme.dns.options, when not the working ones
		env  map[string]string
		want []string
	}{
		{"no email", "email:", "", nil,
			[]string{"tls.acme.email is empty", "set tls.acme.email (CUBEPROXY_TLS_ACME_EMAIL"}},
		{"email from the environment", "email:", "", map[string]string{"CUBEPROXY_TLS_ACME_EMAIL": "ops"},
			[]string{`tls.acme.email "ops": want one bare address`, "(tls.acme.email is set by CUBEPROXY_TLS_ACME_EMAIL)"}},
		{"no domain", "domain:", "", nil,
			[]string{"tls.domain is empty", "set tls.domain (CUBEPROXY_TLS_DOMAIN"}},
		{"no storage", "storage_dir:", "", nil,
			[]string{"tls.acme.storage_dir is empty", "set tls.acme.storage_dir (CUBEPROXY_TLS_ACME_STORAGE_DIR"}},
		{"storage is a file, from the environment", "storage_dir:", "", map[string]string{"CUBEPROXY_TLS_ACME_STORAGE_DIR": notPEM},
			[]string{"tls.acme.storage_dir " + notPEM + ": " + notPEM + " is not a directory", "(tls.acme.storage_dir is set by CUBEPROXY_TLS_ACME_STORAGE_DIR)"}},
		{"no DNS provider", "provider:", "{}", nil,
			[]string{"tls.acme.dns.provider is empty", "set tls.acme.dns.provider (CUBEPROXY_TLS_ACME_DNS_PROVIDER"}},
		{"unknown DNS provider", "provider:", "", map[string]string{"CUBEPROXY_TLS_ACME_DNS_PROVIDER": "route66"},
			[]string{`tls.acme.dns.provider "route66" is unknown (known: rfc2136)`, "(tls.acme.dns.provider is set by CUBEPROXY_TLS_ACME_DNS_PROVIDER)"}},
		{"DNS option typo", "", "{server: '127.0.0.1:53', keyname: k.}", nil,
			[]string{`tls.acme.dns.options: unknown option "keyname"`}},
		{"DNS option missing", "", "{key_name: k., key_secret: c2VjcmV0}", nil,
			[]string{`tls.acme.dns.options: rfc2136: server address is required`}},
		{"bad CA", "", "", map[string]string{"CUBEPROXY_TLS_ACME_CA": "http://acme.example.com/dir"},
			[]string{"tls.acme.ca http://acme.example.com/dir: certmagic requires https", "(tls.acme.ca is set by CUBEPROXY_TLS_ACME_CA)"}},
		{"bad trusted roots", "", "", map[string]string{"CUBEPROXY_TLS_ACME_TRUSTED_ROOTS_FILE": notPEM},
			[]string{"tls.acme.trusted_roots_file: no certificate in " + notPEM, "(tls.acme.trusted_roots_file is set by CUBEPROXY_TLS_ACME_TRUSTED_ROOTS_FILE)"}},
		{"wildcard skipped, on-demand off", "", "", map[string]string{"CUBEPROXY_TLS_ACME_SKIP_WILDCARD": "true"},
			[]string{"tls.acme.skip_wildcard is on but tls.acme.on_demand is off", "(tls.acme.skip_wildcard is set by CUBEPROXY_TLS_ACME_SKIP_WILDCARD)"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			opts := "{server: '127.0.0.1:53', key_name: k., key_secret: c2VjcmV0}"
			if tc.opts != "" {
				opts = tc.opts
			}
			var body strings.Builder
			for _, l := range []string{
				"http_addr: 127.0.0.1:0", "admin_addr: 127.0.0.1:0", "https_addr: 127.0.0.1:0", "tls:", "  source: acme",
				"  domain: cube.test", "  acme:", "    email: ops@cube.test", "    storage_dir: " + dir,
				"    dns:", "      provider: rfc2136", "      options: " + opts,
			} {
				if tc.drop != "" && strings.HasPrefix(strings.TrimSpace(l), tc.drop) {
					continue
				}
				body.WriteString(l + "\n")
			}
			cfg := writeTemp(t, t.TempDir(), "cubeproxy.yaml", body.String())
			code, stdout, stderr := runCheck(t, func(k string) string { return tc.env[k] }, "--config", cfg)
			if code != 1 || stdout != "" {
				t.Fatalf("exit %d (want 1), stdout %q, stderr %q\nconfig:\n%s", code, stdout, stderr, body.String())
			}
			for _, w := range tc.want {
				if !strings.Contains(stderr, w) {
					t.Errorf("stderr %q\ndoes not say %q", stderr, w)
				}
			}
		})
	}
}
