package routing

import (
	"bytes"
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// encodeTable is routes covering every field, ids a YAML reader could take
// for a number, a boolean or null, and a route with ports only.
func encodeTable(t testing.TB) []*Route {
	t.Helper()
	var out []*Route
	for _, id := range []string{"abc", "123", "0x1f", "1e5", "true", "null", "y", "no", "off", "a_b-c", "9-lives", "_x"} {
		if !ValidID(id) {
			continue
		}
		out = append(out, mustRoute(t, id))
	}
	full, err := ParseRouteStrict("full", map[string]string{
		FieldHostIP: "fd00::1", FieldSandboxIP: "10.1.2.3", FieldCreatedAt: "1764460000000000000",
		FieldAllowPublicTraffic: "false", FieldTrafficAccessToken: testToken,
		FieldMaskRequestHost: "h-${PORT}.example.com:8080", "50005": "31005", "3000": "3000", "1": "65535",
	})
	if err != nil {
		t.Fatal(err)
	}
	out = append(out, full)
	slices.SortFunc(out, func(a, b *Route) int { return strings.Compare(a.ID, b.ID) })
	return out
}

// The routes file reads the same to any YAML reader, and to the store, as
// the yaml encoder's rendering of the table did.
func TestEncodeRoutesReadsAsYAMLEncoderOutput(t *testing.T) {
	routes := encodeTable(t)
	got, err := encodeRoutes(routes)
	if err != nil {
		t.Fatal(err)
	}
	want := encodeRoutesWithNodes(t, routes)
	var g, w map[string]map[string]map[string]string
	if err := yaml.Unmarshal(got, &g); err != nil {
		t.Fatalf("written file is not YAML: %v\n%s", err, got)
	}
	if err := yaml.Unmarshal(want, &w); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(g, w) {
		t.Fatalf("written file reads as\n%v\nthe yaml encoder's as\n%v\nfile:\n%s", g, w, got)
	}
	// Line for line the same, but for the quotes on ids a reader could
	// take for something other than a string.
	if unq := bytes.ReplaceAll(got, []byte(`"`), nil); !bytes.Equal(unq, bytes.ReplaceAll(want, []byte(`"`), nil)) {
		t.Errorf("file\n%s\nyaml encoder\n%s", got, want)
	}
	back, err := decodeRoutes(got)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range routes {
		if !reflect.DeepEqual(back[r.ID], r) {
			t.Errorf("route %s read back as %+v, want %+v", r.ID, back[r.ID], r)
		}
	}
	// An empty table is a mapping still.
	if got, _ := encodeRoutes(nil); !bytes.HasSuffix(got, []byte("\nroutes: {}\n")) {
		t.Errorf("empty table written as\n%s", got)
	}
}

// Whatever a value holds, it reads back byte for byte.
func TestAppendYAMLQuoted(t *testing.T) {
	for _, s := range []string{"", "plain", `q"uote`, `back\slash`, "tab\tnl\ncr\r", "\x00\x1f\x7f",
		"é ü 日本", "line\u2028para\u2029nel\u0085", "\ufeffbom", "emoji 😀", "\U000e0001 tag", "#: - ? & * ! | > ' % @ `"} {
		buf, err := appendYAMLQuoted([]byte("v: "), s)
		if err != nil {
			t.Fatalf("%q: %v", s, err)
		}
		var m map[string]string
		if err := yaml.Unmarshal(buf, &m); err != nil {
			t.Fatalf("%q written as %s: %v", s, buf, err)
		}
		if m["v"] != s {
			t.Errorf("%q written as %s reads back as %q", s, buf, m["v"])
		}
	}
	if _, err := appendYAMLQuoted(nil, "bad \xff"); err == nil {
		t.Error("invalid UTF-8 was written")
	}
}

// A rewrite of the routes file costs a few allocations per route: every
// admin change rewrites the whole table, and through yaml.Node and the
// yaml encoder 100k routes took 9 s and 3.5 GB.
func TestEncodeRoutesAllocations(t *testing.T) {
	const n = 1000
	routes := make([]*Route, 0, n)
	for i := range n {
		r, err := ParseRouteStrict(fmt.Sprintf("sbx-%06d", i), map[string]string{
			FieldHostIP: "10.0.0.1", FieldSandboxIP: "192.168.1.2", FieldCreatedAt: strconv.Itoa(1764460000000000000 + i),
			FieldAllowPublicTraffic: "false", FieldTrafficAccessToken: testToken, "50005": "50005", "3000": "31000",
		})
		if err != nil {
			t.Fatal(err)
		}
		routes = append(routes, r)
	}
	allocs := testing.AllocsPerRun(3, func() {
		if _, err := encodeRoutes(routes); err != nil {
			t.Fatal(err)
		}
	})
	// Route.Fields' map and its value strings, 9 for these routes; the
	// yaml encoder made 52.
	if perRoute := allocs / n; perRoute > 12 {
		t.Errorf("%.1f allocations per route, want at most 12", perRoute)
	}
}

// encodeRoutesWithNodes is how routes.yaml was written before, through the
// yaml encoder: the reference the file's text is compared with.
func encodeRoutesWithNodes(t testing.TB, routes []*Route) []byte {
	t.Helper()
	str := func(s string, style yaml.Style) *yaml.Node {
		return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: s, Style: style}
	}
	order := []string{FieldHostIP, FieldSandboxIP, FieldCreatedAt, FieldAllowPublicTraffic, FieldTrafficAccessToken, FieldMaskRequestHost}
	table := &yaml.Node{Kind: yaml.MappingNode}
	for _, r := range routes {
		fields := r.Fields()
		m := &yaml.Node{Kind: yaml.MappingNode}
		for _, name := range order {
			if v, ok := fields[name]; ok {
				m.Content = append(m.Content, str(name, 0), str(v, yaml.DoubleQuotedStyle))
			}
		}
		var ports []int
		for c := range r.Ports {
			ports = append(ports, int(c))
		}
		slices.Sort(ports)
		for _, c := range ports {
			k := strconv.Itoa(c)
			m.Content = append(m.Content, str(k, yaml.DoubleQuotedStyle), str(fields[k], yaml.DoubleQuotedStyle))
		}
		table.Content = append(table.Content, str(r.ID, 0), m)
	}
	root := &yaml.Node{Kind: yaml.MappingNode, HeadComment: routesHeader,
		Content: []*yaml.Node{str("routes", 0), table}}
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(root); err != nil {
		t.Fatal(err)
	}
	enc.Close()
	return buf.Bytes()
}
