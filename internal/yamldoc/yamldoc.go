// Package yamldoc checks that a YAML file holds a single document.
package yamldoc

import (
	"errors"
	"io"

	"go.yaml.in/yaml/v3"
)

// NextDocument reads what dec holds after the document it decoded and
// returns the line of another document with something in it, or 0. A
// Decoder reads one document at a time, so settings or routes after a
// "---" would be ignored without a word; empty documents are harmless.
func NextDocument(dec *yaml.Decoder) (line int, err error) {
	for {
		var next yaml.Node
		err := dec.Decode(&next)
		if errors.Is(err, io.EOF) {
			return 0, nil
		}
		if err != nil {
			return 0, err
		}
		if n := next.Content; len(n) > 0 && n[0].ShortTag() != "!!null" {
			return n[0].Line, nil
		}
	}
}
