package routing

import (
	"maps"
	"strconv"
	"strings"
	"testing"
)

// A routes file is YAML, and YAML's anchors, aliases and merge keys are
// the way to write one value (a node's address, a shared token) once.
// The file refused every alias: "field HostIP: value must be a string"
// for "HostIP: *node1", which is one, and a merge key ("<<: *base") was
// taken for a field of its own; the start failed on a valid file.
func TestLoadFileFollowsAliases(t *testing.T) {
	const file = `routes:
  a: &base
    HostIP: &node1 "10.0.0.7"
    TrafficAccessToken: &tok "` + testToken + `"
    AllowPublicTraffic: "false"
    "80": "2000"
  b:
    HostIP: *node1
    "80": "2001"
  c: *base
  d:
    <<: *base
    "80": "2002"
    "443": "2443"
  e:
    <<: [{HostIP: "10.0.0.8", "80": "1"}, *base]
    "22": "2022"
`
	s, err := LoadFile(writeFile(t, file))
	if err != nil {
		t.Fatal(err)
	}
	a := map[string]string{FieldHostIP: "10.0.0.7", FieldTrafficAccessToken: testToken, FieldAllowPublicTraffic: "false", "80": "2000"}
	want := map[string]map[string]string{
		"a": a,
		"b": {FieldHostIP: "10.0.0.7", "80": "2001"},
		"c": a,
		// A mapping's own keys win over merged ones.
		"d": {FieldHostIP: "10.0.0.7", FieldTrafficAccessToken: testToken, FieldAllowPublicTraffic: "false", "80": "2002", "443": "2443"},
		// Of the mappings merged, the earlier one wins.
		"e": {FieldHostIP: "10.0.0.8", FieldTrafficAccessToken: testToken, FieldAllowPublicTraffic: "false", "80": "1", "22": "2022"},
	}
	got := map[string]map[string]string{}
	for _, r := range s.List() {
		got[r.ID] = r.Fields()
	}
	if !maps.EqualFunc(got, want, maps.Equal) {
		t.Fatalf("routes read:\n%v\nwant:\n%v", got, want)
	}
}

// What an alias or merge key may not stand for is refused with the line
// of its use, and what it should be.
func TestLoadFileAliasErrors(t *testing.T) {
	for _, tc := range []struct {
		name, content string
		want          []string
	}{
		{"route alias to a scalar", "routes:\n  a:\n    HostIP: &ip 1.2.3.4\n  b: *ip\n", []string{`"b"`, "line 4", "mapping"}},
		{"value alias to a list", "routes:\n  a:\n    HostIP: 1.2.3.4\n    \"80\": &l [1]\n  b:\n    HostIP: 1.2.3.4\n    \"81\": *l\n", []string{`"a"`, "line 4", "string"}},
		{"merge of a scalar", "routes:\n  a:\n    HostIP: &ip 1.2.3.4\n  b:\n    <<: *ip\n", []string{`"b"`, "line 5", "merge key"}},
		{"merge of a list of scalars", "routes:\n  a:\n    HostIP: &ip 1.2.3.4\n  b:\n    <<: [*ip]\n", []string{`"b"`, "line 5", "merge key"}},
		{"merged field given twice is no error, own twice is", "routes:\n  a: &r {HostIP: 1.2.3.4}\n  b:\n    <<: *r\n    HostIP: 1.2.3.5\n    HostIP: 1.2.3.6\n", []string{`"b"`, "line 6", "twice"}},
		// The parser takes an anchored mapping holding an alias of itself;
		// followed, it recursed until the stack ran out.
		{"merge of the mapping it is in", "routes:\n  a: &x {HostIP: 1.2.3.4, <<: *x}\n", []string{`"a"`, "line 2", "into itself"}},
		{"merge of the mapping it is in, further down", "routes:\n  a: &x\n    HostIP: 1.2.3.4\n    <<: {<<: *x}\n", []string{`"a"`, "line 4", "into itself"}},
		{"value alias of the mapping it is in", "routes:\n  a: &x\n    HostIP: 1.2.3.4\n    \"80\": *x\n", []string{`"a"`, "line 4", "string"}},
		{"an invalid merged value names its sandbox", "routes:\n  a: &r {HostIP: 1.2.3.4, Foo: x}\n", []string{`"a"`, "Foo", "unknown field"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := writeFile(t, tc.content)
			_, err := LoadFile(path)
			if err == nil {
				t.Fatal("LoadFile succeeded")
			}
			for _, w := range append(tc.want, path) {
				if !strings.Contains(err.Error(), w) {
					t.Fatalf("error %q does not mention %q", err, w)
				}
			}
		})
	}
}

// Aliases cannot make a small file take unbounded work: merge keys nested
// level on level double what each level stands for.
func TestLoadFileAliasBomb(t *testing.T) {
	var b strings.Builder
	b.WriteString("routes:\n  l0: &l0 {HostIP: 1.2.3.4, \"1\": \"1\", \"2\": \"2\", \"3\": \"3\"}\n")
	for i := 1; i <= 40; i++ {
		p := "*l" + strconv.Itoa(i-1)
		b.WriteString("  l" + strconv.Itoa(i) + ": &l" + strconv.Itoa(i) + " {<<: [" + p + ", " + p + ", " + p + ", " + p + "]}\n")
	}
	_, err := LoadFile(writeFile(t, b.String()))
	if err == nil || !strings.Contains(err.Error(), "aliases") {
		t.Fatalf("LoadFile = %v; want a refusal of the aliases' expansion", err)
	}
}
