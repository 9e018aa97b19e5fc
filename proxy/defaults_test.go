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
