package proxy

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/valyala/fasthttp"
)

// An admin 400 that quotes what it refused (a sandbox_id, a field name, a
// port, a ttl) quotes it as the route errors and /admin/state do
// (routing.Echo): escaped, and at most 64 bytes of it. fmt's %q repeated a
// value whole, so a 64 KiB sandbox_id came back as a 64 KiB error (and as
// much again in every log line that keeps the error).
func TestAdminRefusalsQuoteABoundedValue(t *testing.T) {
	h := newHarness(t)
	signer := testSigner(t)
	ln := listen(t, "127.0.0.1:0")
	srv := &fasthttp.Server{Handler: NewAdmin(AdminConfig{Signer: signer}, h.proxy).Handler, MaxRequestBodySize: maxAdminBody}
	go srv.Serve(ln)
	t.Cleanup(func() { _ = srv.Shutdown() })

	long := strings.Repeat("B", 64<<10)
	echo := `"` + long[:64] + `"...`
	for _, tc := range []struct {
		name, addr, path, body, want string
	}{
		{"upsert sandbox_id", h.admin, "/admin/meta/upsert", `{"sandbox_id":"` + long + `","HostIP":"127.0.0.1"}`, `sandbox_id ` + echo + ` is not a sandbox id`},
		{"delete sandbox_id", h.admin, "/admin/meta/delete", `{"sandbox_id":"` + long + `"}`, `sandbox_id ` + echo + ` is not a sandbox id`},
		{"cache sandbox_id", h.admin, "/admin/backend_cache/delete", `{"sandbox_id":"` + long + `"}`, `sandbox_id ` + echo + ` is not a sandbox id`},
		{"state sandbox_id", h.admin, "/admin/state", `{"sandbox_id":"` + long + `","state":"paused"}`, `sandbox_id ` + echo + ` is not a sandbox id`},
		{"field twice", h.admin, "/admin/state", `{"` + long + `":1,"` + long + `":2}`, `field ` + echo + ` given twice`},
		{"token sandbox_id", ln.Addr().String(), "/admin/tokens", `{"sandbox_id":"` + long + `","port":8080}`, `sandbox_id ` + echo + ` is not a sandbox id`},
		{"token field", ln.Addr().String(), "/admin/tokens", `{"` + long + `":1}`, `unknown field ` + echo},
		{"token port", ln.Addr().String(), "/admin/tokens", `{"sandbox_id":"box","port":1` + strings.Repeat("0", 64<<10) + `}`, `port 1` + strings.Repeat("0", 63) + `... is not a port`},
		{"token ttl", ln.Addr().String(), "/admin/tokens", `{"sandbox_id":"box","port":8080,"ttl":"` + long + `"}`, `ttl ` + echo + `: want a duration`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, err := http.Post("http://"+tc.addr+tc.path, "application/json", strings.NewReader(tc.body))
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			var out struct{ Error string }
			_ = json.Unmarshal(b, &out)
			if resp.StatusCode != 400 || !strings.Contains(out.Error, tc.want) || len(b) > 1024 {
				if len(b) > 300 {
					b = append(b[:300], "..."...)
				}
				t.Errorf("%d %s (%d bytes), want 400 quoting %q in under 1 KiB", resp.StatusCode, b, len(b), tc.want)
			}
		})
	}
}
