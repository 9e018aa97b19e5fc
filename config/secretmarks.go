package config

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
	"unicode/utf8"

	"go.yaml.in/yaml/v3"
)

// A secret is often generated, and may start with a character YAML
// gives a meaning to when it starts a plain value: '*' an alias, '!' a
// tag, '&' an anchor. Written unquoted, the secret is then not the value:
// `password: *Xy9…` was refused with "unknown anchor 'Xy9…' referenced",
// the rest of the password quoted into the terminal, CI log or journal;
// `password: !Xy9…` and `password: &Xy9…` read as an empty password (the
// proxy sent none, and Redis answered NOAUTH), and `password: !Xy9 rest`
// as "rest". checkSecretMarks and hideDecoderQuote refuse these naming
// the line and the key, never the value.

// checkSecretMarks refuses a secret's value written with an explicit
// YAML tag other than !!str, or an anchor and nothing else: neither is
// what the operator meant the secret to be.
func checkSecretMarks(data []byte) error {
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil || len(doc.Content) == 0 {
		return nil // the decoder reports a broken file
	}
	var err error
	walkSecretScalars(doc.Content[0], func(path []string, n *yaml.Node) {
		key := strings.Join(path, ".")
		switch {
		case err != nil:
		case n.Style&yaml.TaggedStyle != 0 && n.ShortTag() != "!!str":
			err = fmt.Errorf("line %d: %s: its value starts with a YAML tag (!…), which YAML takes off the value (what is read is the rest, or nothing): quote the value, as '!…' (not shown: a secret)", n.Line, key)
		case n.Anchor != "" && n.Value == "":
			err = fmt.Errorf("line %d: %s: its value is a YAML anchor (&…) and nothing after it, which YAML reads as no value: quote the value, as '&…' (not shown: a secret)", n.Line, key)
		}
	})
	return err
}

// walkSecretScalars calls fn with each scalar a secret key takes and the
// key's path, following aliases and merge keys (the scalar is the one the
// anchor names, where the value is written). A budget bounds the walk of
// a document whose aliases multiply (the decoder refuses it anyway).
func walkSecretScalars(root *yaml.Node, fn func(path []string, n *yaml.Node)) {
	budget := 10000
	var walk func(n *yaml.Node, path []string, secret bool, depth int)
	walk = func(n *yaml.Node, path []string, secret bool, depth int) {
		if budget--; budget < 0 || depth > 32 {
			return
		}
		if n.Kind == yaml.AliasNode && n.Alias != nil {
			n = n.Alias
		}
		switch n.Kind {
		case yaml.ScalarNode:
			if secret {
				fn(path, n)
			}
		case yaml.SequenceNode:
			for _, item := range n.Content {
				walk(item, path, secret, depth+1)
			}
		case yaml.MappingNode:
			for i := 0; i+1 < len(n.Content); i += 2 {
				key, val := n.Content[i], n.Content[i+1]
				if key.Value == "<<" {
					walk(val, path, secret, depth+1) // its keys are n's
					continue
				}
				p := append(path[:len(path):len(path)], key.Value)
				walk(val, p, secret || isSecretPath(p), depth+1)
			}
		}
	}
	walk(root, nil, false, 0)
}

var (
	unknownAnchorRE = regexp.MustCompile(`^yaml: unknown anchor '(.*)' referenced$`)
	cannotDecodeRE  = regexp.MustCompile("^yaml: cannot decode (!![a-z]+) `(.*)` as a (!![a-z]+)$")
)

// hideDecoderQuote rewrites the two decoder errors that quote a piece of
// the file with no line to tie it to a key, when that piece is a secret's
// value: an alias that names no anchor (a value that starts with '*'),
// and a value an explicit tag (!!int) does not fit. The rewrite names the
// line and the key instead. Any other error is returned as it is.
func hideDecoderQuote(err error, data []byte) error {
	msg := err.Error()
	if m := unknownAnchorRE.FindStringSubmatch(msg); m != nil {
		if line, key := secretAlias(data, m[1]); line > 0 {
			return fmt.Errorf("yaml: line %d: %s: its value starts with '*', which makes it an alias in YAML, of an anchor (&…) defined nowhere before it: quote the value, as '*…' (not shown: a secret)", line, key)
		}
		return err
	}
	m := cannotDecodeRE.FindStringSubmatch(msg)
	if m == nil {
		return err
	}
	var doc yaml.Node
	if yaml.Unmarshal(data, &doc) != nil || len(doc.Content) == 0 {
		return err
	}
	hidden := err
	walkSecretScalars(doc.Content[0], func(path []string, n *yaml.Node) {
		if n.Value == m[2] && n.ShortTag() == m[3] {
			hidden = fmt.Errorf("yaml: line %d: %s: its value, tagged %s, is not one (not shown: a secret)", n.Line, strings.Join(path, "."), m[3])
		}
	})
	return hidden
}

// secretAlias finds the line where a secret's value is the alias *name
// (the decoder refused the file for it, so it cannot be parsed as it
// is): each line that holds the alias is parsed with it made a plain
// value, and the line and key are returned when a secret takes it;
// 0 and "" when none does.
func secretAlias(data []byte, name string) (line int, key string) {
	// YAML ends an alias's name at a blank, or at any of ,]}?:%@` (a
	// generated password's "*Ab3:x…" is the alias "Ab3"): every one of
	// them ends the match, or the alias was not found and the refusal
	// quoted the password up to that character.
	alias := regexp.MustCompile(`\*` + regexp.QuoteMeta(name) + "(?:[\\s,\\]}?:%@`]|$)")
	lines := strings.Split(string(data), "\n")
	for i, l := range lines {
		loc := alias.FindStringIndex(l)
		if loc == nil {
			continue
		}
		fixed := slices.Clone(lines)
		// The alias and the rest of its plain value ("*Ab3?x…" in a flow
		// mapping) become one plain value, "x": the line then parses.
		end := loc[0] + 1 + len(name)
		for end < len(l) && !strings.ContainsRune(" \t,]}", rune(l[end])) {
			end++
		}
		fixed[i] = l[:loc[0]] + "x" + l[end:]
		var doc yaml.Node
		if yaml.Unmarshal([]byte(strings.Join(fixed, "\n")), &doc) != nil || len(doc.Content) == 0 {
			continue
		}
		// The secret the alias is written for is the one at its column
		// (the decoder counts characters, not bytes): a flow mapping may
		// hold another secret on the line, before it. The first on the
		// line is kept for a column that does not match, so that the
		// refusal still hides the value.
		col := utf8.RuneCountInString(l[:loc[0]]) + 1
		var first, at string
		walkSecretScalars(doc.Content[0], func(path []string, n *yaml.Node) {
			if n.Line != i+1 {
				return
			}
			if first == "" {
				first = strings.Join(path, ".")
			}
			if at == "" && n.Column == col {
				at = strings.Join(path, ".")
			}
		})
		if at != "" {
			return i + 1, at
		}
		if first != "" {
			return i + 1, first
		}
	}
	return 0, ""
}
