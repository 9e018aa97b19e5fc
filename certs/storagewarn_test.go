package certs

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/caddyserver/certmagic"
)

// A storage_dir that stops taking writes after the start (a volume gone
// read-only or full, its permissions changed) fails every on-demand
// issuance at certmagic's storage check, before any order, and certmagic
// hands that error to the handshake alone: at the default log level an
// operator saw "obtaining new certificate" for each new sandbox name and
// nothing after it (measured on the binary, run as a user that then lost
// write access), while /readyz said ready. A failed write is a warning,
// at most once every storageWarnEvery.
func TestStorageWriteFailureWarned(t *testing.T) {
	// A file where the storage's directory would be: writes fail, for
	// root too.
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	g := &lockGate{Storage: &certmagic.FileStorage{Path: filepath.Join(file, "acme")}, log: slog.New(slog.NewJSONHandler(&logs, nil))}
	for range 3 {
		if err := g.Store(context.Background(), "rw_test_1", []byte("x")); err == nil {
			t.Fatal("a write under a file succeeded")
		}
	}
	lines := strings.Split(strings.TrimSpace(logs.String()), "\n")
	if len(lines) != 1 || !strings.Contains(lines[0], `"level":"WARN"`) || !strings.Contains(lines[0], `"key":"rw_test_1"`) ||
		!strings.Contains(lines[0], "storage write failed") || !strings.Contains(lines[0], "not a directory") {
		t.Fatalf("three failed writes logged %q, want one warning naming the key and the error", logs.String())
	}
	// The first line held none back: no "suppressed", as on every other
	// line that counts them (README, Observability).
	if strings.Contains(lines[0], "suppressed") {
		t.Errorf("the first warning carries a suppressed count: %s", lines[0])
	}

	logs.Reset()
	g.Storage = &certmagic.FileStorage{Path: t.TempDir()}
	if err := g.Store(context.Background(), "rw_test_2", []byte("x")); err != nil {
		t.Fatal(err)
	}
	if logs.Len() != 0 {
		t.Fatalf("a write that succeeded logged %q", logs.String())
	}
}
