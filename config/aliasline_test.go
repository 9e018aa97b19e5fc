package config

import (
	"io"
	"strings"
	"testing"
)

// A wrong value that other keys take through an alias is one mistake,
// written on one line: the decoder reports it once for each key that
// takes it, each naming the anchor's line, and the error repeated that
// line word for word. It is named once, with the keys that take it
// through an alias.
func TestTypeErrorThroughAliasNamedOnce(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		line       string // the line named, once
		want       string
	}{
		{"alias in the same section", "cache:\n  ttl_min: &t 5\n  ttl_max: *t\n", "line 2: ",
			"line 2: cache.ttl_min: want a duration with its unit (30s, 5m, 2h), got `5` (taken through an alias by cache.ttl_max at line 3)"},
		{"aliases in other sections", "cache:\n  ttl_min: &t 5\nupstream:\n  connect_timeout: *t\n  idle_timeout: *t\n", "line 2: ",
			"line 2: cache.ttl_min: want a duration with its unit (30s, 5m, 2h), got `5` (taken through an alias by upstream.connect_timeout at line 4, upstream.idle_timeout at line 5)"},
		// Under a key that is no setting, the decoder's words stay, once.
		{"anchor under an unknown key", "defaults: &d 30\ndrain_timeout: *d\nupstream:\n  connect_timeout: *d\n", "line 1: cannot unmarshal",
			"line 1: cannot unmarshal !!int `30` into time.Duration"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Load([]string{"--config", writeFile(t, tc.body)}, env(nil), io.Discard)
			if err == nil {
				t.Fatal("loaded")
			}
			msg := err.Error()
			if n := strings.Count(msg, tc.line); n != 1 {
				t.Errorf("error names %q %d times:\n%s", tc.line, n, msg)
			}
			if !strings.Contains(msg, tc.want) {
				t.Errorf("error %q\ndoes not say %q", msg, tc.want)
			}
		})
	}
}
