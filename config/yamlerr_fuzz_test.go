package config

import (
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// FuzzExplainTypeError feeds arbitrary text to the config file loader and
// holds explainTypeError's rewriting of the decoder's type errors to what
// it promises: loading never panics, and a line it rewrote keeps the
// decoder's line number, which is a line of the input, and names a key
// (or a list) written at that line of the input under that path, never one
// the input does not have (the "did you mean" hint aside, which by design
// names a key the input lacks); a line left as the decoder wrote it may
// have its quoted value hidden (a secret's). The oracle walks the
// document itself rather than trusting collectEntries.
func FuzzExplainTypeError(f *testing.F) {
	for _, name := range []string{"cubeproxy.yaml", "cubeproxy.tls.yaml"} {
		if data, err := os.ReadFile(filepath.Join("..", "configs", name)); err == nil {
			f.Add(data)
		}
	}
	for _, s := range []string{
		"http_adr: ':1'\n",
		"cache:\n  sizee: 5\n  ttl_min: 5\nreuse_port: 1\n",
		"tls:\n  files:\n    - cert_file: a\n      keyfile: b\n",
		"auth:\n  exempt_ports:\n    - http\n",
		"cache: &c\n  size: 5\nupstream:\n  <<: *c\n",
		"drain_timeout: &d 30\nupstream:\n  connect_timeout: *d\n",
		"- http_addr: ':1'\n",
		"upstream:\n  connect_timeout: 5\ndrain_timeout: 5\n",
		"cache:\r  size: lots-and-lots\r",
		"\"cache\": {\"size\": x}\n",
		"domains: cube.app\nhttp_addr: [a, b]\ntls:\n  acme:\n    dns:\n      options: [a]\n",
	} {
		f.Add([]byte(s))
	}
	lineRE := regexp.MustCompile(`^line ([0-9]+): `)
	f.Fuzz(func(t *testing.T, data []byte) {
		// Whatever the file holds, the loader answers, never panics.
		_, _ = loadYAML(t, t.TempDir(), data)

		dec := yaml.NewDecoder(strings.NewReader(string(data)))
		dec.KnownFields(true)
		var te *yaml.TypeError
		if !errors.As(dec.Decode(Default()), &te) {
			return
		}
		var doc yaml.Node
		if yaml.Unmarshal(data, &doc) != nil || len(doc.Content) == 0 {
			return // explainTypeError leaves the error as it is
		}
		keys, vals := map[string]bool{}, map[string]bool{}
		walkKeys(doc.Content[0], "", keys, vals, 0)
		lines := countLines(data)
		for _, msg := range te.Errors {
			got := explainTypeError(&yaml.TypeError{Errors: []string{msg}}, data).Error()
			if got == msg || got == quotedValueRE.ReplaceAllLiteralString(msg, "(not shown: a secret)") {
				continue // the decoder's words, a secret's value hidden
			}
			m, gm := lineRE.FindStringSubmatch(msg), lineRE.FindStringSubmatch(got)
			if m == nil || gm == nil || m[1] != gm[1] {
				t.Fatalf("rewrote %q\nas %q: not the decoder's line", msg, got)
			}
			n, _ := strconv.Atoi(gm[1])
			if n < 1 || n > lines {
				t.Fatalf("rewrote %q\nas %q: line %d, the input has %d lines", msg, got, n, lines)
			}
			rest := strings.TrimPrefix(got, gm[0])
			if strings.HasPrefix(rest, "want settings (name: value lines) at the top of the file, got ") {
				continue
			}
			if !namesKeyAt(rest, n, keys, vals) {
				t.Fatalf("rewrote %q\nas %q: names no key the input has at line %d\n%q", msg, got, n, data)
			}
		}
	})
}

// namesKeyAt reports whether rest (a rewritten line after "line n: ")
// names a key the input writes at line n: an unknown key by its key's
// line, a value of the wrong kind by its value's line.
func namesKeyAt(rest string, n int, keys, vals map[string]bool) bool {
	at := ":" + strconv.Itoa(n)
	if p, ok := strings.CutPrefix(rest, "unknown key "); ok {
		if i := strings.LastIndex(p, " (did you mean "); i >= 0 && strings.HasSuffix(p, "?)") {
			if keys[p[:i]+at] {
				return true
			}
		}
		// The hint that a setting written as its path is to be nested.
		if i := strings.Index(p, " (the setting "); i >= 0 && strings.HasSuffix(p, ":)") {
			if keys[p[:i]+at] {
				return true
			}
		}
		return keys[p+at]
	}
	p, ok := strings.CutPrefix(rest, "an entry of ")
	for path := range vals {
		name, line, _ := strings.Cut(path, "\x00")
		if ":"+line != at {
			continue
		}
		key, item := strings.CutSuffix(name, "\x01")
		if item == ok && strings.HasPrefix(p, key+": want ") {
			return true
		}
	}
	return false
}

// walkKeys records, for every key written in the document under n, its
// dotted path and line in keys ("a.b:3"), and the path and line of every
// value in vals ("a.b\x003"; a list item's path is its list's, marked
// with \x01 so that "an entry of" can be told apart). Aliases are not
// followed: a key met through one is not written where the alias is.
func walkKeys(n *yaml.Node, path string, keys, vals map[string]bool, depth int) {
	if depth > 40 {
		return
	}
	join := func(k string) string {
		if path == "" {
			return k
		}
		return path + "." + k
	}
	switch n.Kind {
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			p := join(k.Value)
			keys[p+":"+strconv.Itoa(k.Line)] = true
			vals[p+"\x00"+strconv.Itoa(v.Line)] = true
			walkKeys(v, p, keys, vals, depth+1)
		}
	case yaml.SequenceNode:
		for _, item := range n.Content {
			vals[path+"\x01\x00"+strconv.Itoa(item.Line)] = true
			walkKeys(item, path, keys, vals, depth+1)
		}
	}
}

// countLines counts the input's lines as YAML breaks them (LF, CR, CRLF,
// NEL, LS, PS), at least one.
func countLines(data []byte) int {
	s := strings.ReplaceAll(string(data), "\r\n", "\n")
	n := 1
	for _, r := range s {
		switch r {
		case '\n', '\r', '\u0085', '\u2028', '\u2029':
			n++
		}
	}
	return n
}
