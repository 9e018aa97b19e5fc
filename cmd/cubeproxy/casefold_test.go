package main

import (
	"strings"
	"testing"
)

// serve's and check's words take any case, as log_level did: a file that
// writes log_format: JSON or store: Memory (a Helm value, an operator who
// capitalises) is checked ok, and check prints the words as the proxy
// reads them.
func TestCheckTakesWordsInAnyCase(t *testing.T) {
	dir := t.TempDir()
	routes := writeTemp(t, dir, "routes.yaml", "routes: {}\n")
	cfg := writeTemp(t, dir, "cubeproxy.yaml", "http_addr: 127.0.0.1:0\nadmin_addr: 127.0.0.1:0\nhttps_addr: 127.0.0.1:0\n"+
		"log_format: JSON\nlog_level: Debug\nstore: Memory\nroutes: "+routes+"\naccess_log:\n  format: CUBE\ntls:\n  source: Self_Signed\n")
	code, stdout, stderr := runCheck(t, func(k string) string {
		if k == "CUBEPROXY_LOG_FORMAT" {
			return "Text"
		}
		return ""
	}, "--config", cfg)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	for _, w := range []string{"\nlog_format: text\n", "\nlog_level: debug\n", "\nstore: memory\n", "\n  format: cube\n", "\n  source: self_signed\n"} {
		if !strings.Contains(stdout, w) {
			t.Errorf("check printed no %q:\n%s", strings.TrimSpace(w), stdout)
		}
	}
	// Anything else is still refused, as written, with the words.
	code, _, stderr = runCheck(t, noEnv, "--config", cfg, "--log-format=XML")
	if code != 1 || !strings.Contains(stderr, `log_format "XML": want json or text`) {
		t.Errorf("log_format XML: exit %d, %s", code, stderr)
	}
}

// An empty word (a flag given as --log-format=, log_format: "" in the
// file) is what serve reads it as, and check prints that word: it printed
// log_format: "" for the JSON serve writes, store: "" for the memory store,
// and access_log.path: "" for stdout ('-').
func TestCheckPrintsWhatAnEmptyWordMeans(t *testing.T) {
	dir := t.TempDir()
	routes := writeTemp(t, dir, "routes.yaml", "routes: {}\n")
	cfg := writeTemp(t, dir, "cubeproxy.yaml", "http_addr: 127.0.0.1:0\nadmin_addr: 127.0.0.1:0\nroutes: "+routes+
		"\nlog_format: \"\"\n")
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"file", []string{"--config", cfg, "--store=", "--access-log-format=", "--access-log-path="}},
		{"flags", []string{"--config", cfg, "--log-format=", "--store=", "--access-log-format=", "--access-log-path="}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, stdout, stderr := runCheck(t, noEnv, tc.args...)
			if code != 0 {
				t.Fatalf("exit %d: %s", code, stderr)
			}
			for _, w := range []string{"\nlog_format: json\n", "\nstore: memory\n", "\n  format: json\n", "\n  path: '-'\n"} {
				if !strings.Contains(stdout, w) {
					t.Errorf("check printed no %q:\n%s", strings.TrimSpace(w), stdout)
				}
			}
		})
	}
}
