package config

import "testing"

// node_ip is compared with each route's HostIP, and a route may carry no
// IPv6 zone: a node_ip with one never matched, and routes on this node
// were dialed through their host port instead of SandboxIP, silently;
// so with the unspecified address, which a listener reads as "every
// address of this node".
func TestNodeIP(t *testing.T) {
	for _, tc := range []struct {
		name string
		ip   string
		want string // "" loads
	}{
		{"unset", "", ""},
		{"IPv4", "10.0.0.5", ""},
		{"IPv6", "2001:db8::5", ""},
		{"IPv4-mapped", "::ffff:10.0.0.5", ""},
		{"link-local with a zone", "fe80::1%eth0",
			`node_ip "fe80::1%eth0": an IPv6 zone (%eth0) never equals a route's HostIP, which carries none`},
		{"global with a zone", "2001:db8::5%2", `node_ip "2001:db8::5%2": an IPv6 zone (%2)`},
		{"not an address", "node-7", `node_ip "node-7": `},
		// "Every address of this node", as a listener reads it: no route
		// names it as HostIP, so none was dialed directly, silently.
		{"unspecified IPv4", "0.0.0.0", `node_ip "0.0.0.0": the unspecified address is no route's HostIP`},
		{"unspecified IPv6", "::", `node_ip "::": the unspecified address is no route's HostIP`},
		// The proxy reads an IPv4-mapped node_ip as the IPv4 address it
		// maps (README), so this one is 0.0.0.0 too.
		{"unspecified IPv4-mapped", "::ffff:0.0.0.0", `node_ip "::ffff:0.0.0.0": the unspecified address is no route's HostIP`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			loadWants(t, "node_ip: '"+tc.ip+"'\n", tc.want)
		})
	}
}
