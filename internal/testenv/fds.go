package testenv

import (
	"os"
	"testing"
)

// OpenFDs counts this process's open descriptors (Linux: /proc/self/fd),
// for tests that check nothing outlives what they closed.
func OpenFDs(t testing.TB) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal("counting open descriptors:", err)
	}
	return len(ents)
}
