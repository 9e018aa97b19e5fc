//go:build !unix

package testenv

import (
	"net"
	"strconv"
	"testing"
)

// RefusingPort returns a port on 127.0.0.1 nothing listens on, for a
// moment only: the unix version holds it until the test ends.
func RefusingPort(t testing.TB) int {
	t.Helper()
	return FreePort(t)
}

// RefusingAddr is 127.0.0.1:RefusingPort(t).
func RefusingAddr(t testing.TB) string {
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(RefusingPort(t)))
}
