package config

import (
	"testing"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// config stays low in the import graph: it reads settings and knows the
// route model (routing, redisstore), nothing that serves. The defaults
// serve -h shows come from proxy, certs, accesslog and telemetry through
// the binary (LoadCommand's shown), not by importing them here, which
// would pull fasthttp, certmagic and the OTel SDK into every user of
// config.
func TestImportsStayLow(t *testing.T) {
	testenv.ImportsAvoid(t, "proxy", "cmd", "certs", "telemetry", "accesslog", "auth")
}
