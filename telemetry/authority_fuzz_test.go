package telemetry

import (
	"bytes"
	"net"
	"strconv"
	"testing"
)

// FuzzSplitAuthority holds splitAuthority, which reads the client's Host
// header (or absolute-form target) into every span's server.address and
// server.port, to net.SplitHostPort wherever that accepts the authority
// with a port number, and to its own contract elsewhere: any non-empty
// bytes give a host within them and a port of 0 (none), -1 (not a port
// number) or 1..65535; and a host and port joined as a client writes them
// come back apart.
func FuzzSplitAuthority(f *testing.F) {
	for _, s := range []string{
		"8080-abc.cube.test", "8080-abc.cube.test:8443", "8080-abc.cube.test:", "8080-abc.cube.test:99999",
		"8080-abc.cube.test:0", "8080-abc.cube.test:8a", "10.0.0.1:81", "[::1]:9001", "[::1]", "::1", "[::1",
		"[", "[]", "[]:", ":", "[::1]x:80", "a]:80", "h:00080",
	} {
		f.Add([]byte(s), uint16(443))
	}
	f.Fuzz(func(t *testing.T, a []byte, p uint16) {
		if len(a) > 0 {
			host, port := splitAuthority(a)
			if !bytes.Contains(a, host) || port < -1 || port > 65535 {
				t.Fatalf("splitAuthority(%q) = %q, %d", a, host, port)
			}
			if h, ps, err := net.SplitHostPort(string(a)); err == nil {
				if n, err := strconv.Atoi(ps); err == nil && len(ps) <= 5 && n >= 1 && n <= 65535 && ps[0] != '+' && ps[0] != '-' {
					if string(host) != h || port != n {
						t.Fatalf("splitAuthority(%q) = %q, %d; net.SplitHostPort: %q, %d", a, host, port, h, n)
					}
				}
			}
		}
		// The authority a client writes for host a and port p.
		if p == 0 || len(a) == 0 || bytes.IndexByte(a, ']') >= 0 {
			return
		}
		in := string(a) + ":" + strconv.Itoa(int(p))
		if bytes.IndexByte(a, ':') >= 0 || a[0] == '[' {
			in = "[" + string(a) + "]:" + strconv.Itoa(int(p))
		}
		if host, port := splitAuthority([]byte(in)); string(host) != string(a) || port != int(p) {
			t.Fatalf("splitAuthority(%q) = %q, %d; want %q, %d", in, host, port, a, p)
		}
	})
}
