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

// What the README says only the environment and flags take: Go's 1/0 and
// t/f, and the YAML words in any mix of case (strings.ToLower before the
// match), which the file's decoder refuses; true and false stay Go's
// (tRuE is refused everywhere). The file's refusal keeps `1` from being
// read there as a number.
func TestBoolWordsOnlyEnvAndFlagsTake(t *testing.T) {
	for _, tc := range []struct {
		word      string
		want      bool
		taken     bool // by the environment and flags
		fileTaken bool
	}{
		{"1", true, true, false}, {"0", false, true, false},
		{"t", true, true, false}, {"F", false, true, false},
		{"oN", true, true, false}, {"yEs", true, true, false}, {"nO", false, true, false}, {"oFF", false, true, false},
		{"tRuE", false, false, false}, {"enabled", false, false, false},
	} {
		for _, src := range []struct {
			name  string
			args  []string
			env   map[string]string
			taken bool
		}{
			{"file", []string{"--config", writeFile(t, "persist_routes: "+tc.word+"\n")}, nil, tc.fileTaken},
			{"env", nil, map[string]string{"CUBEPROXY_PERSIST_ROUTES": tc.word}, tc.taken},
			{"flag", []string{"--persist-routes=" + tc.word}, nil, tc.taken},
		} {
			c, err := Load(src.args, env(src.env), io.Discard)
			switch {
			case src.taken && err != nil:
				t.Errorf("%s %q: %v, want it taken", src.name, tc.word, err)
			case src.taken && c.PersistRoutes != tc.want:
				t.Errorf("%s %q: persist_routes = %v, want %v", src.name, tc.word, c.PersistRoutes, tc.want)
			case !src.taken && err == nil:
				t.Errorf("%s %q: taken as %v, want it refused", src.name, tc.word, c.PersistRoutes)
			}
		}
	}
}
