package config

import (
	"bytes"
	"flag"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// printUsage writes fs's -h text in the flag package's layout, naming
// each flag's kind (a flag.Func would show "value") and its default (the
// flag package shows none for a flag.Func, whose DefValue it cannot
// compare with a zero value of the right kind). A flag whose default is
// empty or zero shows none, as the flag package does: its usage says what
// unset means.
func printUsage(fs *flag.FlagSet, kinds map[string]string) {
	w := fs.Output()
	fmt.Fprintf(w, "Usage of %s:\n", fs.Name())
	fs.VisitAll(func(f *flag.Flag) {
		var b strings.Builder
		fmt.Fprintf(&b, "  -%s %s\n    \t", f.Name, kinds[f.Name])
		b.WriteString(strings.ReplaceAll(f.Usage, "\n", "\n    \t"))
		if f.DefValue != "" {
			fmt.Fprintf(&b, " (default %s)", f.DefValue)
		}
		fmt.Fprintln(w, b.String())
	})
}

// kind names what the setting's flag takes, for -h.
func (s *setting) kind() string {
	switch v := s.v; {
	case v.Type() == durationType:
		return "duration"
	case v.Kind() == reflect.Bool:
		return "bool"
	case v.Kind() == reflect.String:
		return "string"
	case v.Kind() == reflect.Int, v.Kind() == reflect.Int64:
		return "int"
	case v.Kind() == reflect.Float64:
		return "float"
	case v.Kind() == reflect.Slice && v.Type().Elem().Kind() == reflect.Int:
		return "int-list"
	case v.Kind() == reflect.Slice:
		return "list"
	}
	return "value" // supported lists every kind above
}

// show formats the setting's value as -h shows a default, in the syntax
// its flag takes; "" for the zero value or an empty list.
func (s *setting) show() string {
	v := s.v
	if v.IsZero() || v.Kind() == reflect.Slice && v.Len() == 0 {
		return ""
	}
	switch {
	case v.Type() == durationType:
		return showDuration(time.Duration(v.Int()))
	case v.Kind() == reflect.String:
		return strconv.Quote(v.String())
	case v.Kind() == reflect.Float64:
		return strconv.FormatFloat(v.Float(), 'g', -1, 64)
	case v.Kind() == reflect.Slice:
		parts := make([]string, v.Len())
		for i := range parts {
			parts[i] = fmt.Sprint(v.Index(i).Interface())
		}
		return strconv.Quote(strings.Join(parts, ","))
	}
	return fmt.Sprint(v.Interface())
}

// showDuration writes whole seconds as seconds ("7206s", as the README and
// the example configs do, where Duration.String says "2h0m6s"); anything
// else as Duration.String. Both parse back with time.ParseDuration.
func showDuration(d time.Duration) string {
	if d%time.Second == 0 {
		return strconv.FormatInt(int64(d/time.Second), 10) + "s"
	}
	return d.String()
}

// YAML writes c as a config file that loads back to the same settings,
// with durations as -h shows them (whole seconds as "7206s", not
// "2h0m6s"), so that cubeproxy check's output reads like the README and
// the example configs.
func (c *Config) YAML() ([]byte, error) { return c.NotedYAML(nil) }

// NotedYAML is YAML with a comment ending the line of each setting notes
// names by its key ("telemetry.trace_sample_ratio"): cubeproxy check says
// there that a setting does not apply, and the output still loads back to
// the same settings. A key that names no setting is an error.
func (c *Config) NotedYAML(notes map[string]string) ([]byte, error) {
	var root yaml.Node
	if err := root.Encode(c); err != nil {
		return nil, err
	}
	for key, note := range notes {
		n := lookupNode(&root, strings.Split(key, "."))
		if n == nil || n.Kind != yaml.ScalarNode {
			return nil, fmt.Errorf("note on %s: no such setting", key)
		}
		n.LineComment = note
	}
	for _, s := range collect(reflect.ValueOf(c).Elem()) {
		if s.v.Type() != durationType {
			continue
		}
		if n := lookupNode(&root, s.path); n != nil {
			n.Value = showDuration(time.Duration(s.v.Int()))
		}
	}
	var b bytes.Buffer
	enc := yaml.NewEncoder(&b)
	enc.SetIndent(2) // as the example configs
	if err := enc.Encode(&root); err != nil {
		return nil, err
	}
	if err := enc.Close(); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// lookupNode finds the value at path in a mapping node; nil when absent.
func lookupNode(n *yaml.Node, path []string) *yaml.Node {
	for _, key := range path {
		if n.Kind != yaml.MappingNode {
			return nil
		}
		var next *yaml.Node
		for i := 0; i+1 < len(n.Content); i += 2 {
			if n.Content[i].Value == key {
				next = n.Content[i+1]
				break
			}
		}
		if next == nil {
			return nil
		}
		n = next
	}
	return n
}
