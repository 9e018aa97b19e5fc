package proxy

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
)

// /readyz answers without a token (load balancers probe it), so the
// store's error text, which names Redis addresses, the ACL user and what
// Redis said, goes only to a caller the rest of the admin API would
// serve: the token's holder, or with no token configured a loopback
// client. Anyone else gets the reason as a code; the detail is in the
// log.
func TestReadyzDetailNeedsAdminCredential(t *testing.T) {
	const detail = "no route read from the store has succeeded yet: dial tcp 10.9.8.7:6379: NOPERM User proxy has no permissions"
	ready := func() error { return errors.New(detail) }
	for _, tc := range []struct {
		name       string
		token      string // configured
		send       string // X-Cube-Admin-Token sent
		origin     string // Origin sent (a browser page on this host)
		wantDetail bool
	}{
		{"token configured, none sent", "tok-" + strings.Repeat("x", 32), "", "", false},
		{"token configured, wrong one sent", "tok-" + strings.Repeat("x", 32), "nope", "", false},
		{"token configured and sent", "tok-" + strings.Repeat("x", 32), "tok-" + strings.Repeat("x", 32), "", true},
		{"no token, loopback client", "", "", "", true},
		{"no token, a browser page's request", "", "", "http://evil.example", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, func(o *harnessOpts) { o.token = tc.token; o.ready = ready })
			r, _ := http.NewRequest("GET", "http://"+h.admin+"/readyz", nil)
			if tc.send != "" {
				r.Header.Set("X-Cube-Admin-Token", tc.send)
			}
			if tc.origin != "" {
				r.Header.Set("Origin", tc.origin)
			}
			resp, err := http.DefaultClient.Do(r)
			if err != nil {
				t.Fatal(err)
			}
			raw, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			var got map[string]any
			if err := json.Unmarshal(raw, &got); err != nil || resp.StatusCode != 503 {
				t.Fatalf("%d %s, want a 503 JSON answer", resp.StatusCode, raw)
			}
			if got["ready"] != false || got["reason"] != ReadyStoreUnreachable {
				t.Errorf("%s: want ready false, reason %q", raw, ReadyStoreUnreachable)
			}
			leaked := strings.Contains(string(raw), "10.9.8.7") || strings.Contains(string(raw), "NOPERM")
			if tc.wantDetail && got["detail"] != detail {
				t.Errorf("%s: want the store's error as detail", raw)
			}
			if !tc.wantDetail && leaked {
				t.Errorf("%s: the store's error reached a caller without the admin credential", raw)
			}
		})
	}
}
