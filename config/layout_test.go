package config

import (
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// config stays low in the import graph: it reads settings and knows the
// route model (routing, redisstore), nothing that serves. The defaults
// serve -h shows come from proxy, certs, accesslog and telemetry through
// the binary (LoadCommand's shown), not by importing them here, which
// would pull fasthttp, certmagic and the OTel SDK into every user of
// config.
func TestImportsStayLow(t *testing.T) {
	testenv.ImportsAvoid(t, "proxy", "cmd", "certs", "telemetry", "accesslog", "auth")
}

// The README's Layout table is where a reader starts: every folder and
// file it names exists, every folder of the tree (but .git and what
// .gitignore keeps out) is named, itself or under a named parent
// (bench/backend under bench), and so is every top-level file but the
// README and .gitignore. Every example in configs is named in its row.
func TestREADMELayoutMatchesTree(t *testing.T) {
	rows := readmeLayoutRows(t)
	named := map[string]bool{}
	for _, row := range rows {
		for _, n := range row.names {
			named[n] = true
			if _, err := os.Stat(filepath.Join("..", n)); err != nil {
				t.Errorf("README's Layout names %s: %v", n, err)
			}
		}
	}
	ignored, patterns := gitignored(t)
	covered := func(rel string) bool {
		for p := rel; p != "."; p = filepath.Dir(p) {
			if named[filepath.ToSlash(p)] {
				return true
			}
		}
		return false
	}
	container := func(rel string) bool {
		for n := range named {
			if strings.HasPrefix(n, rel+"/") {
				return true
			}
		}
		return false
	}
	err := filepath.WalkDir("..", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel("..", path)
		rel = filepath.ToSlash(rel)
		switch {
		case rel == ".":
			return nil
		case rel == ".git" || ignored[rel] || ignoredName(patterns, path):
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		case !d.IsDir() && strings.Contains(rel, "/"):
			// A file in a folder: the folder's row covers it, unless the
			// folder only holds named ones (a file loose in internal).
			if !covered(rel) {
				t.Errorf("%s is in no folder the README's Layout table names", rel)
			}
			return nil
		case rel == "README.md" || rel == ".gitignore":
			return nil
		case d.IsDir() && container(rel):
			return nil // cmd, internal: their named folders have rows
		}
		if !covered(rel) {
			t.Errorf("%s is in the tree but not in the README's Layout table", rel)
		}
		if d.IsDir() && named[rel] {
			// Below a named folder, the row speaks for the rest.
			return filepath.SkipDir
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}

	var configsRow string
	for _, row := range rows {
		if slices.Contains(row.names, "configs") {
			configsRow = row.text
		}
	}
	entries, err := os.ReadDir("../configs")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		name := e.Name()
		if e.IsDir() {
			name = "configs/" + name
		}
		if !strings.Contains(configsRow, "`"+name+"`") {
			t.Errorf("configs/%s: not named in the README's Layout row for configs", e.Name())
		}
	}
}

type layoutRow struct {
	names []string // the backticked names of the first cell
	text  string   // the whole row
}

// readmeLayoutRows reads the table under the README's "## Layout".
func readmeLayoutRows(t *testing.T) []layoutRow {
	t.Helper()
	_, section, ok := strings.Cut(readREADME(t), "\n## Layout\n")
	if !ok {
		t.Fatal("README has no ## Layout section")
	}
	section, _, _ = strings.Cut(section, "\n## ")
	var rows []layoutRow
	for line := range strings.Lines(section) {
		cells := strings.Split(line, "|")
		if len(cells) < 3 || !strings.HasPrefix(strings.TrimSpace(cells[1]), "`") {
			continue // the header, its rule, the prose around the table
		}
		row := layoutRow{text: line}
		parts := strings.Split(cells[1], "`")
		for i := 1; i < len(parts); i += 2 {
			row.names = append(row.names, parts[i])
		}
		rows = append(rows, row)
	}
	if len(rows) < 5 {
		t.Fatalf("README's Layout table: %d rows read", len(rows))
	}
	return rows
}

// gitignored reads .gitignore: the root-anchored paths it names
// ("/cubeproxy", "/bench/results/"), and its unrooted name patterns
// ("*.test", "*.prof"). A built binary, a compiled test, a profile or bench
// output in a checkout is no part of the layout, and no clean clone has one.
func gitignored(t *testing.T) (roots map[string]bool, names []string) {
	t.Helper()
	raw, err := os.ReadFile("../.gitignore")
	if err != nil {
		t.Fatal(err)
	}
	roots = map[string]bool{}
	for line := range strings.Lines(string(raw)) {
		p := strings.TrimSpace(line)
		switch {
		case p == "" || strings.HasPrefix(p, "#"):
		case strings.HasPrefix(p, "/"):
			roots[strings.TrimSuffix(p[1:], "/")] = true
		case !strings.Contains(p, "/"):
			names = append(names, p)
		}
	}
	return roots, names
}

// ignoredName reports whether one of patterns matches path's name.
func ignoredName(patterns []string, path string) bool {
	for _, p := range patterns {
		if ok, _ := filepath.Match(p, filepath.Base(path)); ok {
			return true
		}
	}
	return false
}
