package config

import (
	"io"
	"strings"
	"testing"
)

// A config path with blanks around it (a template's trailing space, a
// line end left in CUBEPROXY_CONFIG by a manifest or a secret file) is
// refused as such, naming where it came from, as every other path
// setting is (checkBlanks): it failed on "stat cubeproxy.yaml : no such
// file or directory", whose trailing blank no terminal shows, for a file
// the operator could see was there. A variable of only blanks is refused
// as any other blank variable is (checkBlankEnv), not read as a file " ".
func TestConfigPathWithBlanksIsRefused(t *testing.T) {
	file := writeFile(t, "http_addr: ':1001'\n")
	for _, tc := range []struct {
		name   string
		args   []string
		config string // CUBEPROXY_CONFIG
		want   []string
	}{
		{"flag, trailing blank", []string{"--config", file + " "}, "",
			[]string{`--config "` + file + ` " has blanks around it`, "write the path alone"}},
		{"flag, line end", []string{"--config=" + file + "\n"}, "",
			[]string{`--config "` + file + `\n" has blanks around it`}},
		{"variable, trailing blank", nil, file + " ",
			[]string{`CUBEPROXY_CONFIG: "` + file + ` " has blanks around it`, "write the path alone"}},
		{"variable, leading blank", nil, " " + file,
			[]string{`CUBEPROXY_CONFIG: " ` + file + `" has blanks around it`}},
		{"variable, only blanks", nil, "  ",
			[]string{`CUBEPROXY_CONFIG: "  " is blank`, "unset CUBEPROXY_CONFIG"}},
		{"flag, only blanks", []string{"--config", " "}, "",
			[]string{`--config " " is blank`, "--config="}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Load(tc.args, env(map[string]string{"CUBEPROXY_CONFIG": tc.config}), io.Discard)
			if err == nil {
				t.Fatal("Load: no error")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("Load = %v\nwant it to say %q", err, w)
				}
			}
		})
	}
	// The path written alone loads, from either.
	for _, args := range [][]string{{"--config", file}, nil} {
		cfg, err := Load(args, env(map[string]string{"CUBEPROXY_CONFIG": file}), io.Discard)
		if err != nil || cfg.HTTPAddr != ":1001" {
			t.Fatalf("Load(%q) = %v, %v; want the file's http_addr", args, cfg, err)
		}
	}
}
