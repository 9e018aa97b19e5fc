package routing

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"sync"
	"testing"
)

const exampleRoutes = `# routes of the test
routes:
  demo:
    HostIP: "127.0.0.1"
    SandboxIP: "127.0.0.1"
    CreatedAt: "1764460000000000000"
    "50005": "50005"
  private-1:
    HostIP: 10.0.0.2
    AllowPublicTraffic: false
    TrafficAccessToken: "` + testToken + `"
    MaskRequestHost: "${PORT}-private.internal"
    8080: 31080
    049983: "31983"
`

func writeFile(t *testing.T, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "routes.yaml")
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestLoadFile(t *testing.T) {
	s, err := LoadFile(writeFile(t, exampleRoutes))
	if err != nil {
		t.Fatal(err)
	}
	list := s.List()
	if len(list) != 2 || list[0].ID != "demo" || list[1].ID != "private-1" {
		t.Fatalf("List = %v", list)
	}
	demo, err := s.Lookup(context.Background(), "demo")
	if err != nil {
		t.Fatal(err)
	}
	want := &Route{ID: "demo", HostIP: netip.MustParseAddr("127.0.0.1"), SandboxIP: netip.MustParseAddr("127.0.0.1"),
		CreatedAt: 1764460000000000000, Public: true, Ports: map[uint16]uint16{50005: 50005}}
	if !reflect.DeepEqual(demo, want) {
		t.Fatalf("demo = %+v", demo)
	}
	// Unquoted YAML numbers and booleans are read as their literal text.
	p, ok := s.Get("private-1")
	if !ok || p.Public || p.TrafficToken != testToken || p.Ports[8080] != 31080 || p.Ports[49983] != 31983 {
		t.Fatalf("private-1 = %+v", p)
	}
	if _, err := s.Lookup(context.Background(), "nope"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Lookup(nope) = %v, want ErrNotFound", err)
	}
}

func TestLoadFileEmpty(t *testing.T) {
	for _, content := range []string{"", "# nothing\n", "routes:\n", "routes: {}\n", "---\nroutes: {}\n...\n", "routes: {}\n---\n# nothing more\n", "# a comment\n---\nroutes: {}\n"} {
		s, err := LoadFile(writeFile(t, content))
		if err != nil || len(s.List()) != 0 {
			t.Fatalf("LoadFile(%q) = %v, %v", content, s, err)
		}
	}
	if _, err := LoadFile(filepath.Join(t.TempDir(), "missing.yaml")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("missing file: %v, want fs.ErrNotExist", err)
	}
}

func TestLoadFileErrors(t *testing.T) {
	cases := []struct {
		name, content string
		want          []string // substrings of the error
	}{
		{"not yaml", "routes: [", []string{"yaml"}},
		{"top level list", "- a\n", []string{"top level"}},
		{"unknown top key", "route:\n  a: {HostIP: 1.2.3.4}\n", []string{`"route"`}},
		{"routes is a list", "routes:\n  - a\n", []string{"mapping"}},
		{"bad sandbox id", "routes:\n  Bad.Id:\n    HostIP: 1.2.3.4\n", []string{`"Bad.Id"`}},
		{"duplicate id", "routes:\n  a: {HostIP: 1.2.3.4}\n  a: {HostIP: 1.2.3.5}\n", []string{`"a"`, "twice"}},
		// Other YAML readers keep only the last "routes": a second one is
		// refused, not read as more of the first.
		{"routes twice", "routes:\n  a: {HostIP: 1.2.3.4}\nroutes:\n  b: {HostIP: 1.2.3.5}\n", []string{`"routes"`, "twice", "line 3"}},
		{"fields not a mapping", "routes:\n  a: 1.2.3.4\n", []string{`"a"`, "mapping"}},
		{"list value", "routes:\n  a:\n    HostIP: [1.2.3.4]\n", []string{`"a"`, "HostIP", "string"}},
		{"null value", "routes:\n  a:\n    HostIP: 1.2.3.4\n    SandboxIP:\n", []string{`"a"`, "SandboxIP", "string"}},
		{"invalid field", "routes:\n  a:\n    HostIP: nope\n", []string{`"a"`, "HostIP"}},
		{"unknown field", "routes:\n  a:\n    HostIP: 1.2.3.4\n    Hostip: 1.2.3.4\n", []string{`"a"`, "Hostip", "unknown"}},
		{"bad port value", "routes:\n  a:\n    HostIP: 1.2.3.4\n    \"8080\": 0\n", []string{`"a"`, "8080"}},
		{"restricted without token", "routes:\n  a:\n    HostIP: 1.2.3.4\n    AllowPublicTraffic: \"false\"\n", []string{`"a"`, "TrafficAccessToken"}},
		{"fail-closed bool", "routes:\n  a:\n    HostIP: 1.2.3.4\n    AllowPublicTraffic: no\n", []string{`"a"`, "AllowPublicTraffic"}},
		// Only the first document would be read: b's route would be
		// missing without a word (two files concatenated, each opening
		// with "---").
		{"second document", "---\nroutes:\n  a: {HostIP: 1.2.3.4}\n---\nroutes:\n  b: {HostIP: 1.2.3.4}\n", []string{"line 5", "another YAML document"}},
		{"second document after an empty one", "---\n---\nroutes:\n  b: {HostIP: 1.2.3.4}\n", []string{"line 3", "another YAML document"}},
		{"broken second document", "routes:\n  a: {HostIP: 1.2.3.4}\n---\nroutes: [\n", []string{"yaml"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			path := writeFile(t, tc.content)
			s, err := LoadFile(path)
			if err == nil {
				t.Fatalf("LoadFile succeeded with %d routes", len(s.List()))
			}
			for _, w := range append(tc.want, path) {
				if !strings.Contains(err.Error(), w) {
					t.Fatalf("error %q does not mention %q", err, w)
				}
			}
		})
	}
}

func mustRoute(t testing.TB, id string, kv ...string) *Route {
	t.Helper()
	fields := map[string]string{FieldHostIP: "10.0.0.1"}
	for i := 0; i+1 < len(kv); i += 2 {
		fields[kv[i]] = kv[i+1]
	}
	r, err := ParseRouteStrict(id, fields)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestMemoryStorePersist(t *testing.T) {
	path := writeFile(t, exampleRoutes)
	if err := os.Chmod(path, 0o640); err != nil {
		t.Fatal(err)
	}
	s, err := LoadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	// Without a persist path nothing is written.
	if err := s.Put(mustRoute(t, "unsaved")); err != nil {
		t.Fatal(err)
	}
	if again, _ := LoadFile(path); again == nil || len(again.List()) != 2 {
		t.Fatal("Put without persist path changed the file")
	}
	s.SetPersistPath(path)
	added := mustRoute(t, "new-box", FieldAllowPublicTraffic, "false", FieldTrafficAccessToken, testToken, "3000", "31000", "123", "456")
	if err := s.Put(added); err != nil {
		t.Fatal(err)
	}
	if ok, err := s.Remove("demo"); !ok || err != nil {
		t.Fatalf("Remove(demo) = %v, %v", ok, err)
	}
	if ok, err := s.Remove("demo"); ok || err != nil {
		t.Fatalf("second Remove(demo) = %v, %v", ok, err)
	}
	reloaded, err := LoadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(reloaded.List(), s.List()) {
		t.Fatalf("reloaded %v, want %v", reloaded.List(), s.List())
	}
	if _, ok := reloaded.Get("demo"); ok {
		t.Fatal("deleted route is still in the file")
	}
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o640 {
		t.Fatalf("file mode after rewrite = %v, %v; want 0640 kept", fi.Mode(), err)
	}
	data, _ := os.ReadFile(path)
	for _, want := range []string{"routes:\n", "  new-box:\n", `    HostIP: "10.0.0.1"`, `    "3000": "31000"`, `    AllowPublicTraffic: "false"`} {
		if !strings.Contains(string(data), want) {
			t.Fatalf("file lacks %q:\n%s", want, data)
		}
	}
	// No temporary files left behind.
	entries, _ := os.ReadDir(filepath.Dir(path))
	if len(entries) != 1 {
		t.Fatalf("directory holds %d files, want 1", len(entries))
	}
	// Deleting everything writes a file that loads as empty.
	for _, r := range s.List() {
		s.Remove(r.ID)
	}
	if empty, err := LoadFile(path); err != nil || len(empty.List()) != 0 {
		t.Fatalf("empty table reload: %v, %v", empty, err)
	}
}

// The persisted file holds traffic tokens: whatever mode the operator's
// file had (a checked-out routes.yaml is 0644), other users of the host
// must not read it after an admin change wrote a token into it. Group and
// owner bits are kept.
func TestMemoryStorePersistNotWorldReadable(t *testing.T) {
	for _, tc := range []struct {
		before, after os.FileMode // before 0: no file yet
	}{
		{0, 0o600},
		{0o644, 0o640},
		{0o666, 0o660},
		{0o604, 0o600},
		{0o640, 0o640},
		{0o600, 0o600},
	} {
		t.Run(tc.before.String(), func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "routes.yaml")
			if tc.before != 0 {
				if err := os.WriteFile(path, []byte("routes: {}\n"), tc.before); err != nil {
					t.Fatal(err)
				}
				if err := os.Chmod(path, tc.before); err != nil { // past the umask
					t.Fatal(err)
				}
			}
			fi := putTokenThroughFile(t, path)
			if got := fi.Mode().Perm(); got != tc.after {
				t.Errorf("file mode %v before, %v after the write; want %v", tc.before, got, tc.after)
			}
		})
	}
}

// putTokenThroughFile stores a route with a traffic token in a store that
// persists to path, as an admin change does, and returns the rewritten
// file's info.
func putTokenThroughFile(t *testing.T, path string) os.FileInfo {
	t.Helper()
	s := NewMemoryStore()
	s.SetPersistPath(path)
	if err := s.Put(mustRoute(t, "private", FieldAllowPublicTraffic, "false", FieldTrafficAccessToken, testToken)); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi
}

func TestMemoryStorePutValidates(t *testing.T) {
	s := NewMemoryStore()
	bad := []*Route{
		nil,
		{ID: "Bad ID", HostIP: netip.MustParseAddr("10.0.0.1"), Public: true},
		{ID: "a", Public: true}, // no HostIP
		{ID: "a", HostIP: netip.MustParseAddr("10.0.0.1"), Public: false},                  // restricted, no token
		{ID: "a", HostIP: netip.MustParseAddr("10.0.0.1"), Ports: map[uint16]uint16{0: 1}}, // port 0
	}
	for i, r := range bad {
		if err := s.Put(r); err == nil {
			t.Errorf("Put(bad[%d]) succeeded", i)
		}
	}
	if len(s.List()) != 0 {
		t.Fatal("invalid routes were stored")
	}
	// Put stores a copy: later changes to the caller's route do not leak in.
	r := mustRoute(t, "a", "80", "8080")
	if err := s.Put(r); err != nil {
		t.Fatal(err)
	}
	r.Ports[80] = 1
	if got, _ := s.Get("a"); got.Ports[80] != 8080 {
		t.Fatal("store shares the caller's route")
	}
}

func TestMemoryStorePersistError(t *testing.T) {
	s := NewMemoryStore()
	s.SetPersistPath(filepath.Join(t.TempDir(), "no-such-dir", "routes.yaml"))
	if err := s.Put(mustRoute(t, "a")); err == nil {
		t.Fatal("Put into an unwritable path reported no error")
	}
	if _, ok := s.Get("a"); !ok {
		t.Fatal("in-memory change lost when the write failed")
	}
	if ok, err := s.Remove("a"); !ok || err == nil {
		t.Fatalf("Remove = %v, %v; want true and a write error", ok, err)
	}
}

func TestCheckPersistPath(t *testing.T) {
	dir := t.TempDir()
	if err := CheckPersistPath(filepath.Join(dir, "routes.yaml")); err != nil {
		t.Fatalf("writable directory, no file yet: %v", err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Fatalf("the check left %d files behind", len(entries))
	}
	missing := filepath.Join(dir, "missing", "routes.yaml")
	if err := CheckPersistPath(missing); err == nil || !strings.Contains(err.Error(), missing) {
		t.Fatalf("missing directory: %v, want an error naming %s", err, missing)
	}
	if os.Geteuid() == 0 {
		return // root writes anywhere
	}
	ro := t.TempDir()
	if err := os.Chmod(ro, 0o555); err != nil {
		t.Fatal(err)
	}
	if err := CheckPersistPath(filepath.Join(ro, "routes.yaml")); err == nil {
		t.Fatal("read-only directory: no error")
	}
}

func TestMemoryStoreConcurrent(t *testing.T) {
	path := filepath.Join(t.TempDir(), "routes.yaml")
	s := NewMemoryStore()
	s.SetPersistPath(path)
	const writers, perWriter = 4, 25
	var wg sync.WaitGroup
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range perWriter {
				id := fmt.Sprintf("w%d-%d", w, i)
				if err := s.Put(mustRoute(t, id)); err != nil {
					t.Error(err)
					return
				}
				if i%5 == 0 {
					s.Remove(id)
				}
			}
		}()
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range perWriter * 4 {
				id := fmt.Sprintf("w%d-%d", w, i%perWriter)
				if r, err := s.Lookup(context.Background(), id); err == nil && r.ID != id {
					t.Errorf("Lookup(%s) returned %s", id, r.ID)
				} else if err != nil && !errors.Is(err, ErrNotFound) {
					t.Error(err)
				}
				_ = s.List()
			}
		}()
	}
	wg.Wait()
	if n := len(s.List()); n != writers*(perWriter-perWriter/5) {
		t.Fatalf("%d routes, want %d", n, writers*(perWriter-perWriter/5))
	}
	// The last write to land is the newest snapshot.
	reloaded, err := LoadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(reloaded.List(), s.List()) {
		t.Fatalf("file holds %d routes, memory %d", len(reloaded.List()), len(s.List()))
	}
}

// FuzzDecodeRoutes feeds arbitrary routes.yaml text to the file parser: an
// error or a table, never a panic, and a table it accepts is written back
// (as the store persists admin changes) into text that loads as the same
// table.
func FuzzDecodeRoutes(f *testing.F) {
	f.Add([]byte(exampleRoutes))
	f.Add([]byte("routes:\n  a:\n    HostIP: 10.0.0.1\n    \"50005\": 31000\n    AllowPublicTraffic: false\n    TrafficAccessToken: " + testToken + "\n"))
	f.Add([]byte("routes:\n  a: {HostIP: 10.0.0.1}\n  a: {HostIP: 10.0.0.2}\n"))
	f.Add([]byte("routes: [1, 2]\n"))
	f.Add([]byte("routes:\n  b:\n    HostIP: &x 10.0.0.1\n    SandboxIP: *x\n"))
	f.Add([]byte("routes:\n  a: &r {HostIP: 10.0.0.1, \"80\": \"1\"}\n  b: *r\n  c:\n    <<: [*r, {SandboxIP: 10.0.0.2}]\n    \"80\": \"2\"\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		routes, err := decodeRoutes(data)
		if err != nil {
			return
		}
		list := make([]*Route, 0, len(routes))
		for _, r := range routes {
			list = append(list, r)
		}
		sort.Slice(list, func(i, j int) bool { return list[i].ID < list[j].ID })
		out, err := encodeRoutes(list)
		if err != nil {
			t.Fatalf("encoding %d accepted routes: %v", len(list), err)
		}
		again, err := decodeRoutes(out)
		if err != nil {
			t.Fatalf("the written file does not load: %v\n%s", err, out)
		}
		if !reflect.DeepEqual(routes, again) {
			t.Fatalf("routes %v were written as\n%s\nand loaded back as %v", routes, out, again)
		}
	})
}
