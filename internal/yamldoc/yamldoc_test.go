package yamldoc

import (
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

func TestNextDocument(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		line     int
		err      bool
	}{
		{"one document", "a: 1\n", 0, false},
		{"marker before the only one", "---\na: 1\n", 0, false},
		{"empty documents after it", "a: 1\n---\n---\n# nothing\n", 0, false},
		{"a null document after it", "a: 1\n---\n~\n", 0, false},
		{"a second document", "a: 1\n---\nb: 2\n", 3, false},
		{"after an empty one", "a: 1\n---\n---\nb: 2\n", 4, false},
		{"a plain word as the second document", "a: 1\n---\nroutes\n", 3, false},
		{"a broken second document", "a: 1\n---\nb: [\n", 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dec := yaml.NewDecoder(strings.NewReader(tc.in))
			var first yaml.Node
			if err := dec.Decode(&first); err != nil {
				t.Fatal(err)
			}
			line, err := NextDocument(dec)
			if line != tc.line || (err != nil) != tc.err {
				t.Errorf("NextDocument = %d, %v; want line %d, error %v", line, err, tc.line, tc.err)
			}
		})
	}
}
