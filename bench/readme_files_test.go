package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestREADMEFilesTableMatchesTree: the Files table at the end of
// bench/README.md is where a reader of a RESULTS.md figure looks for the
// code behind it, so every Go source file and script of bench/ is in it,
// and it names no file that is gone. A file added without its row (the
// gzip decoder the sse-lat figures of nginx-platform depend on) would
// otherwise be found only by reading every file.
func TestREADMEFilesTableMatchesTree(t *testing.T) {
	raw, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(raw), "\n## Files\n")
	if !ok {
		t.Fatal("bench/README.md has no ## Files section")
	}
	section, _, _ = strings.Cut(section, "\n## ")
	named := map[string]bool{}
	span := regexp.MustCompile("`([^`]+)`")
	for _, line := range strings.Split(section, "\n") {
		cells := strings.Split(line, "|")
		if len(cells) < 3 {
			continue
		}
		for _, m := range span.FindAllStringSubmatch(cells[1], -1) {
			named[strings.TrimSuffix(m[1], "/")] = true
		}
	}
	if len(named) < 10 {
		t.Fatalf("read %d names from the Files table: is its layout still | `file` | job |?", len(named))
	}
	for n := range named {
		if _, err := os.Stat(n); err != nil {
			t.Errorf("the Files table names %s: %v", n, err)
		}
	}
	entries, err := os.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		name := e.Name()
		if e.IsDir() {
			if name != "testdata" && !named[name] {
				t.Errorf("bench/%s/ is not in bench/README.md's Files table", name)
			}
			continue
		}
		if strings.HasSuffix(name, "_test.go") {
			continue // tests go with the file they test
		}
		if ext := filepath.Ext(name); (ext == ".go" || ext == ".sh") && !named[name] {
			t.Errorf("bench/%s is not in bench/README.md's Files table", name)
		}
	}
}
