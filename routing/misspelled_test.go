package routing

import (
	"errors"
	"strings"
	"testing"
)

// TestMisspelledFieldIsNamed: a route field typed in another case or
// spelling (HostIp, host_ip, trafficAccessToken) in routes.yaml or an
// admin body is refused naming the field as typed and the one it most
// likely meant. The smallest field name's error is the one reported, and
// "HostIP" sorts before "HostIp": such a file was refused with "route
// field HostIP: required", naming a field its author could see written
// on the next line, and never the misspelling.
func TestMisspelledFieldIsNamed(t *testing.T) {
	for _, tc := range []struct {
		name, file string
		want       string
	}{
		{"HostIp", "routes:\n  a:\n    HostIp: 1.2.3.4\n    \"3000\": \"3000\"\n",
			`route field HostIp: unknown field (did you mean HostIP?)`},
		{"host_ip", "routes:\n  a:\n    host_ip: 1.2.3.4\n",
			`route field host_ip: unknown field (did you mean HostIP?)`},
		{"trafficAccessToken", "routes:\n  a:\n    HostIP: 1.2.3.4\n    AllowPublicTraffic: \"false\"\n    trafficAccessToken: " + testToken + "\n",
			`route field trafficAccessToken: unknown field (did you mean TrafficAccessToken?)`},
		// Longer than the field it means, by its separators.
		{"traffic_access_token", "routes:\n  a:\n    HostIP: 1.2.3.4\n    AllowPublicTraffic: \"false\"\n    traffic_access_token: " + testToken + "\n",
			`route field traffic_access_token: unknown field (did you mean TrafficAccessToken?)`},
		{"sandboxIP", "routes:\n  a:\n    HostIP: 1.2.3.4\n    sandboxIP: 1.2.3.5\n",
			`route field sandboxIP: unknown field (did you mean SandboxIP?)`},
		{"a field of no known name", "routes:\n  a:\n    HostIP: 1.2.3.4\n    Foo: x\n",
			`route field Foo: unknown field`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := LoadFile(writeFile(t, tc.file))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("LoadFile: %v, want it to hold %q", err, tc.want)
			}
			if strings.Contains(err.Error(), "required") {
				t.Fatalf("LoadFile: %v, names a required field where the file misspelled it", err)
			}
		})
	}
	// Read from Redis, where unknown fields are ignored (the control
	// plane may add some), a hash without HostIP stays one without it.
	_, err := ParseRoute("a", map[string]string{"HostIp": "1.2.3.4"})
	var fe *FieldError
	if !errors.As(err, &fe) || fe.Field != FieldHostIP || fe.Reason != "required" {
		t.Fatalf("ParseRoute without HostIP: %v, want HostIP required", err)
	}
}
