package proxy

import (
	"context"
	"net/netip"
	"testing"

	"github.com/cube-sandbox/cubeproxy/routing/redisstore"
)

// On the node that runs the sandbox the platform's proxy dials
// SandboxIP:<container port> for any container port: its hash's port
// fields (only the control plane's exposed_port_list, ["80"] by default,
// and none with enable_exposed_port off) are read only for a sandbox on
// another node. A request on this node for a port the hash does not map
// was a 404 port_not_mapped here, where the platform served it: every
// app port on a one-node install. On another node an unmapped port stays
// a 404, as there.
func TestSameNodeServesUnmappedPortFromRedis(t *testing.T) {
	r, store := redisStore(t)
	h := newHarness(t, func(o *harnessOpts) {
		o.store = store
		o.noAdminRoutes = true
		o.cfg.NodeIP = netip.MustParseAddr("127.0.0.1")
	})
	sandboxPort := backend(t, "127.0.0.2", whoami("sandbox"))
	i := uint16(0)
	for _, tc := range []struct {
		name   string
		fields []any // besides CreatedAt and AllowPublicTraffic, as the control plane writes them
		status int
		code   string
	}{
		{"this node, exposed_port_list [80]", []any{"HostIP", "127.0.0.1", "SandboxIP", "127.0.0.2", "80", "20080"}, 200, ""},
		{"this node, no port fields", []any{"HostIP", "127.0.0.1", "SandboxIP", "127.0.0.2"}, 200, ""},
		{"this node, no SandboxIP", []any{"HostIP", "127.0.0.1", "80", "20080"}, 404, CodeRouteInvalid},
		{"another node, port not mapped", []any{"HostIP", "127.0.0.9", "SandboxIP", "127.0.0.2", "80", "20080"}, 404, CodePortNotMapped},
	} {
		i++
		t.Run(tc.name, func(t *testing.T) {
			id := "samenode" + itoa(i)
			args := append([]any{"CreatedAt", "1", "AllowPublicTraffic", "true"}, tc.fields...)
			if err := r.Client().HSet(context.Background(), redisstore.DefaultKeyPrefix+id, args...).Err(); err != nil {
				t.Fatal(err)
			}
			pc := h.dialProxy(t)
			resp, body := pc.do("GET", itoa(sandboxPort)+"-"+id+".cube.test", "/", "")
			if tc.status == 200 {
				if resp.StatusCode != 200 || len(body) < 7 || body[:7] != "sandbox" {
					t.Fatalf("got %d %q, want 200 from the sandbox's own address", resp.StatusCode, body)
				}
				return
			}
			checkProxyError(t, resp, body, tc.status, tc.code)
		})
	}
}
