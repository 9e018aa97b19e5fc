package config

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// Every `go test -fuzz` line of the Makefile names exactly one fuzz target
// of its package: go test refuses to fuzz when the pattern matches several
// (-fuzz FuzzParse also matches FuzzParseRoute), so `make fuzz` would fail
// before fuzzing anything. A line that fuzzes each name a loop found
// ("$$t") must anchor it, and the loop's sed must find every fuzz target
// of the tree (TestMakefileFuzzFindsEveryTarget).
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
		if strings.Contains(fuzz, "$t") {
			if fuzz != `^$t\$` {
				t.Errorf("Makefile -fuzz %q: anchor the looped name as '^$$t\\$$'", fuzz)
			}
			continue
		}
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

// TestMakefileFuzzFindsEveryTarget holds `make fuzz`'s loop to the tree: the
// files its grep picks and the names its sed reads out of them are every
// fuzz target of every package, so a new target is fuzzed without anyone
// adding it to a list.
func TestMakefileFuzzFindsEveryTarget(t *testing.T) {
	raw, err := os.ReadFile("../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`sed -n 's/(.*)/\\1/p'`).FindStringSubmatch(string(raw))
	if m == nil {
		t.Skip("no sed loop in make fuzz: TestMakefileFuzzMatchesOneTarget checks its lines")
	}
	// The sed pattern is a basic regular expression: \( \) group.
	bre := strings.NewReplacer(`\(`, "(", `\)`, ")", "(", `\(`, ")", `\)`).Replace(m[1])
	sed, err := regexp.Compile("(?m)" + bre)
	if err != nil {
		t.Fatalf("make fuzz's sed pattern %q as %q: %v", m[1], bre, err)
	}
	dirs := map[string]bool{}
	err = filepath.WalkDir("..", func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == "testdata" || strings.HasPrefix(d.Name(), ".") && path != "..") {
			return filepath.SkipDir
		}
		if strings.HasSuffix(path, "_test.go") {
			dirs[filepath.Dir(path)] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	total := 0
	for dir := range dirs {
		want := fuzzTargets(t, dir)
		total += len(want)
		files, _ := filepath.Glob(filepath.Join(dir, "*_test.go"))
		var got []string
		for _, f := range files {
			src, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			for _, mm := range sed.FindAllStringSubmatch(string(src), -1) {
				got = append(got, mm[1])
			}
		}
		if strings.Join(got, " ") != strings.Join(want, " ") {
			t.Errorf("%s: make fuzz would fuzz %q, the package's targets are %q", dir, got, want)
		}
	}
	if total == 0 {
		t.Fatal("no fuzz target found in the tree")
	}
}

// Every test that skips under the race detector (allocation counts,
// stack and heap sizes) is run by one of make test's runs without -race:
// `go test -race ./...` skips it, so a name none of those runs' -run
// patterns matches is never run in CI (a stack-size test named without
// "Alloc" was, until this check).
func TestMakefileRunsEveryRaceSkippedTest(t *testing.T) {
	raw, err := os.ReadFile("../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	type run struct {
		pattern *regexp.Regexp
		pkgs    []string // "./..." or package directories
	}
	var runs []run
	for line := range strings.SplitSeq(string(raw), "\n") {
		fields := strings.Fields(line)
		if len(fields) < 2 || fields[0] != "go" || fields[1] != "test" || strings.Contains(line, "-race") || strings.Contains(line, "-fuzz") {
			continue
		}
		var r run
		for i, f := range fields {
			if f == "-run" && i+1 < len(fields) {
				r.pattern = regexp.MustCompile(strings.Trim(fields[i+1], `'"`))
			}
			if strings.HasPrefix(f, "./") {
				r.pkgs = append(r.pkgs, f)
			}
		}
		if r.pattern != nil && len(r.pkgs) > 0 {
			runs = append(runs, r)
		}
	}
	if len(runs) == 0 {
		t.Fatal("make test has no go test -run line without -race")
	}
	skipped := raceSkippedTests(t)
	if len(skipped) < 5 {
		t.Fatalf("found %d tests that skip under -race, want the allocation tests at least: %v", len(skipped), skipped)
	}
	for _, s := range skipped {
		ran := false
		for _, r := range runs {
			for _, pkg := range r.pkgs {
				inPkg := pkg == "./..." || filepath.Clean(filepath.Join("..", pkg)) == s.dir
				ran = ran || inPkg && r.pattern.MatchString(s.name)
			}
		}
		if !ran {
			t.Errorf("%s.%s skips under -race and no run of make test without -race matches it: name it so that one does, or add it to the Makefile", s.dir, s.name)
		}
	}
}

type raceSkippedTest struct{ dir, name string }

// raceSkippedTests finds the tests whose body holds `if <c> { ... Skip ... }`
// where c is a constant a `//go:build !race` test file of its package
// declares (false there, true in its race twin).
func raceSkippedTests(t *testing.T) []raceSkippedTest {
	t.Helper()
	var found []raceSkippedTest
	err := filepath.WalkDir("..", func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == "testdata" || d.Name() == "node_modules" || strings.HasPrefix(d.Name(), ".") && path != "..") {
			return filepath.SkipDir
		}
		if !d.IsDir() {
			return nil
		}
		files, _ := filepath.Glob(filepath.Join(path, "*_test.go"))
		fset := token.NewFileSet()
		var parsed []*ast.File
		flags := map[string]bool{}
		for _, f := range files {
			file, err := parser.ParseFile(fset, f, nil, parser.ParseComments)
			if err != nil {
				return err
			}
			parsed = append(parsed, file)
			if len(file.Comments) == 0 || !strings.HasPrefix(file.Comments[0].List[0].Text, "//go:build !race") {
				continue
			}
			for _, decl := range file.Decls {
				if g, ok := decl.(*ast.GenDecl); ok && g.Tok == token.CONST {
					for _, spec := range g.Specs {
						for _, n := range spec.(*ast.ValueSpec).Names {
							flags[n.Name] = true
						}
					}
				}
			}
		}
		for _, file := range parsed {
			for _, decl := range file.Decls {
				fn, ok := decl.(*ast.FuncDecl)
				if !ok || fn.Body == nil || !strings.HasPrefix(fn.Name.Name, "Test") {
					continue
				}
				skips := false
				ast.Inspect(fn.Body, func(n ast.Node) bool {
					ifs, ok := n.(*ast.IfStmt)
					if !ok {
						return true
					}
					if id, ok := ifs.Cond.(*ast.Ident); ok && flags[id.Name] {
						ast.Inspect(ifs.Body, func(n ast.Node) bool {
							if sel, ok := n.(*ast.SelectorExpr); ok && strings.HasPrefix(sel.Sel.Name, "Skip") {
								skips = true
							}
							return true
						})
					}
					return true
				})
				if skips {
					found = append(found, raceSkippedTest{filepath.Clean(path), fn.Name.Name})
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return found
}

// No file of the tree holds a merge's conflict markers. A merge whose
// conflict was resolved in one file and not in another committed the
// Makefile with both sides and the markers, and make refused to run
// ("missing separator"); a Go file would fail to build, but a README,
// a configuration or a script would pass every other test.
func TestNoConflictMarkers(t *testing.T) {
	marker := regexp.MustCompile(`(?m)^(<<<<<<< |>>>>>>> |=======$)`)
	files := 0
	err := filepath.WalkDir("..", func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if d.Name() == "testdata" || d.Name() == "node_modules" || strings.HasPrefix(d.Name(), ".") && path != ".." {
				return filepath.SkipDir
			}
			return nil
		}
		info, err := d.Info()
		if err != nil || !info.Mode().IsRegular() || info.Size() > 4<<20 {
			return err
		}
		raw, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		files++
		if loc := marker.FindIndex(raw); loc != nil {
			line := 1 + strings.Count(string(raw[:loc[0]]), "\n")
			t.Errorf("%s:%d: a merge's conflict marker", path, line)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if files < 100 {
		t.Fatalf("read %d files of the tree, want the whole tree", files)
	}
}

// make test's background npm ci (the TypeScript MCP interop test's
// install, started early under the test's own file lock) is bounded: the
// test waits on that lock with no deadline of its own, so an npm ci that
// hangs (a registry that accepts the connection and never answers) held
// the test, and with it the proxy package's whole run, until go test's
// -timeout panic, where the test's own install fails after five minutes
// with npm's output.
func TestMakefileBackgroundInstallIsBounded(t *testing.T) {
	raw, err := os.ReadFile("../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	// The recipe's lines joined where a backslash continues them.
	recipe := strings.ReplaceAll(string(raw), "\\\n", " ")
	found := false
	for line := range strings.SplitSeq(recipe, "\n") {
		if !strings.Contains(line, "npm ci") || strings.HasPrefix(strings.TrimSpace(line), "#") {
			continue
		}
		found = true
		if !regexp.MustCompile(`\btimeout\s[^;&|]*\bnpm ci\b`).MatchString(line) {
			t.Errorf("Makefile runs npm ci without a timeout: %s", strings.TrimSpace(line))
		}
	}
	if !found {
		t.Skip("the Makefile runs no npm ci")
	}
}
