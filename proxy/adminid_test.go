package proxy

import (
	"strings"
	"testing"
)

// A sandbox id the admin API refuses is answered with what an id is: a
// control plane that sent "MyBox" (Host is case-insensitive, so why not
// the id?) or one of 129 characters got "invalid sandbox id" or
// "sandbox_id missing or invalid" and had to find the rule elsewhere; the
// routes file's error and POST /admin/tokens's say it.
func TestAdminSaysWhatASandboxIDIs(t *testing.T) {
	h := newHarness(t)
	const rule = "lower-case letters, digits, - and _, at most 128, starting with a letter or digit"
	long := strings.Repeat("a", 129)
	for _, tc := range []struct{ method, path, body string }{
		{"GET", "/admin/routes/MyBox", ""},
		{"PUT", "/admin/routes/MyBox", `{"HostIP":"10.0.0.1"}`},
		{"DELETE", "/admin/routes/" + long, ""},
		{"PUT", "/admin/routes/-lead", `{"HostIP":"10.0.0.1"}`},
		{"POST", "/admin/meta/upsert", `{"sandbox_id":"MyBox","HostIP":"10.0.0.1"}`},
		{"POST", "/admin/meta/delete", `{"sandbox_id":"` + long + `"}`},
		{"POST", "/admin/backend_cache/delete", `{"sandbox_id":"a.b"}`},
		{"POST", "/admin/state", `{"sandbox_id":"MyBox","state":"running"}`},
		{"GET", "/admin/routes?after=MyBox", ""},
	} {
		status, body := h.adminDo(tc.method, tc.path, tc.body, "")
		if status != 400 || !strings.Contains(body, rule) {
			t.Errorf("%s %s %s: %d %s; want a 400 that says a sandbox id is %s", tc.method, tc.path, tc.body, status, body, rule)
		}
	}
	// One that is no string is said to be that.
	if status, body := h.adminDo("POST", "/admin/meta/upsert", `{"sandbox_id":7,"HostIP":"10.0.0.1"}`, ""); status != 400 || !strings.Contains(body, "must be a string") {
		t.Errorf("meta/upsert with a number for sandbox_id: %d %s; want a 400 saying it must be a string", status, body)
	}
	// One left out is said to be missing.
	if status, body := h.adminDo("POST", "/admin/meta/delete", `{}`, ""); status != 400 || !strings.Contains(body, "sandbox_id missing") {
		t.Errorf("meta/delete without sandbox_id: %d %s; want a 400 saying it is missing", status, body)
	}
}
