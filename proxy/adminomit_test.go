package proxy

import (
	"io"
	"net/http"
	"strings"
	"testing"
)

// A route body is the whole route: a field left out is not kept from the
// stored one. AllowPublicTraffic left out means public, so a body that
// leaves it out over a restricted route of the same sandbox (a control
// plane updating HostIP or a port, as it would HSET one field in Redis)
// is refused with a 400 naming it, not stored as a public route without
// its token. Said outright ("true"), or for a sandbox created again under
// the id (a later CreatedAt), the route is public as asked.
func TestAdminStoreDoesNotOpenARestrictedRouteByOmission(t *testing.T) {
	h := newHarness(t)
	port := itoa(backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })))
	const token = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	restricted := `"HostIP":"127.0.0.1","CreatedAt":"100","AllowPublicTraffic":"false","TrafficAccessToken":"` + token + `","80":"` + port + `"`
	for _, tc := range []struct {
		name, body string // body's members, without sandbox_id
		status     int
		public     bool // what the stored route is afterwards
	}{
		{"left out", `"HostIP":"127.0.0.1","80":"` + port + `"`, 400, false},
		{"left out, same CreatedAt", `"HostIP":"127.0.0.1","CreatedAt":"100","80":"` + port + `"`, 400, false},
		{"left out, earlier CreatedAt", `"HostIP":"127.0.0.1","CreatedAt":"99","80":"` + port + `"`, 400, false},
		{"said true", `"HostIP":"127.0.0.1","AllowPublicTraffic":"true","80":"` + port + `"`, 200, true},
		{"left out, sandbox created again", `"HostIP":"127.0.0.1","CreatedAt":"101","80":"` + port + `"`, 200, true},
		{"kept restricted", `"HostIP":"127.0.0.1","AllowPublicTraffic":"false","TrafficAccessToken":"` + token + `","80":"` + port + `"`, 200, false},
	} {
		for _, via := range []struct{ method, path, prefix string }{
			{"PUT", "/admin/routes/omit", ""},
			{"POST", "/admin/meta/upsert", `"sandbox_id":"omit",`},
		} {
			if st, out := h.adminDo("PUT", "/admin/routes/omit", "{"+restricted+"}", ""); st != 200 {
				t.Fatalf("storing the restricted route: %d %s", st, out)
			}
			st, out := h.adminDo(via.method, via.path, "{"+via.prefix+tc.body+"}", "")
			if st != tc.status {
				t.Errorf("%s via %s: %d %s, want %d", tc.name, via.method, st, out, tc.status)
			}
			if st == 400 && !strings.Contains(out, "AllowPublicTraffic") {
				t.Errorf("%s via %s: the 400 does not name AllowPublicTraffic: %s", tc.name, via.method, out)
			}
			// What traffic gets: a request without the token is let
			// through only by a public route.
			want := 403
			if tc.public {
				want = 200
			}
			if code, body, _ := h.get("80-omit.cube.test", "/"); code != want {
				t.Errorf("%s via %s: a request without the traffic token got %d %s, want %d", tc.name, via.method, code, body, want)
			}
		}
	}
}
