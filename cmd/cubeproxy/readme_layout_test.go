package main

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

// The README's Layout row for cmd/cubeproxy lists the binary's commands:
// every one that `cubeproxy help` lists is named there, so a command added
// (health was) reaches the first table a reader opens.
func TestREADMELayoutNamesEveryCommand(t *testing.T) {
	raw, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	var row string
	for line := range strings.Lines(string(raw)) {
		if strings.HasPrefix(line, "| `cmd/cubeproxy` |") {
			row = line
		}
	}
	if row == "" {
		t.Fatal("README's Layout table has no cmd/cubeproxy row")
	}
	// "  cubeproxy token sign --sandbox ID …": the lower-case words after
	// the program's name make the command.
	command := regexp.MustCompile(`^  cubeproxy((?: [a-z]+)+)`)
	n := 0
	for line := range strings.Lines(usage) {
		m := command.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		n++
		if name := strings.TrimSpace(m[1]); !strings.Contains(row, "`"+name+"`") {
			t.Errorf("cubeproxy help lists %q; the README's Layout row for cmd/cubeproxy does not name it", name)
		}
	}
	if n < 5 {
		t.Fatalf("%d commands read from the usage text", n)
	}
}
