package proxy

import (
	"testing"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// freePort is a port on 127.0.0.1 that refuses connections until the test
// ends (see testenv.RefusingPort).
func freePort(t *testing.T) uint16 {
	t.Helper()
	return uint16(testenv.RefusingPort(t))
}
