package proxy

import (
	"log/slog"
	"path/filepath"
	"testing"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// A change whose routes file write fails (persist_routes, a full disk or
// a read-only file system) is live in memory only, and a restart undoes
// it. Its caller got the 500, but the process log had only the audit line
// saying the change was made: a control plane that did not report the 500
// left the operator no trace of why routes came back, or went, at the
// next restart (found with a 64 KiB tmpfs filled, then remounted
// read-only). Each such change now logs an error naming the sandbox and
// the write's error.
func TestAdminRoutesFileNotWrittenIsLogged(t *testing.T) {
	for _, tc := range []struct{ name, method, path, body string }{
		{"PUT", "PUT", "/admin/routes/box", `{"HostIP":"127.0.0.1"}`},
		{"upsert", "POST", "/admin/meta/upsert", `{"sandbox_id":"box","HostIP":"127.0.0.1"}`},
		{"DELETE", "DELETE", "/admin/routes/box", ""},
		{"meta/delete", "POST", "/admin/meta/delete", `{"sandbox_id":"box"}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var logs testenv.LogBuffer
			h := newHarness(t, func(o *harnessOpts) { o.cfg.Logger = slog.New(slog.NewJSONHandler(&logs, nil)) })
			h.route("box", 8080)
			// A routes file in a directory that does not exist: every
			// write fails.
			h.store.SetPersistPath(filepath.Join(t.TempDir(), "missing", "routes.yaml"))
			if st, out := h.adminJSON(tc.method, tc.path, tc.body); st != 500 {
				t.Fatalf("%d %v, want 500", st, out)
			}
			n := testenv.CountLines(logs.String(), `"level":"ERROR"`, "routes file not written", `"sandbox_id":"box"`, "no such file or directory")
			if n != 1 {
				t.Errorf("%d error lines naming the failed write, want 1; log:\n%s", n, logs.String())
			}
		})
	}
}
