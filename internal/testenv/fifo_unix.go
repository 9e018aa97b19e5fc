//go:build unix

package testenv

import (
	"path/filepath"
	"syscall"
	"testing"
)

// Mkfifo makes a named pipe called name in dir and returns its path.
// It fails the test rather than skip it: a test of what a FIFO does
// would otherwise pass by not running.
func Mkfifo(t testing.TB, dir, name string) string {
	t.Helper()
	path := filepath.Join(dir, name)
	if err := syscall.Mkfifo(path, 0o600); err != nil {
		t.Fatalf("mkfifo: %v", err)
	}
	return path
}
