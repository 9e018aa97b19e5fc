package config

import (
	"os"
	"path/filepath"
	"testing"
)

// AdminAddr finds admin_addr where LoadCommand does, in a file the rest
// of which no longer loads.
func TestAdminAddrAlone(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	broken := write("broken.yaml", "admin_addr: 127.0.0.1:9\ndrain_timeout: soon\nno_such: 1\n")
	none := write("none.yaml", "drain_timeout: soon\n")
	for _, tc := range []struct {
		name, path string
		env        map[string]string
		want       string
	}{
		{"file", broken, nil, "127.0.0.1:9"},
		{"CUBEPROXY_CONFIG", "", map[string]string{"CUBEPROXY_CONFIG": broken}, "127.0.0.1:9"},
		{"variable over file", broken, map[string]string{"CUBEPROXY_ADMIN_ADDR": "127.0.0.1:10"}, "127.0.0.1:10"},
		{"default", none, nil, Default().AdminAddr},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := AdminAddr(tc.path, func(k string) string { return tc.env[k] })
			if err != nil || got != tc.want {
				t.Fatalf("AdminAddr = %q, %v; want %q", got, err, tc.want)
			}
		})
	}
	if _, err := AdminAddr(write("bad.yaml", "admin_addr: [\n"), func(string) string { return "" }); err == nil {
		t.Fatal("no error for a file whose YAML cannot be read")
	}
}
