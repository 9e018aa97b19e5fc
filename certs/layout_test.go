package certs_test

import (
	"testing"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// DESIGN.md's layout: dependencies point one way, cmd -> proxy ->
// routing, auth, certs. certs is wired by the binary; it must never pull in
// the edge or the binary (nothing would stop it: proxy does not import
// certs, so the reverse import is no cycle the compiler refuses).
func TestImportsPointOneWay(t *testing.T) {
	t.Parallel() // waits on `go list`
	testenv.ImportsAvoid(t, "proxy", "cmd")
}
