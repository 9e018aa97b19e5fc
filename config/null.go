package config

import (
	"fmt"
	"reflect"
	"strings"

	"go.yaml.in/yaml/v3"
)

// checkNulls refuses a key written with no value (`http_addr:`, YAML
// null) whose built-in default is not empty. The decoder leaves such a
// key at its default, where the operator who wrote it blank most often
// meant it empty: `http_addr:` to turn plain HTTP off kept a plain-HTTP
// listener on :8081, without a word. Where the default is empty, or
// emptyIsDefault lists the key, both readings agree and the key is left
// alone. A list's entry with no value is refused too (nullEntry).
func checkNulls(data []byte) error {
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil || len(doc.Content) == 0 {
		return nil // the decoder reports a broken file
	}
	defaults := map[string]string{}
	for _, s := range collect(reflect.ValueOf(Default()).Elem()) {
		if name := strings.Join(s.path, "."); !s.v.IsZero() && !emptyIsDefault[name] {
			defaults[name] = s.show()
		}
	}
	return walkNulls(doc.Content[0], "", defaults, 0)
}

// emptyIsDefault lists the settings with a default that is not empty
// whose empty value the proxy reads as that default ("" is json, memory,
// stdout).
var emptyIsDefault = map[string]bool{
	"log_format": true, "store": true, "access_log.format": true, "access_log.path": true,
}

// walkNulls looks for a null under mapping n, whose keys are below
// prefix; depth bounds aliases that refer to their own ancestors.
func walkNulls(n *yaml.Node, prefix string, defaults map[string]string, depth int) error {
	if n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	if n.Kind != yaml.MappingNode || depth > 16 {
		return nil
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		key, val := n.Content[i], n.Content[i+1]
		if key.Value == "<<" { // a merge key: its mappings' keys are n's
			merged := []*yaml.Node{val}
			if val.Kind == yaml.SequenceNode {
				merged = val.Content
			}
			for _, m := range merged {
				if err := walkNulls(m, prefix, defaults, depth+1); err != nil {
					return err
				}
			}
			continue
		}
		path := prefix + key.Value
		if val.Kind == yaml.ScalarNode && val.ShortTag() == "!!null" {
			if def, ok := defaults[path]; ok {
				return fmt.Errorf("line %d: %s has no value, which would leave its default (%s); write %s: \"\" to empty it, or remove the line for the default",
					key.Line, path, def, key.Value)
			}
			continue
		}
		if err := nullEntry(val, path); err != nil {
			return err
		}
		if err := walkNulls(val, path+".", defaults, depth+1); err != nil {
			return err
		}
	}
	return nil
}

// nullEntry refuses an entry with no value (`- ` alone, `[~]`) in the
// list seq, the value of the key at path, which the decoder drops: a
// template's `- {{ .Values.domain }}` that rendered nothing left a
// domains list that let every domain through, without a word.
func nullEntry(seq *yaml.Node, path string) error {
	if seq.Kind == yaml.AliasNode && seq.Alias != nil {
		seq = seq.Alias
	}
	if seq.Kind != yaml.SequenceNode {
		return nil
	}
	for _, e := range seq.Content {
		if e.Kind == yaml.AliasNode && e.Alias != nil {
			e = e.Alias
		}
		if e.Kind == yaml.ScalarNode && e.ShortTag() == "!!null" {
			return fmt.Errorf("line %d: an entry of %s has no value (a template that rendered nothing?), which would be dropped from the list; write the entry, or remove it", e.Line, path)
		}
	}
	return nil
}
