//go:build unix

package routing

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// A rewrite keeps the routes file's owner and group. The new file was the
// proxy's, in the proxy's group, with the old file's group bits: a 0640
// file of group "secrets" became a 0640 file of the proxy's group, whose
// members could now read every traffic token in it, and a root proxy
// rewriting an operator's file took it away from the operator.
func TestPersistKeepsOwnerAndGroup(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to give the file another owner and group")
	}
	for _, tc := range []struct {
		name     string
		uid, gid int
		mode     os.FileMode
	}{
		{"another group", 0, 4242, 0o640},
		{"another owner and group", 4343, 4242, 0o600},
		{"another owner, group readable", 4343, 0, 0o644},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "routes.yaml")
			if err := os.WriteFile(path, []byte("routes: {}\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Chown(path, tc.uid, tc.gid); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(path, tc.mode); err != nil {
				t.Fatal(err)
			}
			fi := putTokenThroughFile(t, path)
			st := fi.Sys().(*syscall.Stat_t)
			if int(st.Uid) != tc.uid || int(st.Gid) != tc.gid {
				t.Errorf("owner %d:%d after the write, want %d:%d as before", st.Uid, st.Gid, tc.uid, tc.gid)
			}
			if want := tc.mode &^ 0o007; fi.Mode().Perm() != want {
				t.Errorf("mode %v after the write, want %v", fi.Mode().Perm(), want)
			}
		})
	}
}
