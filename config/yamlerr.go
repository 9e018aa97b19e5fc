package config

import (
	"bytes"
	"errors"
	"fmt"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"go.yaml.in/yaml/v3"
)

// The decoder's type errors name a line and Go types ("line 1: cannot
// unmarshal !!int `30` into time.Duration", "line 2: field sizee not
// found in type config.Cache"): an operator wrote drain_timeout: 30 and
// must work out which key that is and what a time.Duration looks like.
// explainTypeError rewrites each such line to name the key and the kind
// of value it takes, as -h and the README do. A line it cannot tie to one
// key for sure (a value that came through an alias) is left as the
// decoder wrote it. Each line is named once: the decoder repeats one for
// every key that takes the value through an alias.
var (
	unknownFieldRE = regexp.MustCompile("^line ([0-9]+): field (.+) not found in type (.+)$")
	wrongTypeRE    = regexp.MustCompile("^line ([0-9]+): cannot unmarshal (!![a-z]+)(?: `(.*)`)? into (.+)$")
)

// explainTypeError returns err with its lines rewritten (see above), or
// err unchanged when it is not the decoder's type error.
func explainTypeError(err error, data []byte) error {
	var te *yaml.TypeError
	if !errors.As(err, &te) {
		return err
	}
	var doc yaml.Node
	if yaml.Unmarshal(data, &doc) != nil || len(doc.Content) == 0 {
		return err
	}
	var entries []yamlEntry
	collectEntries(doc.Content[0], nil, &entries, 0)
	var uses []typedUse
	collectTyped(doc.Content[0], nil, reflect.TypeOf(Config{}), false, nil, map[typedKey]bool{}, &uses, 0)
	secret := secretValueLines(doc.Content[0])
	var lines []string
	for _, msg := range te.Errors {
		// A value other keys take through an alias is reported once for
		// each, at the anchor's line: one mistake, named once (with the
		// keys that take it, see explainLine).
		if line := hideSecretKey(msg, secret, explainLine(msg, entries, uses)); !slices.Contains(lines, line) {
			lines = append(lines, line)
		}
	}
	if len(lines) == 1 {
		return errors.New(lines[0])
	}
	return errors.New(strings.Join(lines, "\n  "))
}

// yamlEntry is one key of the file with its value, and their path from
// the root (a list item has its list's path).
type yamlEntry struct {
	path []string
	key  *yaml.Node // nil for a list item
	val  *yaml.Node
}

// collectEntries lists the keys and list items under n in document
// order. Aliases are not followed: their target is listed where it is
// written, which is also the line the decoder names.
func collectEntries(n *yaml.Node, path []string, out *[]yamlEntry, depth int) {
	if depth > 32 {
		return
	}
	switch n.Kind {
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			key, val := n.Content[i], n.Content[i+1]
			p := append(append([]string(nil), path...), key.Value)
			*out = append(*out, yamlEntry{path: p, key: key, val: val})
			collectEntries(val, p, out, depth+1)
		}
	case yaml.SequenceNode:
		for _, item := range n.Content {
			*out = append(*out, yamlEntry{path: path, val: item})
			collectEntries(item, path, out, depth+1)
		}
	}
}

// flatSetting is the path of the setting a key names in another
// spelling: its path dotted (upstream.connect_timeout), its flag's
// (upstream-connect-timeout) or its variable's
// (CUBEPROXY_UPSTREAM_CONNECT_TIMEOUT), with the sections the key is
// written under; nil when it names none.
func flatSetting(path []string) []string {
	norm := func(s string) string {
		s = strings.ToLower(strings.TrimLeft(s, "-"))
		s = strings.TrimPrefix(s, strings.ToLower(EnvPrefix))
		return strings.NewReplacer("-", "_", ".", "_").Replace(s)
	}
	want := norm(strings.Join(path, "_"))
	for _, st := range collect(reflect.ValueOf(Default()).Elem()) {
		if norm(strings.Join(st.path, "_")) == want {
			return st.path
		}
	}
	return nil
}

// explainLine rewrites one line of a type error, or returns it as is.
func explainLine(msg string, entries []yamlEntry, uses []typedUse) string {
	if m := unknownFieldRE.FindStringSubmatch(msg); m != nil {
		line, _ := strconv.Atoi(m[1])
		for _, e := range entries {
			if e.key == nil || e.key.Line != line || e.key.Value != m[2] {
				continue
			}
			parent := configType(e.path[:len(e.path)-1])
			if parent != nil && parent.Kind() == reflect.Slice {
				parent = parent.Elem() // a key of a list item (tls.files)
			}
			if parent == nil || parent.String() != m[3] {
				continue // not where the decoder met it (an alias)
			}
			out := fmt.Sprintf("line %d: unknown key %s", line, strings.Join(e.path, "."))
			if flat := flatSetting(e.path); len(flat) > 1 {
				// upstream.connect_timeout: 3s, as the README names the
				// setting, or its flag's or variable's spelling: the
				// error repeated the setting's own name as unknown.
				out += fmt.Sprintf(" (the setting %s: the file nests it, %s: indented under %s:)", strings.Join(flat, "."), flat[len(flat)-1], strings.Join(flat[:len(flat)-1], ": "))
			} else if len(flat) == 1 {
				out += fmt.Sprintf(" (did you mean %s?)", flat[0])
			} else if near := nearestField(parent, m[2]); near != "" {
				out += fmt.Sprintf(" (did you mean %s?)", strings.Join(append(e.path[:len(e.path)-1:len(e.path)-1], near), "."))
			} else if other := settingsNamed(m[2]); len(other) > 0 {
				// Written under the wrong section (client: and upstream:
				// both have timeouts), or at the top.
				out += fmt.Sprintf(" (did you mean %s?)", strings.Join(other, " or "))
			}
			return out
		}
		return msg
	}
	if m := wrongTypeRE.FindStringSubmatch(msg); m != nil {
		line, _ := strconv.Atoi(m[1])
		tag, value, into := m[2], m[3], m[4]
		if into == reflect.TypeOf(Config{}).String() {
			return fmt.Sprintf("line %d: want settings (name: value lines) at the top of the file, got %s", line, describeValue(tag, value))
		}
		for _, e := range entries {
			if e.val.Line != line || e.val.ShortTag() != tag || !valueMatches(e.val, value) {
				continue
			}
			t := configType(e.path)
			if e.key == nil && t != nil && t.Kind() == reflect.Slice {
				t = t.Elem() // a list item
			}
			if t == nil || t.String() != into || len(e.path) == 0 {
				continue
			}
			name := strings.Join(e.path, ".")
			if e.key == nil {
				name = "an entry of " + name
			}
			got := describeValue(tag, value)
			if q := quotedValue(e.val, t); q != "" {
				got = q + " in quotes, a string: write it without them"
			}
			if isSecretPath(e.path) && value != "" {
				got = describeHidden(tag)
			}
			out := fmt.Sprintf("line %d: %s: want %s, got %s", line, name, describeType(t), got)
			if p := rangeProblem(t, e.val.Value); p != "" && e.val.Kind == yaml.ScalarNode && !isSecretPath(e.path) {
				out = fmt.Sprintf("line %d: %s: `%s` %s", line, name, e.val.Value, p)
			}
			if users := aliasUsers(e.val, into, entries); len(users) > 0 {
				out += " (taken through an alias by " + strings.Join(users, ", ") + ")"
			}
			if name == "routes" && tag == "!!map" {
				// configs/routes.yaml opens with "routes:" and a table:
				// named by --config (the two files sit side by side).
				out += " (this looks like a routes file: name it with --routes, and the proxy's settings with --config)"
			}
			return out
		}
		if out := explainThroughAlias(line, tag, value, into, uses); out != "" {
			return out
		}
	}
	return msg
}

// explainThroughAlias names the settings that take the value at line
// (tag, value) and decode it into the type named into, when no key
// written at that line does: the value reaches them only through an
// alias (its anchor under a key of another kind, or under no setting),
// or it is a map's value (tls.acme.dns.options). "" when none does.
func explainThroughAlias(line int, tag, value, into string, uses []typedUse) string {
	var direct string
	var users []string
	var t reflect.Type
	secret := false
	for _, u := range uses {
		if u.val.Line != line || u.val.ShortTag() != tag || !valueMatches(u.val, value) || u.t.String() != into || len(u.path) == 0 {
			continue
		}
		t = u.t
		secret = secret || isSecretPath(u.path)
		name := strings.Join(u.path, ".")
		if u.item {
			name = "an entry of " + name
		}
		if u.alias == nil {
			direct = name
			continue
		}
		if user := fmt.Sprintf("%s at line %d", name, u.alias.Line); !slices.Contains(users, user) {
			users = append(users, user)
		}
	}
	if t == nil {
		return ""
	}
	got := describeValue(tag, value)
	if secret && value != "" {
		got = describeHidden(tag)
	}
	out := fmt.Sprintf("line %d: want %s, got %s", line, describeType(t), got)
	if direct != "" {
		out = fmt.Sprintf("line %d: %s: want %s, got %s", line, direct, describeType(t), got)
	}
	if len(users) > 0 {
		out += " (taken through an alias by " + strings.Join(users, ", ") + ")"
	}
	return out
}

// typedUse is a value as the decoder meets it: the setting (or list
// entry, or map value) that decodes it, into which type, and the alias
// it was reached through.
type typedUse struct {
	path  []string
	item  bool         // an entry of the list at path
	t     reflect.Type // what the value decodes into
	val   *yaml.Node   // the value, aliases resolved
	alias *yaml.Node   // the first alias followed to reach it; nil when written in place
}

// typedKey is a value decoded into a type: each is walked once, so that
// aliases of aliases (a "billion laughs" file) cost no more than the
// file's size.
type typedKey struct {
	n *yaml.Node
	t reflect.Type
}

// collectTyped lists, in uses, the values under n as the decoder decodes
// them into t, following aliases and merge keys; keys that name no
// setting are skipped (the decoder reports them on their own).
func collectTyped(n *yaml.Node, path []string, t reflect.Type, item bool, alias *yaml.Node, seen map[typedKey]bool, uses *[]typedUse, depth int) {
	if depth > 64 || n == nil {
		return
	}
	if n.Kind == yaml.AliasNode {
		if alias == nil {
			alias = n
		}
		collectTyped(n.Alias, path, t, item, alias, seen, uses, depth+1)
		return
	}
	*uses = append(*uses, typedUse{path: path, item: item, t: t, val: n, alias: alias})
	if seen[typedKey{n, t}] {
		return
	}
	seen[typedKey{n, t}] = true
	switch {
	case n.Kind == yaml.MappingNode && t.Kind() == reflect.Struct:
		for i := 0; i+1 < len(n.Content); i += 2 {
			key, val := n.Content[i], n.Content[i+1]
			if key.ShortTag() == "!!merge" {
				collectTyped(val, path, t, item, alias, seen, uses, depth+1)
				continue
			}
			if f, ok := fieldByYAML(t, key.Value); ok {
				collectTyped(val, append(path[:len(path):len(path)], key.Value), f.Type, false, alias, seen, uses, depth+1)
			}
		}
	case n.Kind == yaml.MappingNode && t.Kind() == reflect.Map:
		for i := 0; i+1 < len(n.Content); i += 2 {
			collectTyped(n.Content[i+1], append(path[:len(path):len(path)], n.Content[i].Value), t.Elem(), false, alias, seen, uses, depth+1)
		}
	case n.Kind == yaml.SequenceNode && t.Kind() == reflect.Slice:
		for _, e := range n.Content {
			collectTyped(e, path, t.Elem(), true, alias, seen, uses, depth+1)
		}
	case n.Kind == yaml.SequenceNode && t.Kind() == reflect.Struct:
		// A merge key's list of sections.
		for _, e := range n.Content {
			if e.Kind == yaml.MappingNode || e.Kind == yaml.AliasNode {
				collectTyped(e, path, t, item, alias, seen, uses, depth+1)
			}
		}
	}
}

// aliasUsers names, with their lines, the keys that take val through an
// alias and decode it into the type named into: the decoder reported the
// same error, at val's line, for each of them.
func aliasUsers(val *yaml.Node, into string, entries []yamlEntry) []string {
	var out []string
	for _, u := range entries {
		if u.val.Kind != yaml.AliasNode || u.val.Alias != val || len(u.path) == 0 {
			continue
		}
		t := configType(u.path)
		if u.key == nil && t != nil && t.Kind() == reflect.Slice {
			t = t.Elem()
		}
		if t == nil || t.String() != into {
			continue
		}
		name := strings.Join(u.path, ".")
		if u.key == nil {
			name = "an entry of " + name
		}
		out = append(out, fmt.Sprintf("%s at line %d", name, u.val.Line))
	}
	return out
}

// valueMatches reports whether n's value is the one the decoder quoted:
// all of it, or its first 7 bytes and "..." when it was longer than 10.
func valueMatches(n *yaml.Node, quoted string) bool {
	if n.Kind != yaml.ScalarNode {
		return quoted == ""
	}
	if p, ok := strings.CutSuffix(quoted, "..."); ok && len(n.Value) > 10 {
		return strings.HasPrefix(n.Value, p)
	}
	return n.Value == quoted
}

// settingsNamed lists, in declaration order, the paths of the settings
// whose own key (the last part of the path) is key, in any case.
func settingsNamed(key string) []string {
	var out []string
	for _, st := range collect(reflect.ValueOf(Default()).Elem()) {
		if strings.EqualFold(st.path[len(st.path)-1], key) {
			out = append(out, strings.Join(st.path, "."))
		}
	}
	return out
}

// configType is the Go type the key at path decodes into, nil when no
// such key exists. A list of sections (tls.files) is walked through its
// element type.
func configType(path []string) reflect.Type {
	t := reflect.TypeOf(Config{})
	for _, name := range path {
		if t.Kind() == reflect.Slice && t.Elem().Kind() == reflect.Struct {
			t = t.Elem()
		}
		if t.Kind() != reflect.Struct {
			return nil
		}
		f, ok := fieldByYAML(t, name)
		if !ok {
			return nil
		}
		t = f.Type
	}
	return t
}

// fieldByYAML finds the field of struct type t named name in YAML.
func fieldByYAML(t reflect.Type, name string) (reflect.StructField, bool) {
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		if n, _, _ := strings.Cut(f.Tag.Get("yaml"), ","); n == name && n != "-" {
			return f, true
		}
	}
	return reflect.StructField{}, false
}

// nearestField is the key of struct type t within a few typos of name,
// "" when none is that close.
func nearestField(t reflect.Type, name string) string {
	best, bestDist := "", max(2, len(name)/4)+1
	for i := 0; i < t.NumField(); i++ {
		n, _, _ := strings.Cut(t.Field(i).Tag.Get("yaml"), ",")
		if n == "" || n == "-" {
			continue
		}
		if d := editDistance(strings.ToLower(name), n); d < bestDist { // keys are lower case
			best, bestDist = n, d
		}
	}
	return best
}

// describeType names the value a key of type t takes, as -h names kinds.
func describeType(t reflect.Type) string {
	switch {
	case t == durationType:
		return "a duration with its unit (30s, 5m, 2h)"
	case t.Kind() == reflect.Bool:
		return "true or false (yes/no and on/off work too)"
	case t.Kind() == reflect.Int, t.Kind() == reflect.Int64:
		return "a whole number"
	case t.Kind() == reflect.Float64:
		return "a number"
	case t.Kind() == reflect.String:
		return "a string"
	case t.Kind() == reflect.Map:
		return "a map of name: value lines"
	case t.Kind() == reflect.Struct:
		return "a section of keys (name: value lines under it)"
	case t.Kind() == reflect.Slice && t.Elem().Kind() == reflect.Struct:
		return "a list of sections (- name: value)"
	case t.Kind() == reflect.Slice && t.Elem().Kind() == reflect.String:
		return "a list of strings ([a, b], or one - line each)"
	case t.Kind() == reflect.Slice:
		return "a list of whole numbers ([80, 443], or one - line each)"
	}
	return t.String()
}

// quotedValue is n as written, quotes included, when n is a quoted string
// that t would take without its quotes: a template that quotes every value
// (reuse_port: "{{ .Values.reusePort }}") makes a string of "true", and
// "want true or false, got `true`" left the quotes to be guessed.
func quotedValue(n *yaml.Node, t reflect.Type) string {
	var q string
	switch n.Style {
	case yaml.DoubleQuotedStyle:
		q = `"`
	case yaml.SingleQuotedStyle:
		q = "'"
	default:
		return ""
	}
	if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!str" || t == nil || strings.ContainsAny(n.Value, "\n'\"") {
		return ""
	}
	bare := yaml.Node{Kind: yaml.ScalarNode, Value: n.Value}
	if err := bare.Decode(reflect.New(t).Interface()); err != nil || bare.ShortTag() == "!!str" {
		return "" // not a word or number the key takes bare either
	}
	return q + n.Value + q
}

// describeValue names what the file has where a key's value was expected.
func describeValue(tag, value string) string {
	switch tag {
	case "!!seq":
		return "a list"
	case "!!map":
		return "a section of keys"
	case "!!null":
		return "no value"
	}
	return "`" + value + "`"
}

// describeHidden names the kind of a scalar whose value is not shown.
func describeHidden(tag string) string {
	kind := "a value"
	switch tag {
	case "!!str":
		kind = "a string"
	case "!!int", "!!float":
		kind = "a number"
	case "!!bool":
		kind = "a boolean"
	}
	return kind + " (not shown: a secret)"
}

// secretKeys are the settings whose values are secrets: an error never
// quotes them (check prints them REDACTED). The DNS provider's options
// are all counted: some hold its credentials.
var secretKeys = []string{"admin_token", "auth.signing_keys", "redis.password", "redis.url", "redis.sentinel.password", "tls.acme.dns.options"}

// isSecretPath reports whether the key at path is a secret or inside one.
func isSecretPath(path []string) bool {
	p := strings.Join(path, ".")
	for _, k := range secretKeys {
		if p == k || strings.HasPrefix(p, k+".") {
			return true
		}
	}
	return false
}

// secretValueLines lists the lines of the scalars a secret key takes,
// following aliases and merge keys: the decoder names the line of an
// alias's anchor, where the value is written.
func secretValueLines(root *yaml.Node) map[int]bool {
	lines := map[int]bool{}
	walkSecretScalars(root, func(_ []string, n *yaml.Node) { lines[n.Line] = true })
	return lines
}

// quotedValueRE finds the value a type error quotes.
var quotedValueRE = regexp.MustCompile("`.*`")

// hideSecretValue removes the value quoted by an error line about a line
// of the file where a secret is written (the decoder quotes up to 10
// bytes of it).
func hideSecretValue(msg string, secret map[int]bool) string {
	m := lineRE.FindStringSubmatch(msg)
	if m == nil {
		return msg
	}
	if n, _ := strconv.Atoi(m[1]); !secret[n] {
		return msg
	}
	return quotedValueRE.ReplaceAllLiteralString(msg, "(not shown: a secret)")
}

// secretKeyErrorRE finds the decoder's errors that quote a key: one that
// names no setting, and one written twice in a mapping.
var secretKeyErrorRE = regexp.MustCompile(`^line ([0-9]+): (?:field .+ not found in type .+|mapping key .+ already defined at line [0-9]+)$`)

// hideSecretKey returns explained, the decoder's error line msg as
// explainLine rewrote it, with the secret hidden (hideSecretValue), and
// without the key it names when that key is on a line that holds a
// secret's value: it may be the rest of the secret. In a flow mapping a
// ',' ends a value, so {addr: r, password: abc,S3CRET} reads S3CRET as a
// key, which the error quoted ("unknown key redis.S3CRET").
func hideSecretKey(msg string, secret map[int]bool, explained string) string {
	m := secretKeyErrorRE.FindStringSubmatch(msg)
	if m == nil {
		return hideSecretValue(explained, secret)
	}
	if n, _ := strconv.Atoi(m[1]); !secret[n] {
		return explained
	}
	what := "names no setting"
	if strings.Contains(msg, "mapping key ") {
		what = "is written twice"
	}
	return fmt.Sprintf("line %s: a key that %s, on a line that holds a secret's value (not shown: it may be part of the secret; in a flow mapping, {...}, a ',' ends a value: quote the secret)", m[1], what)
}

// lineRE finds the line an error line names.
var lineRE = regexp.MustCompile("^line ([0-9]+): ")

// checkWholeNumbers refuses a float (1.5, 1e5, 10.0), or a number with
// a leading zero (010, read as octal 8), written for an integer setting. The decoder truncates one into the field: a
// max_request_body of 1.5 was one byte, and a cache.size of 0.5 was 0,
// the default, without a word; the environment and flags refuse them.
// A value given through an alias is named where the alias is written.
func checkWholeNumbers(data []byte) error {
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil || len(doc.Content) == 0 {
		return nil // the decoder reports a broken file
	}
	var entries []yamlEntry
	collectEntries(doc.Content[0], nil, &entries, 0)
	for _, e := range entries {
		val := e.val
		if val.Kind == yaml.AliasNode && val.Alias != nil {
			val = val.Alias
		}
		// Tagged !!int, quoted or not, the decoder reads it as octal
		// too; untagged, a quoted one is a string.
		octal := val.ShortTag() == "!!int" && leadingZeroRE.MatchString(val.Value)
		if val.Kind != yaml.ScalarNode || val.ShortTag() != "!!float" && !octal {
			continue
		}
		t := configType(e.path)
		if e.key == nil && t != nil && t.Kind() == reflect.Slice {
			t = t.Elem() // a list item
		}
		if t == nil || t == durationType || (t.Kind() != reflect.Int && t.Kind() != reflect.Int64) {
			continue
		}
		name, line := strings.Join(e.path, "."), e.val.Line
		if e.key == nil {
			name = "an entry of " + name
		}
		if octal {
			// The decoder reads 010 as octal 8, the environment and
			// flags as 10: one setting, two values.
			n, _ := strconv.ParseInt(strings.ReplaceAll(val.Value, "_", ""), 0, 64)
			return fmt.Errorf("line %d: %s: `%s` has a leading zero, which YAML reads as octal (%d); write the number without it, or 0o for octal", line, name, val.Value, n)
		}
		return fmt.Errorf("line %d: %s: want %s, got `%s`", line, name, describeType(t), val.Value)
	}
	return nil
}

// leadingZeroRE matches an integer written with a leading zero (010,
// -007), which the decoder reads as octal.
var leadingZeroRE = regexp.MustCompile(`^[-+]?0[0-9_]+$`)

// readerProblems are the decoder's errors about the bytes themselves,
// which it reports with no line.
var readerProblems = []string{
	"control characters are not allowed", "invalid leading UTF-8 octet", "incomplete UTF-8 octet sequence",
	"invalid trailing UTF-8 octet", "invalid Unicode character",
}

// decoderProblems are the decoder's errors about the document as a whole
// (aliases, anchors), which no line places.
var decoderProblems = []string{
	"attempted to go past", "unknown anchor", "document contains excessive aliasing", "cannot decode",
	"anchor '", "!!binary", "invalid array", "invalid map key", "map merge requires", "runtime error", "input error",
}

// locateSyntaxError adds its line to a syntax error the decoder reported
// without one (placeSyntaxError), and says so when the character the
// scanner could not start a token with is a tab, which looks like the
// spaces around it: YAML indents with spaces only.
func locateSyntaxError(err error, data []byte) error {
	err = placeSyntaxError(err, data)
	var line int
	if _, scanErr := fmt.Sscanf(err.Error(), "yaml: line %d: found character that cannot start any token", &line); scanErr != nil || line < 1 {
		return err
	}
	lines := strings.Split(string(data), "\n")
	if line > len(lines) {
		return err
	}
	// @ and ` cannot start a token either: a tab elsewhere on their line
	// is not blamed for them.
	l := lines[line-1]
	indent := l[:len(l)-len(strings.TrimLeft(l, " \t"))]
	if !strings.Contains(indent, "\t") && (!strings.Contains(l, "\t") || strings.ContainsAny(l, "@`")) {
		return err
	}
	return fmt.Errorf("%w (a tab: YAML indents with spaces only)", err)
}

// placeSyntaxError adds its line to a syntax error the decoder reported
// without one: a problem on the first line (the decoder names line 1 as
// none), or a byte the YAML reader refuses (a control character, a byte
// that is no UTF-8), which it reports with no position at all; the line
// and the byte are found in data. A UTF-16 file (its bytes are not the
// characters) and any other error are returned as they are.
func placeSyntaxError(err error, data []byte) error {
	msg, ok := strings.CutPrefix(err.Error(), "yaml: ")
	if !ok || strings.HasPrefix(msg, "line ") || bytes.HasPrefix(data, []byte{0xff, 0xfe}) || bytes.HasPrefix(data, []byte{0xfe, 0xff}) {
		return err
	}
	var te *yaml.TypeError
	if errors.As(err, &te) || slices.ContainsFunc(decoderProblems, func(p string) bool { return strings.HasPrefix(msg, p) }) {
		return err // not about the text at a place
	}
	if !slices.ContainsFunc(readerProblems, func(p string) bool { return strings.HasPrefix(msg, p) }) {
		// The scanner's and the parser's, whose line the decoder leaves
		// out when it is the first.
		return fmt.Errorf("yaml: line 1: %s", msg)
	}
	for i := 0; i < len(data); {
		r, size := utf8.DecodeRune(data[i:])
		if r == utf8.RuneError && size == 1 || !yamlPrintable(r) {
			line := 1 + bytes.Count(data[:i], []byte{'\n'})
			return fmt.Errorf("yaml: line %d: %s (byte 0x%02x)", line, msg, data[i])
		}
		i += size
	}
	return err
}

// yamlPrintable reports whether YAML allows r in a file (YAML 1.2's
// c-printable).
func yamlPrintable(r rune) bool {
	switch {
	case r == '\t' || r == '\n' || r == '\r' || r == 0x85:
		return true
	case r < 0x20 || r >= 0x7f && r < 0xa0:
		return false
	case r >= 0xd800 && r <= 0xdfff || r == 0xfffe || r == 0xffff:
		return false
	}
	return r <= 0x10ffff
}
