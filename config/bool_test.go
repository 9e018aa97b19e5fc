package config

import (
	"io"
	"strings"
	"testing"
)

// A boolean setting takes the same words in the file, the environment and
// a flag: YAML's decoder keeps YAML 1.1's on/off and yes/no for a bool
// field, so persist_routes: on (as nginx operators write it) worked in
// the file while CUBEPROXY_PERSIST_ROUTES=on and --persist-routes=on were
// refused as "invalid boolean".
func TestBoolWordsAgreeAcrossFileEnvAndFlags(t *testing.T) {
	for _, tc := range []struct {
		word string
		want bool
	}{
		{"true", true}, {"false", false},
		{"on", true}, {"off", false}, {"On", true}, {"OFF", false},
		{"yes", true}, {"no", false}, {"Yes", true}, {"NO", false},
		// YAML 1.1 also spells them y and n, which the decoder keeps.
		{"y", true}, {"n", false}, {"Y", true}, {"N", false},
	} {
		for _, src := range []struct {
			name string
			args []string
			env  map[string]string
		}{
			{"file", []string{"--config", writeFile(t, "persist_routes: "+tc.word+"\n")}, nil},
			{"env", nil, map[string]string{"CUBEPROXY_PERSIST_ROUTES": tc.word}},
			{"flag", []string{"--persist-routes=" + tc.word}, nil},
		} {
			c, err := Load(src.args, env(src.env), io.Discard)
			if err != nil {
				t.Errorf("%s %q: %v", src.name, tc.word, err)
				continue
			}
			if c.PersistRoutes != tc.want {
				t.Errorf("%s %q: persist_routes = %v, want %v", src.name, tc.word, c.PersistRoutes, tc.want)
			}
		}
	}
	// Anything else is refused, naming the words that work, never read
	// as false.
	for _, src := range []struct {
		name string
		args []string
		env  map[string]string
		want string
	}{
		{"file", []string{"--config", writeFile(t, "persist_routes: enabled\n")}, nil, "persist_routes: want true or false (yes/no and on/off work too), got `enabled`"},
		{"env", nil, map[string]string{"CUBEPROXY_PERSIST_ROUTES": "enabled"}, `CUBEPROXY_PERSIST_ROUTES: invalid boolean "enabled": want true or false (yes/no and on/off work too)`},
		{"flag", []string{"--persist-routes=enabled"}, nil, `invalid boolean "enabled": want true or false (yes/no and on/off work too)`},
	} {
		_, err := Load(src.args, env(src.env), io.Discard)
		if err == nil || !strings.Contains(err.Error(), src.want) {
			t.Errorf("%s enabled: %v; want an error containing %q", src.name, err, src.want)
		}
	}
}
