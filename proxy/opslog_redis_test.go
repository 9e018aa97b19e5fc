package proxy

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// logLines returns the JSON process-log lines whose msg is msg.
func logLines(t *testing.T, logs, msg string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for l := range strings.Lines(logs) {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("process log line is no JSON: %v: %q", err, l)
		}
		if m["msg"] == msg {
			out = append(out, m)
		}
	}
	return out
}

// While Redis is down every uncached lookup fails, and the line that says
// so is limited to one a second; the next line counts those held back
// (suppressed), as go-redis's and certmagic's own lines do. Without the
// count a line a second looked the same for one failed request a second
// as for ten thousand.
func TestStoreOutageLogCountsSuppressed(t *testing.T) {
	h, r, logs := redisLogHarness(t)
	r.Stop() // a real refused connection
	get := func(i int) {
		t.Helper()
		if st, body, _ := h.get(itoa(uint16(8000+i))+"-sbxdown.cube.test", "/"); st != 503 || !strings.Contains(body, CodeStoreUnavailable) {
			t.Fatalf("request %d with Redis down: %d %s, want 503 %s", i, st, body, CodeStoreUnavailable)
		}
	}
	const n = 20
	for i := range n {
		get(i)
	}
	// One more once a second has passed since the last line let through:
	// its line carries the count of all held back since. Timed from that
	// line, not from the first request: under -race on loaded cores the n
	// requests took over a second, a line among them began the second
	// anew, and the final request's lookup was held back with the two
	// before it, in no line.
	lines := logLines(t, logs.String(), "route store unavailable")
	if len(lines) == 0 {
		t.Fatalf("%d failed lookups logged no line:\n%s", n, logs.String())
	}
	last, err := time.Parse(time.RFC3339Nano, lines[len(lines)-1]["time"].(string))
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Until(last.Add(1100 * time.Millisecond)))
	get(n)
	lines = logLines(t, logs.String(), "route store unavailable")
	total, counted := 0, false
	for _, l := range lines {
		total++
		if s, ok := l["suppressed"].(float64); ok {
			total += int(s)
			counted = true
		}
	}
	if len(lines) < 2 || !counted || total != n+1 {
		t.Errorf("%d failed lookups logged %d lines accounting for %d (counted: %v), want at least 2 lines, one with suppressed, accounting for all:\n%s",
			n+1, len(lines), total, counted, logs.String())
	}
}
