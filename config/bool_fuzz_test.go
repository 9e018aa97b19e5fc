package config

import (
	"io"
	"slices"
	"strings"
	"testing"
)

// FuzzBoolWords checks that a boolean setting reads a word alike in the
// file, the environment and a flag: the environment and a flag agree on
// every word (the same value, or both refuse it), take only boolean words,
// and every word the file takes they take as the same value. (They also take Go's 1/0 and t/f,
// which YAML reads as no boolean.) The words are those an operator types:
// letters, digits and a few marks, where YAML adds no syntax of its own.
func FuzzBoolWords(f *testing.F) {
	for _, w := range []string{"true", "False", "on", "OFF", "yes", "No", "y", "N", "1", "0", "t", "F", "enabled", "oN", "TRUE", "tRUE"} {
		f.Add(w)
	}
	f.Fuzz(func(t *testing.T, word string) {
		if word == "" || len(word) > 16 || strings.Trim(word, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_+-.") != "" {
			return
		}
		load := func(args []string, vars map[string]string) (bool, bool) {
			c, err := Load(args, env(vars), io.Discard)
			return err == nil && c.PersistRoutes, err == nil
		}
		envV, envOK := load(nil, map[string]string{"CUBEPROXY_PERSIST_ROUTES": word})
		flagV, flagOK := load([]string{"--persist-routes=" + word}, nil)
		if envOK != flagOK || envV != flagV {
			t.Fatalf("%q: environment %v (taken %v), flag %v (taken %v)", word, envV, envOK, flagV, flagOK)
		}
		if known := []string{"true", "false", "yes", "no", "y", "n", "on", "off", "1", "0", "t", "f"}; envOK && !slices.Contains(known, strings.ToLower(word)) {
			t.Fatalf("%q: taken as %v, but it is no boolean word", word, envV)
		}
		fileV, fileOK := load([]string{"--config", writeFile(t, "persist_routes: "+word+"\n")}, nil)
		if fileOK && (!envOK || envV != fileV) {
			t.Fatalf("%q: file %v, environment %v (taken %v)", word, fileV, envV, envOK)
		}
	})
}
