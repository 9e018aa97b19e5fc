package accesslog

import (
	"bytes"
	"encoding/json"
	"os"
	"regexp"
	"strings"
	"testing"
)

// Every key of the JSON line is named in README's access-log paragraph
// (the one that lists the formats): the line's readers (the platform's
// pipelines, an operator's jq) learn its fields there, and a key added
// without a word there (upstream_retries, upstream_retry_code) would pass
// every other test.
func TestReadmeNamesEveryJSONKey(t *testing.T) {
	raw, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	readme := string(raw)
	start := strings.Index(readme, "Formats (`access_log.format`)")
	end := strings.Index(readme[max(start, 0):], "To stdout")
	if start < 0 || end < 0 {
		t.Fatal("README: the access-log formats paragraph (\"Formats (`access_log.format`)\" … \"To stdout\") moved")
	}
	section := readme[start : start+end]
	dec := json.NewDecoder(bytes.NewReader(appendJSON(nil, fullEntry(), testTime, newStamps(jsonTime))))
	if _, err := dec.Token(); err != nil { // {
		t.Fatal(err)
	}
	for n := 0; dec.More(); n++ {
		tok, err := dec.Token()
		if err != nil {
			t.Fatal(err)
		}
		if n%2 == 1 {
			continue // a value
		}
		key := tok.(string)
		if !regexp.MustCompile(`\b` + regexp.QuoteMeta(key) + `\b`).MatchString(section) {
			t.Errorf("README's access-log paragraph does not name the JSON key %q", key)
		}
	}
}
