package config

import "testing"

// The DNS-01 servers are dialed only at the first order, after the proxy
// listens: a form no dial accepts must be refused at start (and by check).
func TestDNSAddressesAreDialable(t *testing.T) {
	const acme = "https_addr: ':8443'\ntls:\n  source: acme\n  acme:\n    email: ops@cube.test\n    dns:\n      provider: rfc2136\n"
	for _, tc := range []struct {
		name, yaml, want string
	}{
		{"resolver port above 65535", acme + "      resolvers: ['1.1.1.1:99999']\n", `an entry of tls.acme.dns.resolvers "1.1.1.1:99999": port 99999 is above 65535`},
		{"resolver port zero", acme + "      resolvers: ['1.1.1.1:0']\n", `an entry of tls.acme.dns.resolvers "1.1.1.1:0": port 0 cannot be dialed`},
		{"resolver empty port", acme + "      resolvers: ['1.1.1.1:']\n", `an entry of tls.acme.dns.resolvers "1.1.1.1:": port 0 cannot be dialed`},
		{"server port above 65535", acme + "      options:\n        server: 'ns1.cube.test:99999'\n", `tls.acme.dns.options.server "ns1.cube.test:99999": port 99999 is above 65535`},
		{"server without a port", acme + "      options:\n        server: ns1.cube.test\n", `tls.acme.dns.options.server "ns1.cube.test": address ns1.cube.test: missing port in address`},
		{"resolvers without a port (certmagic adds :53)", acme + "      resolvers: [1.1.1.1, '2001:db8::53', ns.cube.test]\n", ""},
		{"resolvers with ports", acme + "      resolvers: ['1.1.1.1:53', '[2001:db8::53]:5353']\n", ""},
		{"server", acme + "      options:\n        server: '[2001:db8::53]:53'\n", ""},
	} {
		t.Run(tc.name, func(t *testing.T) { loadWants(t, tc.yaml, tc.want) })
	}
}
