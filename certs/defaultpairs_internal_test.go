package certs

import (
	"crypto/tls"
	"crypto/x509"
	"net"
	"slices"
	"testing"
)

// The default pairs (the certificates a client without SNI, or naming no
// pair, is chosen among) are the first pair and the later ones that name
// all it names: a pair for other names is never the default, even listed
// before the first's twin, and a first pair that names nothing is the
// default alone rather than every pair's twin. Names compare in any case,
// IP addresses by value.
func TestDefaultPairsAreTheFirstAndItsTwins(t *testing.T) {
	t.Parallel()
	leaf := func(ips []string, names ...string) *tls.Certificate {
		c := &x509.Certificate{DNSNames: names}
		for _, ip := range ips {
			c.IPAddresses = append(c.IPAddresses, net.ParseIP(ip))
		}
		return &tls.Certificate{Leaf: c}
	}
	cube := leaf(nil, "cube.test", "*.cube.test")
	other := leaf(nil, "api.other.test")
	cubeUpper := leaf(nil, "*.CUBE.test", "Cube.Test", "api.cube.test")
	nameless := leaf(nil)
	ip1 := leaf([]string{"10.0.0.1"})
	ip2 := leaf([]string{"10.0.0.2"}, "cube.test")
	ip1Too := leaf([]string{"10.0.0.2", "::ffff:10.0.0.1"}, "cube.test")
	tests := []struct {
		name   string
		loaded []*tls.Certificate
		want   []*tls.Certificate
	}{
		{"a pair for other names listed before the twin", []*tls.Certificate{cube, other, cubeUpper}, []*tls.Certificate{cube, cubeUpper}},
		{"a nameless first pair is alone", []*tls.Certificate{nameless, cube, other}, []*tls.Certificate{nameless}},
		{"IP addresses by value", []*tls.Certificate{ip1, ip2, ip1Too}, []*tls.Certificate{ip1, ip1Too}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var loaded []loadedPair
			for _, c := range tt.loaded {
				loaded = append(loaded, loadedPair{cert: c})
			}
			if got := defaultPairs(loaded); !slices.Equal(got, tt.want) {
				t.Fatalf("defaults %d pairs %v, want %d %v", len(got), got, len(tt.want), tt.want)
			}
		})
	}
}
