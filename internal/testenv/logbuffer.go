package testenv

import (
	"bytes"
	"strings"
	"sync"
)

// LogBuffer collects a log written from many goroutines (a process log,
// an access log) for a test to read while the writers go on.
type LogBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

// Write appends p.
func (b *LogBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String returns everything written so far.
func (b *LogBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// CountLines counts the lines of log that hold every one of parts.
func CountLines(log string, parts ...string) int {
	n := 0
	for l := range strings.SplitSeq(log, "\n") {
		all := l != ""
		for _, p := range parts {
			all = all && strings.Contains(l, p)
		}
		if all {
			n++
		}
	}
	return n
}
