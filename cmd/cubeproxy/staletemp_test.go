package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// A rewrite of the routes file that a crash interrupted leaves a
// .routes.yaml.tmp-* file (the table with its tokens, up to 64 MiB) that
// nothing removed: they piled up, one per crash. serve with
// persist_routes removes those older than a minute and logs each; a
// younger one (a reuse_port predecessor may be writing it) stays, and
// check, which changes nothing, leaves them all.
func TestServeRemovesStaleRoutesTemps(t *testing.T) {
	dir := t.TempDir()
	routes := filepath.Join(dir, "routes.yaml")
	if err := os.WriteFile(routes, []byte("routes: {}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	stale := filepath.Join(dir, ".routes.yaml.tmp-1234")
	young := filepath.Join(dir, ".routes.yaml.tmp-5678")
	old := time.Now().Add(-2 * time.Minute)
	for _, p := range []string{stale, young} {
		if err := os.WriteFile(p, []byte("routes: {part"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chtimes(stale, old, old); err != nil {
		t.Fatal(err)
	}
	args := []string{"--http-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0", "--routes", routes, "--persist-routes"}

	if code, _, stderr := runCheck(t, noEnv, args...); code != 0 {
		t.Fatalf("check: exit %d\n%s", code, stderr)
	}
	if _, err := os.Stat(stale); err != nil {
		t.Fatalf("check removed a file: %v", err)
	}

	r := runServe(t, args, noEnv)
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		t.Errorf("stale temporary file still there after the start: %v", err)
	}
	if _, err := os.Stat(young); err != nil {
		t.Errorf("young temporary file removed: %v", err)
	}
	// The process log is written behind the caller (proclog): the line
	// may reach the buffer after serve is ready.
	testenv.WaitFor(t, 10*time.Second, "the removal logged with its path", func() bool {
		log := r.logs.String()
		return strings.Contains(log, "stale temporary routes file removed") && strings.Contains(log, stale)
	})
}
