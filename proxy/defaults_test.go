package proxy

import (
	"testing"
	"time"
)

// The numbers DESIGN.md states as the platform's defaults (request
// pipeline, step 5), which cmd/cubeproxy leaves to the proxy when the
// operator sets nothing. No behavioural test waits 3 s for a connect, two
// hours for an idle stream or sends 256 MiB, so without this a changed
// default would pass every other test.
func TestContractDefaults(t *testing.T) {
	var c Config
	c.setDefaults()
	for _, tc := range []struct {
		name      string
		got, want int64
	}{
		{"MaxRequestBodySize (uploads up to 256 MiB)", c.MaxRequestBodySize, 256 << 20},
		{"ConnectTimeout (connect timeout 3 s)", int64(c.ConnectTimeout), int64(3 * time.Second)},
		{"IdleStreamTimeout (idle stream timeout 7206 s)", int64(c.IdleStreamTimeout), int64(7206 * time.Second)},
	} {
		if tc.got != tc.want {
			t.Errorf("%s: default %d, want %d", tc.name, tc.got, tc.want)
		}
	}

	// A value the operator set is kept.
	set := Config{MaxRequestBodySize: 1, ConnectTimeout: time.Millisecond, IdleStreamTimeout: time.Second}
	set.setDefaults()
	if set.MaxRequestBodySize != 1 || set.ConnectTimeout != time.Millisecond || set.IdleStreamTimeout != time.Second {
		t.Errorf("set values overridden by defaults: %+v", set)
	}
}

// The client-side timeouts a drop-in replacement for the platform's nginx
// 1.22 must keep: its client_header_timeout (60 s, which also bounds the
// TLS handshake and a new connection's wait for its first byte),
// client_body_timeout, send_timeout (60 s each) and keepalive_timeout
// (75 s in the platform's config, nginx's default too). Measured against
// the built binary: with 30 s for the head, a connection opened and used
// 45 s later got a 408 where nginx answered 200, and with 90 s of
// keep-alive a connection was held 15 s after nginx's was closed.
func TestClientTimeoutsAreNginxs(t *testing.T) {
	c := ServerConfig{}.WithDefaults()
	for _, tc := range []struct {
		name      string
		got, want time.Duration
	}{
		{"ClientReadTimeout (client_header_timeout)", c.ClientReadTimeout, 60 * time.Second},
		{"ClientBodyTimeout (client_body_timeout)", c.ClientBodyTimeout, 60 * time.Second},
		{"ClientWriteTimeout (send_timeout)", c.ClientWriteTimeout, 60 * time.Second},
		{"ClientIdleTimeout (keepalive_timeout)", c.ClientIdleTimeout, 75 * time.Second},
	} {
		if tc.got != tc.want {
			t.Errorf("%s: default %v, want nginx's %v", tc.name, tc.got, tc.want)
		}
	}
}
