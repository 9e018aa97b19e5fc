package config

import (
	"os"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"unicode"

	"go.yaml.in/yaml/v3"
)

// exampleConfigs are the files the README sends operators to for the
// meaning of each key.
var exampleConfigs = []string{
	"../configs/cubeproxy.yaml",
	"../configs/cubeproxy.redis.yaml",
	"../configs/cubeproxy.sentinel.yaml",
	"../configs/cubeproxy.tls.yaml",
}

// onlyInHelp are the keys no example config shows: the README names them
// as described only by `serve -h` (or, for the tls pair, by the TLS
// example's comments).
var onlyInHelp = []string{
	"redis.url", "redis.username", "redis.tls", "redis.ca_file", "redis.cert_file", "redis.key_file", "redis.insecure_skip_verify",
	"redis.cluster.addrs", "tls.cert_file", "tls.key_file",
}

// Every key Config accepts is shown in an example config, or is one of
// the few the README says only `serve -h` describes: a key added without
// docs fails here rather than reaching operators undocumented.
func TestEveryKeyDocumented(t *testing.T) {
	keys := map[string]bool{}
	yamlKeys(reflect.TypeOf(Config{}), "", keys, false)
	shown := map[string]bool{}
	for _, f := range exampleConfigs {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		bodies := []string{string(raw)}
		if f == tlsExample {
			bodies = append(bodies, acmeVariant(t, string(raw))) // the commented ACME block
		}
		for _, b := range bodies {
			var n yaml.Node
			if err := yaml.Unmarshal([]byte(b), &n); err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			nodeKeys(&n, "", shown)
		}
	}
	readme := readREADME(t)
	help := map[string]bool{}
	for _, k := range onlyInHelp {
		help[k] = true
		if !namedIn(readme, k) {
			t.Errorf("%s: shown in no example config, and the README does not name it", k)
		}
		if !keys[k] {
			t.Errorf("%s: listed as documented by serve -h, but no such key", k)
		}
	}
	for k := range keys {
		if !shown[k] && !help[k] {
			t.Errorf("%s: in no example config (%s) and not in the README's serve -h list", k, strings.Join(exampleConfigs, ", "))
		}
	}
	for _, s := range collect(reflect.ValueOf(Default()).Elem()) {
		if s.usage == "" {
			t.Errorf("%s: no usage tag, so serve -h says nothing about it", strings.Join(s.path, "."))
		}
	}
}

// Every setting the README, bench/README.md, the Dockerfile and the example configs name
// (a dotted key, a CUBEPROXY_ variable, a flag) exists under that name: a
// renamed key would otherwise leave the docs pointing at nothing, and an
// operator's setting ignored or refused.
func TestDocsNameRealSettings(t *testing.T) {
	keys := map[string]bool{}
	yamlKeys(reflect.TypeOf(Config{}), "", keys, true)
	sections := map[string]bool{}
	for k := range keys {
		if i := strings.Index(k, "."); i > 0 {
			sections[k[:i]] = true
		}
	}
	vars := map[string]bool{EnvPrefix + "CONFIG": true}
	flags := map[string]bool{"config": true}
	for _, s := range collect(reflect.ValueOf(Default()).Elem()) {
		vars[s.envName()] = true
		flags[s.flagName()] = true
	}
	// Names the docs use that are not serve's settings on purpose.
	for _, v := range []string{
		"CUBEPROXY_ROUTE", "CUBEPROXY_PORT_", "CUBEPROXY_SERVICE_HOST", "CUBEPROXY_REDIS_MASTER_SERVICE_HOST", // the README's examples of unknown variables
		"CUBEPROXY_TLS_FILES", // and of one spelling a setting only the file takes
	} {
		vars[v] = true
	}
	// The server span's attribute (OpenTelemetry's semantic conventions).
	keys["client.address"] = true

	for _, f := range []string{"sandbox", "port", "ttl", "ulimit", "from"} { // token sign's flags; docker's
		flags[f] = true
	}
	for _, f := range []string{"live", "timeout"} { // cubeproxy health's
		flags[f] = true
	}
	for _, f := range []string{"interval", "start-period", "retries"} { // the Dockerfile's HEALTHCHECK options
		flags[f] = true
	}
	for _, f := range []string{"pid", "nofile"} { // prlimit's, in the README's descriptor-limit recovery
		flags[f] = true
	}
	for _, f := range []string{"quick", "out", "keep", "only"} { // bench/compare.sh's own flags
		flags[f] = true
	}
	for _, f := range []string{"resolve", "http2", "http2-prior-knowledge", "compressed", "path-as-is", "cacert", "http1"} { // curl's, in bench/README's interop lab, README's No HTTP/2 and TLS (--http1.0)
		flags[f] = true
	}

	docs := map[string]string{"../README.md": readREADME(t)}
	// bench/README.md tells how the benchmark runs the proxy: a variable
	// named there that serve does not read would make the comparison's
	// settings a guess.
	for _, f := range append([]string{"../Dockerfile", "../bench/README.md"}, exampleConfigs...) {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		docs[f] = string(raw)
	}
	dotted := regexp.MustCompile("`([a-z_]+(?:\\.[a-z_]+)+)`")
	envVar := regexp.MustCompile(`\bCUBEPROXY_[A-Z0-9_]+`)
	flag := regexp.MustCompile(`(?:^|[\s(` + "`" + `])--([a-z][a-z0-9-]*)`)
	for f, text := range docs {
		for _, m := range dotted.FindAllStringSubmatch(text, -1) {
			k := m[1]
			if sections[k[:strings.Index(k, ".")]] && !keys[k] {
				t.Errorf("%s names `%s`: no such key", f, k)
			}
		}
		for _, v := range envVar.FindAllString(text, -1) {
			if !vars[v] {
				t.Errorf("%s names %s: no such variable", f, v)
			}
		}
		for _, m := range flag.FindAllStringSubmatch(text, -1) {
			if !flags[m[1]] {
				t.Errorf("%s names --%s: no such flag", f, m[1])
			}
		}
	}
}

// namedIn reports whether text names key in backquotes, whole or by a
// tail of its path (`cluster.addrs` for redis.cluster.addrs, in a list
// of redis keys).
func namedIn(text, key string) bool {
	for {
		if strings.Contains(text, "`"+key+"`") {
			return true
		}
		i := strings.Index(key, ".")
		if i < 0 {
			return false
		}
		key = key[i+1:]
	}
}

func readREADME(t *testing.T) string {
	t.Helper()
	raw, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	return string(raw)
}

// yamlKeys adds the dotted YAML path of every leaf of t (a struct) to out,
// lists of structs (tls.files) walked into; with sections, the paths of
// the structs themselves too.
func yamlKeys(t reflect.Type, prefix string, out map[string]bool, sections bool) {
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if name == "" || name == "-" {
			continue
		}
		ft := f.Type
		if ft.Kind() == reflect.Slice && ft.Elem().Kind() == reflect.Struct {
			ft = ft.Elem()
		}
		if ft.Kind() == reflect.Struct {
			if sections {
				out[prefix+name] = true
			}
			yamlKeys(ft, prefix+name+".", out, sections)
			continue
		}
		out[prefix+name] = true
	}
}

// nodeKeys adds the dotted path of every mapping key under n to out; a
// map's entries (tls.acme.dns.options.server) are added too and ignored.
func nodeKeys(n *yaml.Node, prefix string, out map[string]bool) {
	switch n.Kind {
	case yaml.DocumentNode, yaml.SequenceNode:
		for _, c := range n.Content {
			nodeKeys(c, prefix, out)
		}
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			p := prefix + n.Content[i].Value
			out[p] = true
			nodeKeys(n.Content[i+1], p+".", out)
		}
	}
}

// Every section README points to in italics (see *Drain*, *Sizing*'s 66
// KiB, under *Traces*) is one it has: a heading, a bold lead (**Sizing.**)
// or a list item that starts with that name (- Drain (SIGTERM/SIGINT)). A
// lead renamed would leave the pointer sending readers nowhere.
func TestREADMESectionPointersResolve(t *testing.T) {
	text := readREADME(t)
	var leads []string
	for _, re := range []*regexp.Regexp{
		regexp.MustCompile(`(?m)^#+ (.+)$`),
		// One line's bold, which may hold a single asterisk (`X-Accel-*`):
		// [^*]+ paired such a lead's closing ** with the next lead's
		// opening one, and every lead after it went unseen.
		regexp.MustCompile(`\*\*([^\n]+?)\*\*`),
		regexp.MustCompile(`(?m)^\s*- \*?([A-Z][^*(:]*)`),
	} {
		for _, m := range re.FindAllStringSubmatch(text, -1) {
			leads = append(leads, strings.TrimSpace(m[1]))
		}
	}
	// An italic is a *…* with no asterisk on either side (not part of a
	// **bold**) and a capital first letter: README italicises only names.
	italic := regexp.MustCompile(`\*([A-Z][^*\n]{1,80})\*`)
	pointers := 0
	for _, loc := range italic.FindAllStringSubmatchIndex(text, -1) {
		if (loc[0] > 0 && text[loc[0]-1] == '*') || (loc[1] < len(text) && text[loc[1]] == '*') {
			continue
		}
		name := text[loc[2]:loc[3]]
		pointers++
		found := false
		for _, l := range leads {
			if strings.HasPrefix(l, name) {
				found = true
				break
			}
		}
		if !found {
			t.Errorf("README points to *%s*: no heading, bold lead or list item of that name", name)
		}
	}
	if pointers < 10 {
		t.Fatalf("README has %d section pointers: is the pattern still right?", pointers)
	}
}

// TestREADMEContentsMatchesHeadings: the README's Contents list names every
// `##` and `###` heading, in order, each linked by the anchor GitHub makes
// for it, so a section added, renamed or moved shows here rather than as a
// dead link in a 3,000-line file.
func TestREADMEContentsMatchesHeadings(t *testing.T) {
	readme := readREADME(t)
	_, rest, ok := strings.Cut(readme, "\n**Contents**\n\n")
	if !ok {
		t.Fatal("README has no **Contents** list")
	}
	listed, _, _ := strings.Cut(rest, "\n\n")
	var want []string
	for _, m := range regexp.MustCompile(`(?m)^(##|###) (.+)$`).FindAllStringSubmatch(readme, -1) {
		indent := strings.Repeat("  ", len(m[1])-2)
		want = append(want, indent+"- ["+m[2]+"](#"+headingAnchor(m[2])+")")
	}
	if got := strings.Split(listed, "\n"); !slices.Equal(got, want) {
		t.Errorf("README's Contents list is not its headings; want:\n%s", strings.Join(want, "\n"))
	}
}

// headingAnchor is GitHub's anchor for a heading: lower case, every
// character but letters, digits, '_', '-' and spaces dropped, spaces '-'.
func headingAnchor(title string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(title) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '_' || r == '-' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}
