package routing_test

import (
	"strings"
	"testing"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// DESIGN.md's layout: dependencies point one way, cmd -> proxy ->
// routing, auth, certs. routing (the route model, stores, cache) is used
// by the proxy and config alike and must never pull in the edge or the
// binary.
func TestImportsPointOneWay(t *testing.T) {
	// proxy importing this package already makes the reverse a compile
	// error (an import cycle); cmd, which wires everything, would not be.
	const module = "github.com/cube-sandbox/cubeproxy/"
	for _, dep := range testenv.Imports(t, false) {
		rest, ok := strings.CutPrefix(dep, module)
		if !ok {
			continue
		}
		for _, banned := range []string{"proxy", "cmd"} {
			if rest == banned || strings.HasPrefix(rest, banned+"/") {
				t.Errorf("routing depends on %s", dep)
			}
		}
	}
}
