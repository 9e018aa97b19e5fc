package config

import "testing"

// A size or count written with a fraction or an exponent is refused in
// the file as in the environment. The decoder truncated a float into an
// integer setting: max_request_body: 1.5 was one byte, and
// cache.size: 0.5 was 0, the default, without a word.
func TestIntegerSettingsTakeWholeNumbers(t *testing.T) {
	for _, tc := range []struct {
		name, yaml, want string
	}{
		{"fraction", "max_request_body: 1.5\n", "line 1: max_request_body: want a whole number, got `1.5`"},
		{"fraction to zero", "cache:\n  size: 0.5\n", "line 2: cache.size: want a whole number, got `0.5`"},
		{"exponent", "cache:\n  negative_size: 1e5\n", "line 2: cache.negative_size: want a whole number, got `1e5`"},
		{"float with no fraction", "upstream:\n  max_conns: 10.0\n", "line 2: upstream.max_conns: want a whole number, got `10.0`"},
		{"list entry", "auth:\n  exempt_ports: [80, 443.5]\n", "line 2: an entry of auth.exempt_ports: want a whole number, got `443.5`"},
		{"through an alias", "telemetry:\n  trace_sample_ratio: &r 0.5\ncache:\n  size: *r\n", "line 4: cache.size: want a whole number, got `0.5`"},
		// Octal to the decoder, decimal to the environment and flags.
		{"leading zero", "cache:\n  size: 010\n", "line 2: cache.size: `010` has a leading zero, which YAML reads as octal (8); write the number without it, or 0o for octal"},
		{"leading zero in a list", "auth:\n  exempt_ports: [0443]\n", "line 2: an entry of auth.exempt_ports: `0443` has a leading zero, which YAML reads as octal (291)"},
		{"leading zero after a sign", "cache:\n  size: +010\n", "line 2: cache.size: `+010` has a leading zero, which YAML reads as octal (8)"},
		{"a quoted leading zero is a string", "instance_id: '010'\n", ""},
		// The decoder reads a tagged one as octal too, quoted or not.
		{"leading zero tagged !!int", "cache:\n  size: !!int 010\n", "line 2: cache.size: `010` has a leading zero, which YAML reads as octal (8)"},
		{"quoted leading zero tagged !!int", "cache:\n  size: !!int '010'\n", "line 2: cache.size: `010` has a leading zero, which YAML reads as octal (8)"},
		{"zero and explicit octal", "max_streams_per_sandbox: 0\ncache:\n  size: 0o10\n", ""},
		{"whole numbers", "max_request_body: 1048576\ncache:\n  size: 0x10\nauth:\n  exempt_ports: [80]\n", ""},
		{"a float setting takes a float", "telemetry:\n  trace_sample_ratio: 0.5\n", ""},
	} {
		t.Run(tc.name, func(t *testing.T) { loadWants(t, tc.yaml, tc.want) })
	}
}
