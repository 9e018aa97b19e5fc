package accesslog

import (
	"os"
	"path/filepath"
	"testing"
)

// NamesStdout takes stdout's names, through links as nginx images make
// them (access.log -> /dev/stdout), and nothing else: a file, a link to a
// file, stderr.
func TestNamesStdout(t *testing.T) {
	dir := t.TempDir()
	link := func(name, target string) string {
		p := filepath.Join(dir, name)
		if err := os.Symlink(target, p); err != nil {
			t.Fatal(err)
		}
		return p
	}
	file := filepath.Join(dir, "access.log")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	nginx := link("nginx.log", "/dev/stdout")
	for path, want := range map[string]bool{
		"":                             true,
		"-":                            true,
		"/dev/stdout":                  true,
		"/dev//stdout":                 true,
		"/dev/fd/1":                    true,
		"/proc/self/fd/1":              true,
		nginx:                          true,
		link("chain.log", "nginx.log"): true, // relative, to a link
		file:                           false,
		link("file.log", "access.log"): false,
		"/dev/stderr":                  false,
		filepath.Join(dir, "missing"):  false,
	} {
		if got := NamesStdout(path); got != want {
			t.Errorf("NamesStdout(%q) = %v, want %v", path, got, want)
		}
	}
	// cubeproxy check passes what serve writes to stdout, whatever
	// stdout is (opened, a socket's fails).
	if err := CheckPath(nginx); err != nil {
		t.Errorf("CheckPath(%q): %v", nginx, err)
	}
}
