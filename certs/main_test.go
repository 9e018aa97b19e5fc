package certs_test

import (
	"fmt"
	"os"
	"testing"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// TestMain sets pebble's environment once, before any test runs: the
// ACME tests start pebble in parallel, and t.Setenv cannot be used there.
func TestMain(m *testing.M) {
	if err := testenv.SetPebbleEnv(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Exit(m.Run())
}
