package config

import (
	"bufio"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
	"testing"
)

// dockerIgnore is ../.dockerignore: what `docker build` leaves out of the
// build context.
type dockerIgnore []ignoreRule

// ignoreRule is one line of a .dockerignore: a pattern, or with "!" an
// exception to the patterns before it.
type ignoreRule struct {
	glob   []string // path segments; "**" stands for any number of them
	except bool
}

// readDockerIgnore parses ../.dockerignore as docker does: "#" lines are
// comments, a leading "/" is dropped, patterns are cleaned paths.
func readDockerIgnore(t *testing.T) dockerIgnore {
	t.Helper()
	f, err := os.Open("../.dockerignore")
	if err != nil {
		t.Fatalf("no .dockerignore: docker build sends the whole tree (.git, bench results) as its context: %v", err)
	}
	defer f.Close()
	var rules dockerIgnore
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		var r ignoreRule
		if r.except = strings.HasPrefix(line, "!"); r.except {
			line = strings.TrimSpace(line[1:])
		}
		line = strings.TrimPrefix(path.Clean(filepath.ToSlash(line)), "/")
		r.glob = strings.Split(line, "/")
		rules = append(rules, r)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return rules
}

// excluded reports whether name (slash-separated, relative to the
// context) is left out: the last rule matching it or one of its parent
// directories decides.
func (d dockerIgnore) excluded(name string) bool {
	segs := strings.Split(name, "/")
	out := false
	for _, r := range d {
		for n := 1; n <= len(segs); n++ {
			if globMatch(r.glob, segs[:n]) {
				out = !r.except
				break
			}
		}
	}
	return out
}

// globMatch matches path segments against a pattern's, "**" matching any
// number of segments and the others as path.Match.
func globMatch(glob, segs []string) bool {
	if len(glob) == 0 {
		return len(segs) == 0
	}
	if glob[0] == "**" {
		for i := 0; i <= len(segs); i++ {
			if globMatch(glob[1:], segs[i:]) {
				return true
			}
		}
		return false
	}
	if len(segs) == 0 {
		return false
	}
	ok, err := path.Match(glob[0], segs[0])
	return err == nil && ok && globMatch(glob[1:], segs[1:])
}

// The build context keeps what the Dockerfile needs and leaves out what
// it does not: without a .dockerignore, every build sent the whole tree
// (.git, bench/results' runs, local binaries and profiles) to the daemon,
// and any change there invalidated the cache of `COPY . .`. Needed are
// the files the Dockerfile COPYs by name, and for `COPY . .` the module
// files and the Go sources of every package the image's binary is built
// from (go list -deps of the package its `go build` names).
func TestDockerIgnoreKeepsWhatTheBuildNeeds(t *testing.T) {
	ignore := readDockerIgnore(t)
	df, err := os.ReadFile("../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	var need []string
	var target string
	for _, line := range strings.Split(string(df), "\n") {
		f := strings.Fields(line)
		switch {
		case len(f) > 2 && f[0] == "COPY" && !strings.HasPrefix(f[1], "--from"):
			for _, src := range f[1 : len(f)-1] {
				if src != "." {
					need = append(need, src)
				}
			}
		case len(f) > 1 && f[0] == "RUN" && strings.Contains(line, "go build"):
			target = f[len(f)-1]
		}
	}
	if target == "" {
		t.Fatal("no `RUN ... go build ... ./pkg` in the Dockerfile")
	}
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("go", "list", "-deps", "-f", `{{if .Module}}{{if .Module.Main}}{{$d := .Dir}}{{range .GoFiles}}{{$d}}/{{.}}
{{end}}{{range .EmbedFiles}}{{$d}}/{{.}}
{{end}}{{end}}{{end}}`, target)
	cmd.Dir = root
	// The files of the image's build: a static linux binary.
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux")
	list, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -deps %s: %v", target, err)
	}
	for _, file := range strings.Fields(string(list)) {
		rel, err := filepath.Rel(root, file)
		if err != nil {
			t.Fatal(err)
		}
		need = append(need, filepath.ToSlash(rel))
	}
	if len(need) < 10 {
		t.Fatalf("only %d files needed: %q", len(need), need)
	}
	for _, name := range need {
		if ignore.excluded(name) {
			t.Errorf("%s is needed by the Dockerfile's build but .dockerignore leaves it out", name)
		}
	}
	for _, name := range []string{".git", ".git/HEAD", "bench/results/run-1/RESULTS.jsonl", "cubeproxy", "proxy/proxy.test", "cpu.prof", "proxy/mem.prof"} {
		if !ignore.excluded(name) {
			t.Errorf("%s goes into the build context; nothing the image builds reads it", name)
		}
	}
}
