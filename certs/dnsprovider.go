package certs

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/caddyserver/certmagic"

	"github.com/cube-sandbox/cubeproxy/certs/rfc2136"
	"github.com/cube-sandbox/cubeproxy/internal/namedfile"
)

// dnsProviders maps DNSConfig.Provider to a constructor that turns
// DNSConfig.Options into a libdns provider (AppendRecords + DeleteRecords).
//
// Adding a provider is one entry: import any libdns v1 provider package and
// map the options onto its struct, for example
//
//	"cloudflare": func(o map[string]string) (certmagic.DNSProvider, error) {
//		return &cloudflare.Provider{APIToken: o["api_token"]}, nil
//	},
var dnsProviders = map[string]func(opts map[string]string) (certmagic.DNSProvider, error){
	"rfc2136": newRFC2136,
}

// newDNSProvider builds the provider named in the configuration.
func newDNSProvider(name string, opts map[string]string) (certmagic.DNSProvider, error) {
	build, ok := dnsProviders[strings.ToLower(name)]
	if !ok {
		return nil, fmt.Errorf("tls.acme.dns.provider %q is unknown (known: %s)", name, strings.Join(slices.Sorted(maps.Keys(dnsProviders)), ", "))
	}
	p, err := build(opts)
	if err != nil {
		return nil, fmt.Errorf("tls.acme.dns.options: %w", err)
	}
	return p, nil
}

// newRFC2136 reads: server (host:port, required), key_name, key_alg
// (default hmac-sha256), key_secret or key_secret_file (base64), net
// (udp|tcp) and timeout (Go duration).
func newRFC2136(opts map[string]string) (certmagic.DNSProvider, error) {
	if err := knownOptions(opts, "server", "key_name", "key_alg", "key_secret", "key_secret_file", "net", "timeout"); err != nil {
		return nil, err
	}
	if opts["key_name"] == "" {
		// rfc2136 sends unsigned updates without a key name: the secret
		// would be ignored, and a server that wants TSIG refuses every
		// update, at the first order, after the proxy listens.
		for _, k := range []string{"key_secret", "key_secret_file", "key_alg"} {
			if opts[k] != "" {
				return nil, fmt.Errorf("%s is set but key_name is empty: the updates would go unsigned; set key_name (the TSIG key's name), or remove %s", k, k)
			}
		}
	}
	// Compared folded, as every word setting is, and refused as written:
	// the provider's own check sees only the folded word.
	if n := strings.ToLower(opts["net"]); n != "" && n != "udp" && n != "tcp" {
		return nil, fmt.Errorf("rfc2136: net must be udp or tcp, got %q", opts["net"])
	}
	p := &rfc2136.Provider{
		Server:    opts["server"],
		KeyName:   opts["key_name"],
		KeyAlg:    opts["key_alg"],
		KeySecret: opts["key_secret"],
		Net:       strings.ToLower(opts["net"]),
	}
	if f := opts["key_secret_file"]; f != "" {
		b, err := namedfile.Read(f, namedfile.MaxSmall)
		if err != nil {
			return nil, fmt.Errorf("read key_secret_file: %w", err)
		}
		p.KeySecret = strings.TrimSpace(string(b))
	}
	if t := opts["timeout"]; t != "" {
		d, err := time.ParseDuration(t)
		if err != nil {
			return nil, fmt.Errorf("option timeout: %w", err)
		}
		p.Timeout = d
	}
	if err := p.Validate(); err != nil {
		return nil, err
	}
	return p, nil
}

// knownOptions rejects option keys a provider does not read (typos).
func knownOptions(opts map[string]string, known ...string) error {
	for k := range opts {
		if !slices.Contains(known, k) {
			return fmt.Errorf("unknown option %q (known: %s)", k, strings.Join(known, ", "))
		}
	}
	return nil
}
