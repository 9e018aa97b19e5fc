package config

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// Every `go test -fuzz` line of the Makefile names exactly one fuzz target
// of its package: go test refuses to fuzz when the pattern matches several
// (-fuzz FuzzParse also matches FuzzParseRoute), so `make fuzz` would fail
// before fuzzing anything.
func TestMakefileFuzzMatchesOneTarget(t *testing.T) {
	raw, err := os.ReadFile("../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	lines := 0
	for line := range strings.SplitSeq(string(raw), "\n") {
		fields := strings.Fields(strings.ReplaceAll(line, "$$", "$")) // make's escape of $
		fuzz, pkg := "", ""
		for i, f := range fields {
			if f == "-fuzz" && i+1 < len(fields) {
				fuzz = strings.Trim(fields[i+1], `'"`)
			}
			if strings.HasPrefix(f, "./") {
				pkg = f
			}
		}
		if fuzz == "" {
			continue
		}
		lines++
		if pkg == "" {
			t.Errorf("Makefile line %q: no ./package to fuzz", line)
			continue
		}
		re, err := regexp.Compile(fuzz)
		if err != nil {
			t.Errorf("Makefile -fuzz %q: %v", fuzz, err)
			continue
		}
		var matched []string
		for _, name := range fuzzTargets(t, filepath.Join("..", pkg)) {
			if re.MatchString(name) {
				matched = append(matched, name)
			}
		}
		if len(matched) != 1 {
			t.Errorf("Makefile -fuzz %q in %s matches %v: go test fuzzes only a pattern that matches exactly one target (anchor it: '^Name$$')", fuzz, pkg, matched)
		}
	}
	if lines == 0 {
		t.Fatal("no go test -fuzz line in the Makefile")
	}
}

// fuzzTargets lists the names of the fuzz functions in dir's test files.
func fuzzTargets(t *testing.T, dir string) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*_test.go"))
	if err != nil || len(files) == 0 {
		t.Fatalf("%s: no test files (%v)", dir, err)
	}
	decl := regexp.MustCompile(`(?m)^func (Fuzz\w*)\(\w+ \*testing\.F\)`)
	var names []string
	for _, f := range files {
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range decl.FindAllStringSubmatch(string(src), -1) {
			names = append(names, m[1])
		}
	}
	return names
}
