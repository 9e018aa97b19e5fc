package routing_test

import (
	"testing"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// DESIGN.md's layout: dependencies point one way, cmd -> proxy ->
// routing, auth, certs. routing (the route model, stores, cache) is used
// by the proxy and config alike and must never pull in the edge or the
// binary.
func TestImportsPointOneWay(t *testing.T) {
	testenv.ImportsAvoid(t, "proxy", "cmd")
}
