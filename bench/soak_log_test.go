package main

import (
	"os"
	"path/filepath"
	"testing"
)

func TestCountLogLines(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "access.log")
	for name, body := range map[string]string{
		"access.log":   "a\nb\nc\n",
		"access.log.1": "d\ne\n",
		"access.log.2": "f\ng", // a line still being written is not counted
		"access.logx":  "not a rotated copy\n",
		"other.log":    "x\n",
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	n, err := countLogLines(path)
	if err != nil {
		t.Fatal(err)
	}
	if n != 6 {
		t.Errorf("countLogLines = %d, want 6", n)
	}
	if _, err := countLogLines(filepath.Join(dir, "absent.log")); err == nil {
		t.Error("countLogLines of a missing file: no error")
	}
}

func TestLogAgreement(t *testing.T) {
	for _, c := range []struct {
		name              string
		lines             int64
		requests, dropped float64
		want              string
	}{
		{"one line each", 100, 100, 0, ""},
		{"dropped lines counted", 90, 100, 10, ""},
		{"a line lost", 99, 100, 0, "access log has 99 lines (+0 dropped) for 100 requests counted"},
		{"a line too many", 101, 100, 0, "access log has 101 lines (+0 dropped) for 100 requests counted"},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := logAgreement(c.lines, c.requests, c.dropped); got != c.want {
				t.Errorf("logAgreement = %q, want %q", got, c.want)
			}
		})
	}
}
