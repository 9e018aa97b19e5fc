package config

import (
	"io"
	"testing"
	"time"
)

// lifecycle.sidecar_addr is host:port, as the platform's
// CUBE_SIDECAR_NGX_ADDR: a URL, or an address with no port to dial,
// refuses to start naming the key, rather than answer every paused
// sandbox 503 resume_failed. Empty (the default) is off.
func TestLifecycleSidecarAddrIsDialable(t *testing.T) {
	for _, tc := range []struct {
		name, yaml, want string
	}{
		{"a URL", "lifecycle:\n  sidecar_addr: http://127.0.0.1:8083\n", `lifecycle.sidecar_addr "http://127.0.0.1:8083": want host:port, without scheme or path`},
		{"no port", "lifecycle:\n  sidecar_addr: clm.internal\n", `lifecycle.sidecar_addr "clm.internal": address clm.internal: missing port in address`},
		{"port zero", "lifecycle:\n  sidecar_addr: clm.internal:0\n", `lifecycle.sidecar_addr "clm.internal:0": port 0 cannot be dialed`},
		{"negative timeout", "lifecycle:\n  sidecar_addr: 127.0.0.1:8083\n  resume_timeout: -1s\n", "lifecycle.resume_timeout: -1s is negative"},
		{"host:port", "lifecycle:\n  sidecar_addr: 127.0.0.1:8083\n  resume_timeout: 5s\n", ""},
		{"ipv6", "lifecycle:\n  sidecar_addr: '[::1]:8083'\n", ""},
		// A switch that is off keeps its settings without a word.
		{"timeout alone", "lifecycle:\n  resume_timeout: 5s\n", ""},
	} {
		t.Run(tc.name, func(t *testing.T) { loadWants(t, tc.yaml, tc.want) })
	}
}

// Both settings have their variable and flag, and are off/unset by default.
func TestLifecycleFromEnvAndFlags(t *testing.T) {
	c, err := Load(nil, env(nil), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.Lifecycle.SidecarAddr != "" || c.Lifecycle.ResumeTimeout != 0 {
		t.Fatalf("defaults %+v, want off", c.Lifecycle)
	}
	c, err = Load([]string{"--lifecycle-resume-timeout=7s"}, env(map[string]string{"CUBEPROXY_LIFECYCLE_SIDECAR_ADDR": "10.0.0.2:8083"}), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.Lifecycle.SidecarAddr != "10.0.0.2:8083" || c.Lifecycle.ResumeTimeout != 7*time.Second {
		t.Errorf("lifecycle %+v, want 10.0.0.2:8083 and 7s", c.Lifecycle)
	}
}
