package proxy

import "testing"

func TestHTTPSAuthority(t *testing.T) {
	for _, tc := range []struct{ host, port, want string }{
		{"50005-abc.cube.test", "", "50005-abc.cube.test"},
		{"50005-abc.cube.test:8081", "", "50005-abc.cube.test"},
		{"50005-abc.cube.test:8081", "8443", "50005-abc.cube.test:8443"},
		{"10.0.0.1:80", "8443", "10.0.0.1:8443"},
		{"[2001:db8::1]:8081", "8443", "[2001:db8::1]:8443"},
		{"[2001:db8::1]:8081", "", "[2001:db8::1]"},
		{"[2001:db8::1]", "8443", "[2001:db8::1]:8443"},
		{"[2001:db8::1]", "", "[2001:db8::1]"},
	} {
		if got := httpsAuthority(tc.host, tc.port); got != tc.want {
			t.Errorf("httpsAuthority(%q, %q) = %q, want %q", tc.host, tc.port, got, tc.want)
		}
	}
}
