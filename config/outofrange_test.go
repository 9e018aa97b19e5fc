package config

import (
	"io"
	"strings"
	"testing"
)

// A number or duration too large for Go to hold is refused as too large,
// in the file, the environment and flags alike: the error said "want a
// duration with its unit" of 9999999h, which has one, and "want a whole
// number in decimal digits" of twenty decimal digits.
func TestOutOfRangeSaidSo(t *testing.T) {
	const bigInt = "99999999999999999999"
	for _, tc := range []struct {
		name string
		file string
		args []string
		env  map[string]string
		want string
	}{
		{"duration, file", "upstream:\n  connect_timeout: 9999999h\n", nil, nil,
			"line 2: upstream.connect_timeout: `9999999h` is above 8760h0m0s, the longest duration the proxy takes"},
		{"duration, env", "", nil, map[string]string{"CUBEPROXY_UPSTREAM_CONNECT_TIMEOUT": "9999999h"},
			`CUBEPROXY_UPSTREAM_CONNECT_TIMEOUT: "9999999h" is above 8760h0m0s, the longest duration the proxy takes`},
		{"duration, flag", "", []string{"--upstream-connect-timeout=9999999h"}, nil,
			`"9999999h" is above 8760h0m0s, the longest duration the proxy takes`},
		{"negative duration, env", "", nil, map[string]string{"CUBEPROXY_UPSTREAM_HEARTBEAT_INTERVAL": "-9999999h"},
			`"-9999999h" is out of range`},
		{"size, file", "cache:\n  size: " + bigInt + "\n", nil, nil,
			"line 2: cache.size: `" + bigInt + "` is out of range"},
		{"size, env", "", nil, map[string]string{"CUBEPROXY_CACHE_SIZE": bigInt},
			`CUBEPROXY_CACHE_SIZE: "` + bigInt + `" is out of range`},
		{"port, env", "", nil, map[string]string{"CUBEPROXY_AUTH_EXEMPT_PORTS": "80," + bigInt},
			`CUBEPROXY_AUTH_EXEMPT_PORTS: "` + bigInt + `" is out of range`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"--config="}, tc.args...)
			if tc.file != "" {
				args = append([]string{"--config", writeFile(t, tc.file)}, tc.args...)
			}
			_, err := Load(args, env(tc.env), io.Discard)
			if err == nil {
				t.Fatal("loaded")
			}
			if !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "with its unit") || strings.Contains(err.Error(), "decimal digits") {
				t.Errorf("error %q\nwant it to say %q", err, tc.want)
			}
		})
	}
}
