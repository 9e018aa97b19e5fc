package config

import (
	"io"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"
)

const tlsExample = "../configs/cubeproxy.tls.yaml"

// The shipped TLS example loads as it is (files source) and, with its
// commented ACME block swapped in for the active tls: section, as the acme
// source: both halves of the example stay valid.
func TestTLSExampleLoads(t *testing.T) {
	raw, err := os.ReadFile(tlsExample)
	if err != nil {
		t.Fatal(err)
	}
	acme := acmeVariant(t, string(raw))

	tests := []struct {
		name  string
		body  string
		check func(t *testing.T, c *Config)
	}{
		{"files source as shipped", string(raw), func(t *testing.T, c *Config) {
			want := TLS{
				Source: "files", Domain: "cube.test", ReloadInterval: 10 * time.Second,
				Files: []TLSFile{{CertFile: "certs/cube.test.pem", KeyFile: "certs/cube.test-key.pem"}},
			}
			if !reflect.DeepEqual(c.TLS, want) {
				t.Fatalf("tls = %+v\nwant %+v", c.TLS, want)
			}
		}},
		{"acme block uncommented", acme, func(t *testing.T, c *Config) {
			a := c.TLS.ACME
			if c.TLS.Source != "acme" || c.TLS.Domain != "cube.test" || len(c.TLS.Files) != 0 {
				t.Fatalf("tls = %+v", c.TLS)
			}
			if a.Email == "" || a.StorageDir == "" || !a.OnDemand || a.SkipWildcard || a.OnDemandRate != 10 ||
				!strings.HasPrefix(a.CA, "https://") {
				t.Fatalf("acme = %+v", a)
			}
			d := a.DNS
			if d.Provider != "rfc2136" || d.PropagationTimeout != 2*time.Minute || len(d.Resolvers) != 1 {
				t.Fatalf("acme.dns = %+v", d)
			}
			for _, k := range []string{"server", "key_name", "key_alg", "key_secret_file", "net", "timeout"} {
				if d.Options[k] == "" {
					t.Errorf("acme.dns.options.%s missing: %v", k, d.Options)
				}
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Load([]string{"--config", writeFile(t, tt.body)}, env(nil), io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			if c.HTTPSAddr != ":8080" || c.HTTPAddr != ":8081" || !reflect.DeepEqual(c.Domains, []string{"cube.test"}) {
				t.Fatalf("listeners/domains: https %q http %q domains %v", c.HTTPSAddr, c.HTTPAddr, c.Domains)
			}
			tt.check(t, c)
		})
	}
}

// acmeVariant replaces the active tls: section (the last top-level key of
// the example) with the commented "#tls:" block, minus one '#' per line.
func acmeVariant(t *testing.T, raw string) string {
	t.Helper()
	lines := strings.Split(raw, "\n")
	active, block := -1, -1
	for i, l := range lines {
		switch l {
		case "tls:":
			active = i
		case "#tls:":
			block = i
		}
	}
	if active < 0 || block < active {
		t.Fatalf("%s: want an active tls: section followed by a commented #tls: block", tlsExample)
	}
	out := append([]string(nil), lines[:active]...)
	for _, l := range lines[block:] {
		if !strings.HasPrefix(l, "#") {
			break
		}
		out = append(out, l[1:])
	}
	return strings.Join(out, "\n") + "\n"
}
