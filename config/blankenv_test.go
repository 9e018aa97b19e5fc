package config

import (
	"io"
	"strings"
	"testing"
)

// A variable that holds only blanks, or a list of only blank entries,
// is refused: an empty variable counts as unset, but CUBEPROXY_DOMAINS=","
// or " " emptied the file's domains, and so let every domain through,
// without a word; CUBEPROXY_ROUTES=" " named a routes file " ".
func TestBlankEnvironmentValuesAreRefused(t *testing.T) {
	file := writeFile(t, "domains: [cube.test]\nauth:\n  exempt_ports: [8080]\n")
	for _, tc := range []struct {
		name, key, value, want string
	}{
		{"a blank list", "CUBEPROXY_DOMAINS", " ", `CUBEPROXY_DOMAINS: " " is blank: an empty variable counts as unset; to empty domains, use --domains= or the file`},
		{"a list of blank entries", "CUBEPROXY_DOMAINS", ", ,", `CUBEPROXY_DOMAINS: ", ," has no entries: an empty variable counts as unset; to empty domains, use --domains= or the file`},
		{"an int list of blank entries", "CUBEPROXY_AUTH_EXEMPT_PORTS", ",", `CUBEPROXY_AUTH_EXEMPT_PORTS: "," has no entries`},
		{"a blank string", "CUBEPROXY_ROUTES", "  ", `CUBEPROXY_ROUTES: "  " is blank: an empty variable counts as unset; to empty routes, use --routes= or the file`},
		{"a blank duration", "CUBEPROXY_DRAIN_TIMEOUT", "\t", `CUBEPROXY_DRAIN_TIMEOUT: "\t" is blank`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Load([]string{"--config", file}, env(map[string]string{tc.key: tc.value}), io.Discard)
			if err == nil || len(err.Error()) < len(tc.want) || err.Error()[:len(tc.want)] != tc.want {
				t.Fatalf("Load = %v\nwant %s", err, tc.want)
			}
		})
	}
	// A list with blank entries among others keeps the others.
	cfg, err := Load([]string{"--config", file}, env(map[string]string{"CUBEPROXY_DOMAINS": "a.test, ,b.test,"}), io.Discard)
	if err != nil || len(cfg.Domains) != 2 {
		t.Fatalf("Load = %v, %v; want a.test and b.test", cfg, err)
	}
}

// The refusal of a blank variable says how to get what was meant, and
// that way works: CUBEPROXY_DRAIN_TIMEOUT=" " advised --drain-timeout=,
// which the flag then refused as no duration (and --cache-size= as no
// integer, --reuse-port= as no boolean). A setting whose flag takes an
// empty value is told to use it; any other is told to unset the variable.
func TestBlankEnvironmentAdviceWorks(t *testing.T) {
	file := writeFile(t, "domains: [cube.test]\n")
	for _, key := range []string{
		"CUBEPROXY_DOMAINS", "CUBEPROXY_ROUTES", "CUBEPROXY_AUTH_EXEMPT_PORTS",
		"CUBEPROXY_DRAIN_TIMEOUT", "CUBEPROXY_CACHE_SIZE", "CUBEPROXY_REUSE_PORT",
		"CUBEPROXY_TELEMETRY_TRACE_SAMPLE_RATIO",
	} {
		t.Run(key, func(t *testing.T) {
			_, err := Load([]string{"--config", file}, env(map[string]string{key: " "}), io.Discard)
			if err == nil {
				t.Fatalf("Load with %s blank: no error", key)
			}
			msg := err.Error()
			_, advice, ok := strings.Cut(msg, "use --")
			if !ok {
				if !strings.Contains(msg, "unset "+key) {
					t.Fatalf("Load = %v\nwant advice to use the flag or to unset %s", err, key)
				}
				return
			}
			flagArg, _, _ := strings.Cut(advice, " ")
			if _, err := Load([]string{"--config", file, "--" + flagArg}, env(nil), io.Discard); err != nil {
				t.Fatalf("the refusal advised --%s, which fails: %v\n(refusal: %s)", flagArg, err, msg)
			}
		})
	}
}
