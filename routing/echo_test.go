package routing

import (
	"runtime"
	"strings"
	"testing"
)

// A refused value is quoted in its error cut to maxEcho bytes, and cut
// before it is copied: a route field of megabytes of garbage (from the
// admin API or Redis) cost a copy of all of it per refusal, only to keep
// its first 64 bytes.
func TestEchoCutsBeforeCopying(t *testing.T) {
	huge, digits := strings.Repeat("x", 16<<20), strings.Repeat("9", 16<<20)
	for _, tc := range []struct {
		name string
		call func()
	}{
		{"id", func() { _, _ = ParseRouteStrict(huge, map[string]string{"HostIP": "10.0.0.1"}) }},
		{"CreatedAt", func() { _, _ = ParseRouteStrict("box", map[string]string{"HostIP": "10.0.0.1", "CreatedAt": huge}) }},
		{"HostIP", func() { _, _ = ParseRouteStrict("box", map[string]string{"HostIP": huge}) }},
		{"CreatedAt digits", func() {
			_, _ = ParseRouteStrict("box", map[string]string{"HostIP": "10.0.0.1", "CreatedAt": digits})
		}},
		{"host port", func() { _, _ = ParseRouteStrict("box", map[string]string{"HostIP": "10.0.0.1", "8080": huge}) }},
		{"container port", func() { _, _ = ParseRouteStrict("box", map[string]string{"HostIP": "10.0.0.1", digits: "1"}) }},
		{"Echo", func() { _ = Echo(huge) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			tc.call()
			runtime.ReadMemStats(&after)
			if n := after.TotalAlloc - before.TotalAlloc; n > 1<<20 {
				t.Errorf("refusing a %d-byte value allocated %d bytes, want well under its size", len(huge), n)
			}
		})
	}
	if got := Echo("a\"b"); got != `"a\"b"` {
		t.Errorf("echo quotes %q", got)
	}
	if got := Echo(strings.Repeat("y", maxEcho+1)); got != `"`+strings.Repeat("y", maxEcho)+`"...` {
		t.Errorf("echo cuts to %q", got)
	}
	// A cut inside a character keeps none of it: a quote of half of one
	// would show an escape the client never sent.
	if got := Echo(strings.Repeat("y", maxEcho-1) + "é"); got != `"`+strings.Repeat("y", maxEcho-1)+`"...` {
		t.Errorf("echo cuts inside a character: %q", got)
	}
}
