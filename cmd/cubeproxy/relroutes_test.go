package main

import (
	"bytes"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
)

// A relative routes path that names no file is looked for in the working
// directory, which under a service manager is often not the one the
// operator thinks of (systemd's is /). The warning names the setting and
// the absolute path looked at, so the empty table can be traced to it.
func TestMissingRelativeRoutesNamesWhereLooked(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir)
	var buf bytes.Buffer
	log := slog.New(slog.NewJSONHandler(&buf, nil))
	if _, err := loadRoutes(filepath.Join("configs", "routes.yaml"), log); err != nil {
		t.Fatalf("loadRoutes: %v", err)
	}
	line := buf.String()
	if !strings.Contains(line, "routes file not found") {
		t.Fatalf("no missing-file warning: %s", line)
	}
	want := filepath.Join(dir, "configs", "routes.yaml")
	if !strings.Contains(line, `"abs_path":"`+want+`"`) {
		t.Errorf("warning does not name the absolute path %s looked at: %s", want, line)
	}
	if !strings.Contains(line, `"setting":"routes"`) {
		t.Errorf("warning does not name the setting: %s", line)
	}
}
